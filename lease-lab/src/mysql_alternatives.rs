//! Seed 002's MySQL alternatives as lease backends, so the same scenarios run on them:
//!
//! - [`SessionLock::GetLock`]: MySQL's named lock, `GET_LOCK(name, 0)`, held by the
//!   connection that took it until `RELEASE_LOCK` or until that connection closes;
//! - [`SessionLock::SkipLocked`]: a row lock, `SELECT ... FOR UPDATE SKIP LOCKED` in a
//!   transaction left open, held until the transaction ends or its connection closes;
//!   others skip the row instead of waiting for it.
//!
//! Both are session locks: no TTL, no fencing token, and a holder that is alive but stuck
//! keeps them for ever; a holder that dies frees them as soon as its connection closes.
//! (ShedLock's fixed-TTL table is the library's own MySQL backend with the watchdog off.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
};
use leasehold::mysql::sqlx::{self, Connection, MySqlConnection};
use tokio::sync::Mutex;

/// Which session lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionLock {
    /// `GET_LOCK(name, 0)`.
    GetLock,
    /// `SELECT ... FOR UPDATE SKIP LOCKED` on a row per name.
    SkipLocked,
}

/// A session-lock backend on MySQL/MariaDB (see the module docs).
#[derive(Debug)]
pub struct SessionLockBackend {
    kind: SessionLock,
    url: String,
    held: Mutex<HashMap<Vec<u8>, (OwnerToken, MySqlConnection)>>,
}

const BACKEND: &str = "mysql-session-lock";

fn unavailable(e: sqlx::Error) -> Error {
    Error::unavailable(BACKEND, e)
}

impl SessionLockBackend {
    /// A backend of `kind` on the database at `url` (for `SkipLocked`, the table
    /// `skip_locks` is created if missing).
    pub async fn connect(kind: SessionLock, url: &str) -> Result<Self> {
        if kind == SessionLock::SkipLocked {
            let mut c = MySqlConnection::connect(url).await.map_err(unavailable)?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS skip_locks (name VARBINARY(255) PRIMARY KEY) ENGINE=InnoDB",
            )
            .execute(&mut c)
            .await
            .map_err(unavailable)?;
        }
        Ok(SessionLockBackend {
            kind,
            url: url.to_owned(),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Closes every held lock's connection without releasing anything: what a holder
    /// process's death does (its TCP connections close). The server frees the locks.
    pub async fn drop_connections(&self) {
        self.held.lock().await.clear();
    }

    fn key(name: &LeaseName) -> Result<String> {
        let text = std::str::from_utf8(name.as_bytes())
            .ok()
            .filter(|t| t.len() <= 64)
            .ok_or_else(|| {
                Error::from(InvalidInput::Other(
                    "GET_LOCK names are at most 64 characters of text".into(),
                ))
            })?;
        Ok(text.to_owned())
    }

    /// Takes the lock on a new connection; `Some(conn)` if taken.
    async fn take(&self, name: &LeaseName) -> Result<Option<MySqlConnection>> {
        let key = Self::key(name)?;
        let mut c = MySqlConnection::connect(&self.url)
            .await
            .map_err(unavailable)?;
        let got = match self.kind {
            SessionLock::GetLock => {
                let (got,): (Option<i64>,) = sqlx::query_as("SELECT GET_LOCK(?, 0)")
                    .bind(&key)
                    .fetch_one(&mut c)
                    .await
                    .map_err(unavailable)?;
                got == Some(1)
            }
            SessionLock::SkipLocked => {
                // The row must exist; a plain read does not wait for a holder's row lock
                // (an INSERT IGNORE of an existing, locked row would).
                let exists: Option<(i64,)> =
                    sqlx::query_as("SELECT 1 FROM skip_locks WHERE name = ?")
                        .bind(key.as_bytes())
                        .fetch_optional(&mut c)
                        .await
                        .map_err(unavailable)?;
                if exists.is_none() {
                    sqlx::query("INSERT IGNORE INTO skip_locks (name) VALUES (?)")
                        .bind(key.as_bytes())
                        .execute(&mut c)
                        .await
                        .map_err(unavailable)?;
                }
                sqlx::query("BEGIN")
                    .execute(&mut c)
                    .await
                    .map_err(unavailable)?;
                let row: Option<(Vec<u8>,)> = sqlx::query_as(
                    "SELECT name FROM skip_locks WHERE name = ? FOR UPDATE SKIP LOCKED",
                )
                .bind(key.as_bytes())
                .fetch_optional(&mut c)
                .await
                .map_err(unavailable)?;
                row.is_some()
            }
        };
        Ok(got.then_some(c))
    }
}

#[lease_core::async_trait]
impl LeaseBackend for SessionLockBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .with_fencing(Fencing::None)
            .with_expires(false)
            // Freed the moment the holder's connection closes, and nothing tells the
            // holder first (renew answers from this process's map): no lead time.
            .with_lost_before_taken(false)
            .with_holder_info(false)
            .with_keep_for(false)
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        match self.take(name).await? {
            Some(conn) => {
                self.held
                    .lock()
                    .await
                    .insert(name.as_bytes().to_vec(), (owner.token, conn));
                Ok(AcquireOutcome::Acquired {
                    fencing: FencingToken(0),
                    ttl,
                })
            }
            None => Ok(AcquireOutcome::Held(HeldBy::default())),
        }
    }

    async fn renew(&self, leases: &[RenewItem], _ttl: Duration) -> Result<Vec<RenewOutcome>> {
        let held = self.held.lock().await;
        Ok(leases
            .iter()
            .map(|item| match held.get(item.name.as_bytes()) {
                Some((token, _)) if *token == item.token => RenewOutcome::Renewed,
                _ => RenewOutcome::Lost,
            })
            .collect())
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        _keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let mut held = self.held.lock().await;
        let mine = held.get(name.as_bytes()).is_some_and(|(t, _)| t == token);
        if !mine {
            return Ok(ReleaseOutcome::NotOwner);
        }
        if let Some((_, mut conn)) = held.remove(name.as_bytes()) {
            let sql = match self.kind {
                SessionLock::GetLock => "DO RELEASE_LOCK(?)",
                SessionLock::SkipLocked => "ROLLBACK",
            };
            let q = sqlx::query(sql);
            let q = if self.kind == SessionLock::GetLock {
                q.bind(Self::key(name)?)
            } else {
                q
            };
            q.execute(&mut conn).await.map_err(unavailable)?;
        }
        Ok(ReleaseOutcome::Released)
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        // Whether someone holds it: try to take it and give it back at once.
        match self.take(name).await? {
            Some(conn) => {
                drop(conn);
                Ok(None)
            }
            None => Ok(Some(LeaseInfo {
                holder: None,
                fencing: None,
                remaining: None,
            })),
        }
    }
}

/// A holder takes the lock and dies (its connection closes, as when its process is
/// killed): how long until another instance gets the lock.
pub async fn freed_when_the_holder_dies(kind: SessionLock, url: &str) -> Duration {
    let holder = Arc::new(
        SessionLockBackend::connect(kind, url)
            .await
            .expect("connect"),
    );
    let other = SessionLockBackend::connect(kind, url)
        .await
        .expect("connect");
    let name = LeaseName::new(format!("dies-{}", uuid::Uuid::new_v4().simple())).expect("name");
    let label = lease_core::HolderLabel::new("holder").expect("label");
    let ttl = Duration::from_secs(1);
    match holder
        .acquire(&name, &Owner::new(label.clone()), ttl)
        .await
        .expect("acquire")
    {
        AcquireOutcome::Acquired { .. } => {}
        AcquireOutcome::Held(by) => panic!("held by {by}"),
    }
    let o = Owner::new(label);
    assert!(matches!(
        other.acquire(&name, &o, ttl).await.expect("acquire"),
        AcquireOutcome::Held(_)
    ));
    let died = tokio::time::Instant::now();
    holder.drop_connections().await;
    loop {
        if let AcquireOutcome::Acquired { .. } =
            other.acquire(&name, &o, ttl).await.expect("acquire")
        {
            let _ = other.release(&name, &o.token, Duration::ZERO).await;
            return died.elapsed();
        }
        assert!(
            died.elapsed() < Duration::from_secs(10),
            "{kind:?}: still held 10 s after its holder's connection closed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
