//! Postgres-specific properties beyond the conformance suite: database time inside old
//! transactions, concurrent schema creation, round trips per primitive, fencing across
//! server restarts, error mapping, the advisory-lock mode's stuck holder, and batch renewal
//! with stale planner statistics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failures are assertions

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    AcquireOutcome, Error, FencingToken, HolderLabel, InvalidInput, LeaseBackend, LeaseName, Owner,
    ReleaseOutcome, RenewItem, RenewOutcome,
};
use lease_postgres::sqlx::{self, Connection, postgres::PgConnection};
use lease_postgres::{AdvisoryLockBackend, PostgresBackend, PostgresConfig};
use lease_test_servers::postgres::PostgresServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).expect("label"))
}

fn name(s: &str) -> LeaseName {
    LeaseName::new(format!("{s}-{}", uuid::Uuid::new_v4().simple())).expect("name")
}

fn table() -> String {
    format!("lease_{}", uuid::Uuid::new_v4().simple())
}

fn config(table: &str) -> PostgresConfig {
    PostgresConfig::default().with_table(table.to_owned())
}

async fn backend(url: &str) -> PostgresBackend {
    PostgresBackend::connect_with(url, config(&table()))
        .await
        .expect("connect")
}

fn acquired(outcome: AcquireOutcome) -> FencingToken {
    match outcome {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        AcquireOutcome::Held(by) => panic!("unexpectedly held by {by}"),
    }
}

/// Releases `name` held by `owner` and expects it released.
async fn release_ours(b: &dyn LeaseBackend, name: &LeaseName, owner: &Owner) {
    assert_eq!(
        b.release(name, &owner.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
}

/// The ShedLock pitfall: the lock statement runs inside a transaction that began long
/// before. With `now()` (transaction start) the new lease would already be expired when
/// the transaction commits, and an expired lease would still look held. With
/// `clock_timestamp()` both are decided at the statement's real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_in_old_transaction_uses_statement_time() {
    let db = PostgresServer::shared().await.expect("server");
    let b = backend(&db.url()).await;

    // 1. The lease's expiry counts from the statement, not from BEGIN.
    let n = name("old-tx");
    let mut conn = PgConnection::connect(&db.url()).await.expect("connect");
    sqlx::raw_sql("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    sqlx::raw_sql("SELECT pg_sleep(1.0)")
        .execute(&mut conn)
        .await
        .expect("sleep");
    let a = owner("in-old-tx");
    acquired(
        b.acquire_on(&mut conn, &n, &a, Duration::from_millis(700))
            .await
            .expect("acquire"),
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut conn)
        .await
        .expect("commit");
    let info = b.inspect(&n).await.expect("inspect").expect(
        "the lease taken in an old transaction is already expired: its expiry was computed \
         from the transaction's start",
    );
    assert!(info.remaining.expect("remaining") > Duration::from_millis(300));
    let other = owner("other");
    assert!(matches!(
        b.acquire(&n, &other, Duration::from_secs(1))
            .await
            .expect("acquire"),
        AcquireOutcome::Held(_)
    ));

    // 2. Whether the current lease has expired is decided at the statement's time too.
    let n2 = name("old-tx-expired");
    let mut conn = PgConnection::connect(&db.url()).await.expect("connect");
    sqlx::raw_sql("BEGIN; SELECT 1")
        .execute(&mut conn)
        .await
        .expect("begin");
    let first = owner("first");
    let f1 = acquired(
        b.acquire(&n2, &first, Duration::from_millis(300))
            .await
            .expect("acquire"),
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = owner("second");
    let f2 = acquired(
        b.acquire_on(&mut conn, &n2, &second, Duration::from_secs(10))
            .await
            .expect("acquire in the old transaction must see the expired lease as free"),
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut conn)
        .await
        .expect("commit");
    assert!(f2 > f1);
}

/// The acquire statement writes a live row back unchanged: a held attempt, by another
/// owner or by the holder's own token (also inside an open transaction), reports the
/// holder and leaves owner, fencing token and expiry as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_acquire_changes_nothing() {
    let db = PostgresServer::shared().await.expect("server");
    let t = table();
    let b = PostgresBackend::connect_with(&db.url(), config(&t))
        .await
        .expect("connect");
    let n = name("held");
    let (a, other) = (owner("holder-a"), owner("other"));
    let f1 = acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    let row = |conn: &'static str| {
        let (pool, t, n) = (b.pool().clone(), t.clone(), n.clone());
        async move {
            let r: (uuid::Uuid, i64, String, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT owner_token, fencing, locked_at::text, lock_until::text FROM {t} WHERE name = $1"
            )))
            .bind(n.as_bytes())
            .fetch_one(&pool)
            .await
            .expect(conn);
            r
        }
    };
    let before = row("row before").await;
    for (who, what) in [(&other, "another owner"), (&a, "the holder's own token")] {
        match b
            .acquire(&n, who, Duration::from_secs(60))
            .await
            .expect("acquire")
        {
            AcquireOutcome::Held(by) => {
                assert_eq!(by.holder.as_deref(), Some("holder-a"), "{what}");
                let r = by.remaining.expect("remaining");
                assert!(r <= Duration::from_secs(30), "{what}: {r:?}");
            }
            AcquireOutcome::Acquired { .. } => panic!("{what} took a live lease"),
        }
    }
    let mut conn = PgConnection::connect(&db.url()).await.expect("connect");
    sqlx::raw_sql("BEGIN; SELECT 1")
        .execute(&mut conn)
        .await
        .expect("begin");
    assert!(matches!(
        b.acquire_on(&mut conn, &n, &a, Duration::from_secs(60))
            .await
            .expect("acquire in a transaction"),
        AcquireOutcome::Held(_)
    ));
    sqlx::raw_sql("COMMIT")
        .execute(&mut conn)
        .await
        .expect("commit");
    assert_eq!(row("row after").await, before);
    assert_eq!(before.1, i64::try_from(f1.0).expect("token"));
    assert_eq!(
        b.release(&n.clone(), &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    let f2 = acquired(
        b.acquire(&n, &other, Duration::from_secs(30))
            .await
            .expect("acquire after release"),
    );
    assert_eq!(f2.0, f1.0 + 1);
}

/// An attempt on a live lease is a read: it does not wait for the row's lock (held here
/// by an open transaction, as a contender's upsert held it until its commit was flushed)
/// and writes no new version of the row. Before, every attempt locked the row and wrote it
/// back unchanged, so attempts queued on the lock one commit (with default durability,
/// one WAL flush) after another and the holder's renewal waited behind them: the lab's
/// 1,000-contender scenario lost its 100 ms lease in 2 of 8 runs on a server with fsync
/// on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_attempt_neither_waits_for_nor_writes_the_row() {
    let db = PostgresServer::shared().await.expect("server");
    let t = table();
    let b = PostgresBackend::connect_with(&db.url(), config(&t))
        .await
        .expect("connect");
    let n = name("held-read");
    let (a, other) = (owner("holder-a"), owner("other"));
    acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    let version = || {
        let (pool, t, n) = (b.pool().clone(), t.clone(), n.clone());
        async move {
            let v: (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT xmin::text FROM {t} WHERE name = $1"
            )))
            .bind(n.as_bytes())
            .fetch_one(&pool)
            .await
            .expect("row version");
            v.0
        }
    };
    let before = version().await;
    let mut locker = PgConnection::connect(&db.url()).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT 1 FROM {t} FOR UPDATE"
    )))
    .execute(&mut locker)
    .await
    .expect("lock the row");
    // Far below the backend's request timeout (5 s), far above a read's round trip.
    let held = tokio::time::timeout(
        Duration::from_secs(2),
        b.acquire(&n, &other, Duration::from_secs(30)),
    )
    .await
    .expect("an attempt on a held lease waited for the row's lock")
    .expect("acquire");
    match held {
        AcquireOutcome::Held(by) => assert_eq!(by.holder.as_deref(), Some("holder-a")),
        AcquireOutcome::Acquired { .. } => panic!("took a live lease"),
    }
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut locker)
        .await
        .expect("rollback");
    for _ in 0..20 {
        assert!(matches!(
            b.acquire(&n, &other, Duration::from_secs(30))
                .await
                .expect("acquire"),
            AcquireOutcome::Held(_)
        ));
    }
    assert_eq!(version().await, before, "a held attempt wrote the row");
    release_ours(&b, &n, &a).await;
}

/// Ten instances starting at the same moment on a fresh table all come up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_start_creates_the_table_once() {
    let db = PostgresServer::shared().await.expect("server");
    for t in [
        table(),
        format!("s_{}.locks", uuid::Uuid::new_v4().simple()),
    ] {
        let starts: Vec<_> = (0..10)
            .map(|_| {
                let url = db.url();
                let t = t.clone();
                tokio::spawn(async move { PostgresBackend::connect_with(&url, config(&t)).await })
            })
            .collect();
        let mut backends = Vec::new();
        for s in starts {
            backends.push(s.await.expect("task").expect("concurrent start failed"));
        }
        let n = name("after-start");
        let a = owner("a");
        let f = acquired(
            backends[3]
                .acquire(&n, &a, Duration::from_secs(5))
                .await
                .expect("acquire"),
        );
        assert_eq!(f, FencingToken(1));
        let info = backends[7]
            .inspect(&n)
            .await
            .expect("inspect")
            .expect("held");
        assert_eq!(info.holder.as_deref(), Some("a"));
    }
}

/// Counts the frontend messages (by type byte) passing through a TCP proxy in front of
/// the server: `E` (Execute) runs one statement, `P` (Parse) prepares one, `Q` is a simple
/// query. A Sync (`S`) ends one extended-protocol round trip; the proxy counts it as `W`
/// when messages came before it (a round trip doing work) and as `p` when it came alone
/// (sqlx's liveness ping when a connection goes back to its pool, sent after the caller
/// has its answer).
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<HashMap<u8, usize>>>);

impl Counts {
    fn take(&self) -> HashMap<u8, usize> {
        std::mem::take(&mut *self.0.lock().expect("lock"))
    }
    fn add(&self, kind: u8) {
        *self.0.lock().expect("lock").entry(kind).or_default() += 1;
    }
}

async fn proxy(upstream_port: u16) -> (u16, Counts) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let counts = Counts::default();
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(("127.0.0.1", upstream_port))
                .await
                .expect("upstream");
            // No Nagle delays: the proxy forwards message by message.
            client.set_nodelay(true).expect("nodelay");
            server.set_nodelay(true).expect("nodelay");
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
            });
            let c = c.clone();
            tokio::spawn(async move {
                // Startup message: no type byte.
                let mut len = [0u8; 4];
                if cr.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
                if cr.read_exact(&mut body).await.is_err() {
                    return;
                }
                let mut startup = len.to_vec();
                startup.extend_from_slice(&body);
                sw.write_all(&startup).await.expect("write");
                let mut pending = false;
                loop {
                    let mut header = [0u8; 5];
                    if cr.read_exact(&mut header).await.is_err() {
                        return;
                    }
                    let n = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
                    let mut body = vec![0u8; n as usize - 4];
                    if cr.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    c.add(header[0]);
                    if header[0] == b'S' {
                        c.add(if pending { b'W' } else { b'p' });
                        pending = false;
                    } else {
                        pending = true;
                    }
                    let mut message = header.to_vec();
                    message.extend_from_slice(&body);
                    if sw.write_all(&message).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, counts)
}

fn assert_one_round_trip(what: &str, counts: &HashMap<u8, usize>) {
    let get = |k: u8| counts.get(&k).copied().unwrap_or(0);
    assert_eq!(get(b'W'), 1, "{what}: round trips {counts:?}");
    assert_eq!(get(b'E'), 1, "{what}: statements (Execute) {counts:?}");
    assert_eq!(get(b'Q'), 0, "{what}: simple queries {counts:?}");
    assert_eq!(get(b'P'), 0, "{what}: statement not cached {counts:?}");
}

/// Every primitive is one statement in one round trip (once sqlx has prepared it on the
/// connection), and renewing 10,000 leases (the largest batch) is one statement too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_primitive() {
    let server = PostgresServer::shared().await.expect("server");
    let upstream = server
        .port()
        .expect("a local shared server (this test needs its port)");
    let database = server.name().expect("database").to_owned();
    let (port, counts) = proxy(upstream).await;
    let proxied = format!("postgres://postgres@127.0.0.1:{port}/{database}?sslmode=disable");
    let b = PostgresBackend::connect_with(&proxied, config(&table()).with_max_connections(1))
        .await
        .expect("connect");

    // Warm up: let sqlx prepare each statement on the single connection.
    let warm = name("warm");
    let a = owner("a");
    let ttl = Duration::from_secs(30);
    acquired(b.acquire(&warm, &a, ttl).await.expect("acquire"));
    b.acquire(&warm, &owner("b"), ttl).await.expect("acquire");
    b.renew(
        &[RenewItem {
            name: warm.clone(),
            token: a.token,
        }],
        ttl,
    )
    .await
    .expect("renew");
    b.inspect(&warm).await.expect("inspect");
    b.release(&warm, &a.token, Duration::ZERO)
        .await
        .expect("release");
    counts.take();

    let n = name("counted");
    acquired(b.acquire(&n, &a, ttl).await.expect("acquire"));
    assert_one_round_trip("acquire", &counts.take());
    let held = b.acquire(&n, &owner("b"), ttl).await.expect("acquire");
    match held {
        AcquireOutcome::Held(by) => assert_eq!(by.holder.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
    assert_one_round_trip("acquire (held, with holder)", &counts.take());
    b.inspect(&n).await.expect("inspect");
    assert_one_round_trip("inspect", &counts.take());
    release_ours(&b, &n, &a).await;
    assert_one_round_trip("release", &counts.take());

    // The largest batch the heartbeat sends in one call (`max_renew_batch`, 10,000),
    // acquired beside the proxy over a pool of its own, 16 at a time.
    let max = b.capabilities().max_renew_batch;
    assert_eq!(max, 10_000);
    let names: Vec<LeaseName> = (0..max).map(|i| name(&format!("batch-{i}"))).collect();
    let direct = PostgresBackend::connect_with(&server.url(), config(b.table()))
        .await
        .expect("connect");
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in names.chunks(max / 16) {
        let (direct, chunk, a) = (direct.clone(), chunk.to_vec(), a.clone());
        tasks.spawn(async move {
            for n in &chunk {
                acquired(direct.acquire(n, &a, ttl).await.expect("acquire"));
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("acquiring task");
    }
    counts.take();
    let items: Vec<RenewItem> = names
        .iter()
        .map(|n| RenewItem {
            name: n.clone(),
            token: a.token,
        })
        .collect();
    let outcomes = b.renew(&items, ttl).await.expect("renew");
    assert!(outcomes.iter().all(|o| *o == RenewOutcome::Renewed));
    assert_eq!(outcomes.len(), max);
    assert_one_round_trip("renew of 10,000 leases", &counts.take());
}

/// Duplicates in a renewal batch each get their answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_answers_duplicates() {
    let db = PostgresServer::shared().await.expect("server");
    let b = backend(&db.url()).await;
    let n = name("dup");
    let a = owner("a");
    let stranger = owner("s");
    acquired(
        b.acquire(&n, &a, Duration::from_secs(10))
            .await
            .expect("acquire"),
    );
    let item = |t: &Owner| RenewItem {
        name: n.clone(),
        token: t.token,
    };
    let r = b
        .renew(
            &[item(&a), item(&stranger), item(&a), item(&stranger)],
            Duration::from_secs(10),
        )
        .await
        .expect("renew");
    use RenewOutcome::{Lost, Renewed};
    assert_eq!(r, vec![Renewed, Lost, Renewed, Lost]);
}

/// Fencing tokens keep growing across a graceful restart and a crash of the server
/// (fsync on: committed counters survive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_survives_server_restart() {
    let mut server = PostgresServer::start_local_process().await.expect("server");
    let b = backend(&server.url()).await;
    let n = name("restart");
    let ttl = Duration::from_secs(30);
    let mut last = FencingToken(0);
    for round in 0..3 {
        let o = owner("holder");
        // The pool's connections died with the server: the first call may fail with a
        // retryable error before a new connection is made.
        let started = Instant::now();
        let f = loop {
            match b.acquire(&n, &o, ttl).await {
                Ok(outcome) => break acquired(outcome),
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    assert!(started.elapsed() < Duration::from_secs(15), "{e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        assert!(f > last, "round {round}: token {f} after {last}");
        last = f;
        b.release(&n, &o.token, Duration::ZERO)
            .await
            .expect("release");
        match round {
            0 => server.stop().await.expect("stop"),
            1 => server.kill().expect("kill"),
            _ => break,
        }
        server.start_again().await.expect("start again");
    }
    // A fresh client sees the same sequence.
    let fresh = PostgresBackend::connect_with(&server.url(), config(b.table()))
        .await
        .expect("connect");
    let o = owner("fresh");
    assert!(acquired(fresh.acquire(&n, &o, ttl).await.expect("acquire")) > last);
}

/// Errors are typed: unreachable server, bad URL (password never shown), missing table,
/// statement timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed() {
    // Nothing listens on the port of a closed listener.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let started = Instant::now();
    let e = PostgresBackend::connect_with(
        &format!("postgres://u:hunter2@127.0.0.1:{port}/db"),
        PostgresConfig::default().with_request_timeout(Duration::from_secs(1)),
    )
    .await
    .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(e.is_retryable(), "{e:?}");
    assert!(
        matches!(e, Error::Unavailable { .. } | Error::Timeout { .. }),
        "{e:?}"
    );
    assert!(!format!("{e:?} {e}").contains("hunter2"));

    for url in [
        "postgres://u:hunter2@host:notaport/db",
        "redis://u:hunter2@host/0",
        "postgres://u:hunter2@[::1/db",
    ] {
        match PostgresBackend::connect(url).await {
            Err(Error::InvalidInput(InvalidInput::MalformedUrl(m))) => {
                assert!(!m.contains("hunter2"), "{m}");
            }
            other => panic!("{url}: expected MalformedUrl, got {other:?}"),
        }
    }
    for bad in ["Locks", "a.b.c", "x;drop", ""] {
        assert!(matches!(
            PostgresBackend::connect_with("postgres://h/db", config(bad)).await,
            Err(Error::InvalidInput(InvalidInput::Other(_)))
        ));
    }

    let db = PostgresServer::shared().await.expect("server");
    // Debug output of a backend never shows the password (trust authentication ignores it).
    let with_password = db.url().replace("postgres@", "postgres:hunter2@");
    let b = PostgresBackend::connect_with(&with_password, config(&table()))
        .await
        .expect("connect");
    assert!(!format!("{b:?}").contains("hunter2"));

    // Missing table, not created: rejected, not retryable.
    let missing =
        PostgresBackend::connect_with(&db.url(), config(&table()).with_create_table(false))
            .await
            .expect("connect");
    let e = missing
        .acquire(&name("x"), &owner("a"), Duration::from_secs(1))
        .await
        .expect_err("no table");
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
    assert!(!e.is_retryable());

    // A row locked by someone else's open transaction: the statement is bounded.
    let quick = PostgresBackend::connect_with(
        &db.url(),
        config(&table()).with_request_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect");
    let n = name("locked-row");
    let a = owner("a");
    acquired(
        quick
            .acquire(&n, &a, Duration::from_millis(50))
            .await
            .expect("acquire"),
    );
    let mut conn = PgConnection::connect(&db.url()).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT * FROM {} FOR UPDATE",
        quick.table()
    )))
    .execute(&mut conn)
    .await
    .expect("lock the row");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let e = quick
        .acquire(&n, &owner("b"), Duration::from_secs(1))
        .await
        .expect_err("the row is locked");
    assert!(
        matches!(
            e,
            Error::Timeout {
                operation: "acquire",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(1500));
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
}

/// keep-for: the lease stays taken until acquisition + keep-for, on the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_for_counts_from_acquisition() {
    let db = PostgresServer::shared().await.expect("server");
    let b = backend(&db.url()).await;
    let n = name("keep");
    let a = owner("a");
    acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        b.release(&n, &a.token, Duration::from_millis(1000))
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    let left = b
        .inspect(&n)
        .await
        .expect("inspect")
        .and_then(|i| i.remaining)
        .expect("kept");
    assert!(
        left <= Duration::from_millis(700) && left > Duration::from_millis(400),
        "{left:?}"
    );
}

/// A waiter learns about a release from the notification, long before its max wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_is_notified() {
    let db = PostgresServer::shared().await.expect("server");
    let b = backend(&db.url()).await;
    // Start the listener (the first call returns once it listens).
    b.wait_released(&name("prime"), Duration::from_secs(5))
        .await
        .expect("wait");
    let n = name("notified");
    let a = owner("a");
    acquired(
        b.acquire(&n, &a, Duration::from_secs(60))
            .await
            .expect("acquire"),
    );
    let waiter = {
        let b = b.clone();
        let n = n.clone();
        tokio::spawn(async move {
            b.wait_released(&n, Duration::from_secs(30))
                .await
                .expect("wait");
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter returned while the lease was held"
    );
    // A release with keep-for does not free it, so it does not wake the waiter.
    let released_at = Instant::now();
    b.release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
    let woke = waiter.await.expect("task");
    let took = woke.duration_since(released_at);
    assert!(
        took < Duration::from_secs(2),
        "waiter woke {took:?} after the release"
    );
}

/// The advisory mode's weakness, shown: a holder that is alive but stuck keeps the lock
/// however long others wait (there is no TTL); only ending its session frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_stuck_holder_keeps_lock_until_terminated() {
    let db = PostgresServer::shared().await.expect("server");
    let holder = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let contender = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let n = name("stuck");
    let a = owner("stuck-holder");
    let short = Duration::from_millis(100);
    assert_eq!(
        acquired(holder.acquire(&n, &a, short).await.expect("acquire")),
        FencingToken(0)
    );
    // Far beyond the requested TTL, the lock is still held; the holder never renews.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(matches!(
            contender
                .acquire(&n, &owner("b"), short)
                .await
                .expect("acquire"),
            AcquireOutcome::Held(_)
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(contender.inspect(&n).await.expect("inspect").is_some());
    let item = RenewItem {
        name: n.clone(),
        token: a.token,
    };
    assert_eq!(
        holder
            .renew(std::slice::from_ref(&item), short)
            .await
            .expect("renew"),
        vec![RenewOutcome::Renewed]
    );

    // An operator ends the holder's session.
    let pid = holder.holder_pid(&n, &a.token).expect("pid");
    let mut admin = PgConnection::connect(&db.url()).await.expect("connect");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(terminated);
    let b = owner("b");
    let started = Instant::now();
    loop {
        match contender.acquire(&n, &b, short).await.expect("acquire") {
            AcquireOutcome::Acquired { .. } => break,
            AcquireOutcome::Held(_) => {
                assert!(started.elapsed() < Duration::from_secs(5), "still held");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(
        holder.renew(&[item], short).await.expect("renew"),
        vec![RenewOutcome::Lost]
    );
    assert_eq!(
        holder
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner
    );
    assert_eq!(
        contender
            .release(&n, &b.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert!(contender.inspect(&n).await.expect("inspect").is_none());
}

/// Dropping an advisory backend ends its sessions and so frees its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_locks_freed_when_backend_dropped() {
    let db = PostgresServer::shared().await.expect("server");
    let holder = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let other = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let n = name("dropped");
    acquired(
        holder
            .acquire(&n, &owner("a"), Duration::from_secs(1))
            .await
            .expect("acquire"),
    );
    drop(holder);
    let started = Instant::now();
    let b = owner("b");
    while !matches!(
        other
            .acquire(&n, &b, Duration::from_secs(1))
            .await
            .expect("acquire"),
        AcquireOutcome::Acquired { .. }
    ) {
        assert!(started.elapsed() < Duration::from_secs(5), "still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An operator's force release frees a live lease (also one kept by keep-for), keeps the
/// fencing sequence, and the former holder's renewal is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_table_mode() {
    let db = PostgresServer::shared().await.expect("server");
    let b = backend(&db.url()).await;
    let n = name("force");
    assert!(!b.force_release(&n).await.expect("force"));
    let a = owner("a");
    let f1 = acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    assert!(b.force_release(&n).await.expect("force"));
    assert!(!b.force_release(&n).await.expect("force"), "already free");
    let item = RenewItem {
        name: n.clone(),
        token: a.token,
    };
    assert_eq!(
        b.renew(&[item], Duration::from_secs(30))
            .await
            .expect("renew"),
        vec![RenewOutcome::Lost]
    );
    let c = owner("c");
    let f2 = acquired(
        b.acquire(&n, &c, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    assert!(f2 > f1);
    b.release(&n, &c.token, Duration::from_secs(60))
        .await
        .expect("release");
    assert!(
        b.inspect(&n).await.expect("inspect").is_some(),
        "kept by keep-for"
    );
    assert!(b.force_release(&n).await.expect("force"));
    assert!(b.inspect(&n).await.expect("inspect").is_none());
}

/// The advisory mode's force release terminates the holder's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_advisory_mode() {
    let db = PostgresServer::shared().await.expect("server");
    let holder = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let operator = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let n = name("force-advisory");
    assert!(!operator.force_release(&n).await.expect("force"));
    let a = owner("a");
    acquired(
        holder
            .acquire(&n, &a, Duration::from_secs(1))
            .await
            .expect("acquire"),
    );
    assert!(operator.force_release(&n).await.expect("force"));
    // Freed when force_release returns.
    let b = owner("b");
    acquired(
        operator
            .acquire(&n, &b, Duration::from_secs(1))
            .await
            .expect("acquire"),
    );
    let item = RenewItem {
        name: n.clone(),
        token: a.token,
    };
    assert_eq!(
        holder
            .renew(&[item], Duration::from_secs(1))
            .await
            .expect("renew"),
        vec![RenewOutcome::Lost]
    );
}

/// Bursts of 32 concurrent holders (5 bursts one after the other, each task acquiring
/// and releasing its own lease 5 times) run on as many sessions as were held at once:
/// released connections are kept up to the recent peak. With a fixed 16 kept, every
/// burst after the first opened 16 new sessions (and closed 16 at its end): 96 sessions
/// for this load, and a 32-task benchmark round spent most of its time connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_bursts_reuse_as_many_sessions_as_they_hold() {
    let db = PostgresServer::shared().await.expect("server");
    let b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let (tasks, bursts, cycles) = (32usize, 5usize, 5usize);
    let pids = Arc::new(Mutex::new(std::collections::HashSet::new()));
    for burst in 0..bursts {
        // Within a burst every task holds at once first (the peak), then cycles.
        let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (b, pids, barrier) = (b.clone(), pids.clone(), barrier.clone());
                tokio::spawn(async move {
                    let n = name(&format!("burst-{t}"));
                    for cycle in 0..cycles {
                        let o = owner("burst");
                        acquired(b.acquire(&n, &o, ttl).await.expect("acquire"));
                        let pid = b.holder_pid(&n, &o.token).expect("pid");
                        pids.lock().unwrap().insert(pid);
                        if cycle == 0 {
                            barrier.wait().await;
                        }
                        assert_eq!(
                            b.release(&n, &o.token, Duration::ZERO)
                                .await
                                .expect("release"),
                            ReleaseOutcome::Released
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
        let sessions = pids.lock().unwrap().len();
        assert!(
            sessions <= tasks,
            "{tasks} holders at once, after burst {burst}: {sessions} sessions used"
        );
    }
}

/// With a session limit, the advisory mode holds at most that many leases at once: an
/// attempt beyond it waits for a release (woken by it, in arrival order) or, when none
/// comes within its call timeout, fails with a timeout and takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_session_limit_makes_attempts_wait_for_a_release() {
    let db = PostgresServer::shared().await.expect("server");
    let call = Duration::from_secs(2);
    let mut b = AdvisoryLockBackend::connect_with(&db.url(), call, 4)
        .await
        .expect("connect");
    b.set_max_sessions(2).expect("limit");
    let ttl = Duration::from_secs(30);
    let (n1, a1) = (name("limit-1"), owner("a1"));
    let (n2, a2) = (name("limit-2"), owner("a2"));
    acquired(b.acquire(&n1, &a1, ttl).await.expect("acquire"));
    acquired(b.acquire(&n2, &a2, ttl).await.expect("acquire"));

    // A third lease, no session free: a timeout (retryable), nothing taken.
    let (n3, a3) = (name("limit-3"), owner("a3"));
    let started = Instant::now();
    let err = b.acquire(&n3, &a3, ttl).await.expect_err("no session free");
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        started.elapsed() >= call,
        "gave up after {:?}, before its call timeout",
        started.elapsed()
    );
    assert!(
        b.inspect(&n3).await.expect("inspect").is_none(),
        "taken anyway"
    );
    assert_eq!(b.holder_pid(&n3, &a3.token), None);

    // A waiting attempt is woken by a release and takes the freed session.
    let waiting = tokio::spawn({
        let (b, n3, a3) = (b.clone(), n3.clone(), a3.clone());
        async move { b.acquire(&n3, &a3, ttl).await }
    });
    // Time for the attempt to queue. Should it not have started yet, it is served after
    // the release all the same; what is checked is that it is not served before it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "the third lease was taken beside two held"
    );
    let freed = b.holder_pid(&n1, &a1.token).expect("pid");
    release_ours(&b, &n1, &a1).await;
    acquired(waiting.await.expect("task").expect("acquire"));
    assert_eq!(
        b.holder_pid(&n3, &a3.token),
        Some(freed),
        "the released session was not the one reused"
    );
    release_ours(&b, &n2, &a2).await;
    release_ours(&b, &n3, &a3).await;
}

/// Bursts of 32 concurrent holders under a limit of 4 sessions use at most 4 sessions,
/// and every attempt is served (the call timeout is long enough for the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_session_limit_bounds_the_sessions_of_a_burst() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect_with(&db.url(), Duration::from_secs(20), 4)
        .await
        .expect("connect");
    b.set_max_sessions(4).expect("limit");
    let ttl = Duration::from_secs(30);
    let pids = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let handles: Vec<_> = (0..32)
        .map(|t| {
            let (b, pids) = (b.clone(), pids.clone());
            tokio::spawn(async move {
                let n = name(&format!("limited-burst-{t}"));
                for _ in 0..5 {
                    let o = owner("burst");
                    acquired(b.acquire(&n, &o, ttl).await.expect("acquire"));
                    pids.lock()
                        .unwrap()
                        .insert(b.holder_pid(&n, &o.token).expect("pid"));
                    release_ours(&b, &n, &o).await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    let sessions = pids.lock().unwrap().len();
    assert!(sessions <= 4, "a limit of 4 sessions, {sessions} used");
}

/// A session limit of zero, or one set on a backend that has clones, is refused and
/// leaves the backend as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_session_limit_refuses_zero_and_a_cloned_backend() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let clone = b.clone();
    let err = b.set_max_sessions(4).expect_err("cloned");
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::Other(ref m)) if m.contains("cloned")),
        "{err:?}"
    );
    drop(clone);
    let err = b.set_max_sessions(0).expect_err("zero");
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::Other(ref m)) if m.contains("not 0")),
        "{err:?}"
    );
    // Nothing was changed or lost: the backend works, and takes its limit now.
    b.set_max_sessions(1).expect("limit");
    let (n, a) = (name("limit-after-refusals"), owner("a"));
    acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    release_ours(&b, &n, &a).await;
}

/// The renewal items of `leases`.
fn renew_items(leases: &[(LeaseName, Owner)]) -> Vec<RenewItem> {
    leases
        .iter()
        .map(|(n, o)| RenewItem {
            name: n.clone(),
            token: o.token,
        })
        .collect()
}

/// Waits until `other` can take (and then releases) each of `names`: a lock left by a
/// caller that gave up is unlocked by a task of the backend's, so this waits within a
/// bound far above a statement's time (10 s) and fails naming the first still held.
async fn wait_all_free(other: &AdvisoryLockBackend, names: &[LeaseName]) {
    let ttl = Duration::from_secs(30);
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in names {
        loop {
            let o = owner("c");
            match other.acquire(n, &o, ttl).await.expect("acquire") {
                AcquireOutcome::Acquired { .. } => {
                    release_ours(other, n, &o).await;
                    break;
                }
                AcquireOutcome::Held(_) => {
                    assert!(Instant::now() < deadline, "{n} still held for nobody");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// The sessions whose `application_name` is `app`.
async fn sessions_named(admin: &mut PgConnection, app: &str) -> std::collections::BTreeSet<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_all(admin)
        .await
        .expect("pg_stat_activity")
        .into_iter()
        .collect()
}

/// `connect` opens the sessions the first lease needs: the first acquire takes its lock
/// on a session opened by `connect`, and renewing it uses another one opened there, so
/// neither opens a session within its call timeout. Before, the first acquire took the
/// pool's only session or, when that session was still on its way back to the pool,
/// opened one (a new server process: under a loaded machine's CI run more than the 200 ms
/// call timeout of a 600 ms lease, the conformance suite's `lost_signal_when_store_hangs`
/// failing with `acquire: Timeout`); either way one of the two calls opened a session.
/// Later, with two CPU hogs running, the renewal opened a third session in about one run
/// of three: `connect` returned while sqlx was still giving its pooled session back (a
/// ping, in a task); `connect` now waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_connect_opens_the_sessions_of_the_first_lease() {
    let db = PostgresServer::shared().await.expect("server");
    let mut admin = PgConnection::connect(&db.url()).await.expect("connect");
    // The backend's sessions carry a name of their own (the database may be shared).
    let app = format!("first-lease-{}", uuid::Uuid::new_v4().simple());
    let url = db.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let b = AdvisoryLockBackend::connect(&format!("{url}{sep}application_name={app}"))
        .await
        .expect("connect");
    let opened = sessions_named(&mut admin, &app).await;
    let (n, a) = (name("first"), owner("a"));
    acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    let pid = b.holder_pid(&n, &a.token).expect("pid");
    assert!(
        opened.contains(&pid),
        "the first lock was taken on session {pid}, not one of those connect opened: {opened:?}"
    );
    let renewed = b
        .renew(
            &[RenewItem {
                name: n.clone(),
                token: a.token,
            }],
            Duration::from_secs(30),
        )
        .await
        .expect("renew");
    assert_eq!(renewed, vec![RenewOutcome::Renewed]);
    assert_eq!(
        sessions_named(&mut admin, &app).await,
        opened,
        "the first acquire and renewal opened or closed sessions"
    );
    release_ours(&b, &n, &a).await;
}

/// A pool of one connection is enough: `connect` opens the first lock's session outside
/// the pool, and the lease is taken, renewed and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_connects_with_a_pool_of_one() {
    let db = PostgresServer::shared().await.expect("server");
    let b = AdvisoryLockBackend::connect_with(&db.url(), Duration::from_secs(2), 1)
        .await
        .expect("connect");
    let (n, a) = (name("pool-of-one"), owner("a"));
    acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    let item = RenewItem {
        name: n.clone(),
        token: a.token,
    };
    assert_eq!(
        b.renew(&[item], Duration::from_secs(30))
            .await
            .expect("renew"),
        vec![RenewOutcome::Renewed]
    );
    release_ours(&b, &n, &a).await;
}

/// An attempt on a kept session takes the lock, and its reply is lost where the server
/// does not learn that the client has gone: the session given up on still holds the
/// lock. The attempt, on a fresh session, finds that it is its own, ends that session and
/// takes the lock, instead of reporting it held (by nobody but itself, until the server
/// noticed the dead connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_lock_taken_by_a_session_given_up_on_is_taken_again() {
    use lease_test_servers::proxy::{FaultProxy, ProxyFault};
    let db = PostgresServer::shared().await.expect("server");
    let (proxy, via) = FaultProxy::in_front_of(&db.url()).await.expect("proxy");
    // The call timeout is the backend's own here (no client): 2 s, a kept session 1 s.
    let b = AdvisoryLockBackend::connect_with(&via, Duration::from_secs(2), 4)
        .await
        .expect("connect");
    let mut admin = PgConnection::connect(&db.url()).await.expect("connect");
    // A lease taken and released first: the kept session has the lock statement prepared,
    // so the lost reply is the lock's own (not that of preparing the statement).
    let (warm, w) = (name("warm"), owner("w"));
    acquired(
        b.acquire(&warm, &w, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    let kept = b.holder_pid(&warm, &w.token).expect("pid");
    release_ours(&b, &warm, &w).await;
    let (n, a) = (name("given-up"), owner("a"));
    proxy.set(ProxyFault::LoseNextReplyServerUnaware);
    let outcome = b.acquire(&n, &a, Duration::from_secs(30)).await;
    assert_eq!(proxy.replies_lost(), 1, "no reply was lost: nothing tested");
    let outcome = outcome.expect("acquire");
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "the lock its own abandoned session took was reported {outcome:?}"
    );
    let pid = b.holder_pid(&n, &a.token).expect("pid");
    assert_ne!(pid, kept, "the lock is held on the session given up on");
    // One holder on the server: this backend's fresh session.
    let holders: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND ((classid::bigint << 32) | objid::bigint) \
             = ('x' || left(md5($1::bytea), 16))::bit(64)::bigint",
    )
    .bind(n.as_bytes())
    .fetch_all(&mut admin)
    .await
    .expect("pg_locks");
    assert_eq!(holders, vec![pid]);
    release_ours(&b, &n, &a).await;
}

/// The advisory mode keeps a released lease's connection for the next attempt (opening
/// a session costs more than the lock), and replaces a kept connection that died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_reuses_released_connections() {
    let db = PostgresServer::shared().await.expect("server");
    let b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(1);
    let (n1, a) = (name("reuse-1"), owner("a"));
    acquired(b.acquire(&n1, &a, ttl).await.expect("acquire"));
    let first_pid = b.holder_pid(&n1, &a.token).expect("pid");
    release_ours(&b, &n1, &a).await;
    // A different lease, on the same session: it holds no lock any more.
    let (n2, c) = (name("reuse-2"), owner("c"));
    acquired(b.acquire(&n2, &c, ttl).await.expect("acquire"));
    assert_eq!(b.holder_pid(&n2, &c.token), Some(first_pid));
    // The first lease is free for anyone else.
    let other = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let d = owner("d");
    acquired(other.acquire(&n1, &d, ttl).await.expect("acquire"));
    other
        .release(&n1, &d.token, Duration::ZERO)
        .await
        .expect("release");
    release_ours(&b, &n2, &c).await;

    // The kept session is ended by an operator; the next attempt uses a fresh one.
    let mut admin = PgConnection::connect(&db.url()).await.expect("connect");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first_pid)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(terminated);
    // Termination is asynchronous: wait until the session is gone.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(first_pid)
                .fetch_one(&mut admin)
                .await
                .expect("pg_stat_activity");
        if !alive {
            break;
        }
        assert!(Instant::now() < until, "session {first_pid} still alive");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let e = owner("e");
    acquired(b.acquire(&n1, &e, ttl).await.expect("acquire"));
    let pid = b.holder_pid(&n1, &e.token).expect("pid");
    assert_ne!(pid, first_pid);
    release_ours(&b, &n1, &e).await;
}

/// A batch renewal stays fast when the renew statement's cached plan was made from
/// statistics of a small table whose rows were all released (the normal state of a lock
/// table between jobs) and the table has since grown. The connection is told to use
/// generic plans at once (`plan_cache_mode`), as sqlx's prepared statements do after five
/// runs, and autovacuum is off for the table, so no fresh statistics replace the plan.
/// With the liveness test as a filter on the table, that plan scanned the table once and
/// the whole batch for every row: 101,200 rows x 10,000 names, over 30 s. The call
/// timeout of 10 s is the bound: the linear plans take about 0.1 s here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_renewal_survives_stale_statistics() {
    use lease_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let db = PostgresServer::shared().await.expect("server");
    let request_timeout = Duration::from_secs(10);
    let options: PgConnectOptions = db.url().parse().expect("url");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.options([
            ("plan_cache_mode", "force_generic_plan".to_owned()),
            ("statement_timeout", request_timeout.as_millis().to_string()),
        ]))
        .await
        .expect("pool");
    let b = PostgresBackend::from_pool(
        pool.clone(),
        config(&table()).with_request_timeout(request_timeout),
    )
    .await
    .expect("backend");
    b.create_table().await.expect("schema");
    let t = b.table().to_owned();
    let a = owner("grower");
    let exec = |s: String| {
        let pool = pool.clone();
        async move {
            sqlx::raw_sql(sqlx::AssertSqlSafe(s.clone()))
                .execute(&pool)
                .await
                .expect(&s)
        }
    };
    exec(format!("ALTER TABLE {t} SET (autovacuum_enabled = false)")).await;
    // 1,200 released rows, analysed: the planner believes no row is live.
    exec(format!(
        "INSERT INTO {t} (name, owner_token, holder, fencing, locked_at, lock_until, released) \
         SELECT convert_to('stale-a-' || g, 'UTF8'), gen_random_uuid(), 'old', 1, \
         clock_timestamp(), clock_timestamp(), true FROM generate_series(1, 1200) g"
    ))
    .await;
    exec(format!("ANALYZE {t}")).await;
    // The first renewal on the single connection prepares the statement and caches its
    // generic plan.
    let none = name("none");
    let outcome = b
        .renew(
            &[RenewItem {
                name: none,
                token: a.token,
            }],
            Duration::from_secs(300),
        )
        .await
        .expect("renew");
    assert_eq!(outcome, vec![RenewOutcome::Lost]);
    // The table grows by 100,000 live leases of `a`; 10,000 of them are renewed at once.
    let grown = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (name, owner_token, holder, fencing, locked_at, lock_until, released) \
         SELECT convert_to('stale-b-' || g, 'UTF8'), $1, 'grower', 1, clock_timestamp(), \
         clock_timestamp() + interval '300 s', false FROM generate_series(1, 100000) g"
    )))
    .bind(a.token.as_uuid())
    .execute(&pool)
    .await
    .expect("grow");
    assert_eq!(grown.rows_affected(), 100_000);
    let items: Vec<RenewItem> = (1..=10_000)
        .map(|i| RenewItem {
            name: LeaseName::new(format!("stale-b-{}", i * 10)).expect("name"),
            token: a.token,
        })
        .collect();
    let started = Instant::now();
    let outcomes = b
        .renew(&items, Duration::from_secs(300))
        .await
        .expect("a batch renewal within the call timeout");
    eprintln!("renewed 10,000 of 101,200 rows in {:?}", started.elapsed());
    assert_eq!(outcomes.len(), 10_000);
    assert!(outcomes.iter().all(|o| *o == RenewOutcome::Renewed));
}

/// Renewals do not wait for the backend's pool: with every pooled connection taken by
/// other work (the application's own queries through `pool()`, or a flood of
/// contenders), a holder keeps its lease. Before renewals had connections of their own,
/// the renewal waited for a pooled connection past the lease's deadline (the lab's
/// 1000-contender scenario lost its holder that way on a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_does_not_delay_renewals() {
    let db = PostgresServer::shared().await.expect("server");
    let b = backend(&db.url()).await;
    let client = lease_core::LeaseClient::new(Arc::new(b.clone()));
    let opts = lease_core::LeaseOptions::new(Duration::from_millis(300)).expect("options");
    let guard = client
        .acquire(&name("busy-pool"), &opts)
        .await
        .expect("acquire");
    let mut taken = Vec::new();
    for _ in 0..PostgresConfig::default().max_connections {
        taken.push(b.pool().acquire().await.expect("a pooled connection"));
    }
    lease_conformance::outage::kept_while_busy(&guard, &opts, opts.ttl() * 4).await;
    drop(taken);
    guard.release().await.expect("release");
}

/// The table mode keeps a statement's connection for its next statement (no ping on the
/// way back to the pool): after the cycles, the pool holds none of the backend's
/// connections idle, and after `KEEP_IDLE` and one turn of the backend's sweep (every
/// `KEEP_IDLE`) it has them back. Many tasks on a pool of two, one connection held by a
/// query of the caller's own the whole time, all finish: a task that finds the pool full
/// gets a connection another statement kept instead of waiting in the pool's queue, where
/// kept connections never come back, until its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_serve_every_statement_and_go_back_when_unused() {
    let db = PostgresServer::shared().await.expect("server");
    let b = PostgresBackend::connect_with(&db.url(), config(&table()).with_max_connections(2))
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let held_elsewhere = b.pool().acquire().await.expect("a connection of our own");
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let b = b.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let lease = name(&format!("small-pool-{t}-{i}"));
                    let o = owner("small-pool");
                    acquired(b.acquire(&lease, &o, ttl).await.expect("acquire"));
                    release_ours(&b, &lease, &o).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    // The backend's one connection is kept, not idle in the pool (the other one is still
    // held above).
    assert_eq!(b.pool().size(), 2);
    assert_eq!(b.pool().num_idle(), 0, "the backend's connection is kept");
    drop(held_elsewhere);
    // Back within KEEP_IDLE plus a sweep's period, with 3 s of margin for a loaded
    // machine: both connections taken by callers of our own.
    let deadline = lease_postgres::KEEP_IDLE * 2 + Duration::from_secs(3);
    let both = tokio::time::timeout(deadline, async {
        (
            b.pool().acquire().await.expect("first"),
            b.pool().acquire().await.expect("second"),
        )
    })
    .await
    .expect("the kept connection went back to the pool");
    drop(both);
}

/// A full lock table (advisory locks take its entries, and on shared sessions many leases
/// sit on few sessions): the attempt that meets it fails with a retryable error that keeps
/// the server's reason, and loses nothing. The leases already held renew, and the refused
/// name is inspected and force-released as held by nobody, all on the pool's open session
/// (those statements read `pg_locks`, which needs no entry of that table; the server
/// starts no new session while it is full); once there is room another backend takes the
/// refused name. A server of its own, whose table is made small
/// (`max_locks_per_transaction` 10 of the default 64) and then filled by a session taking
/// advisory locks of its own, so that no other test meets a full table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_lock_table_full_refuses_and_loses_nothing() {
    let mut server = PostgresServer::start_fast().await.expect("server");
    server
        .sql(
            "postgres",
            "ALTER SYSTEM SET max_locks_per_transaction = 10",
        )
        .expect("alter system");
    server.stop().await.expect("stop");
    server.start_again().await.expect("start again");
    let setting = server
        .sql("postgres", "SHOW max_locks_per_transaction")
        .expect("show");
    assert_eq!(setting, vec![vec![Some("10".to_owned())]]);
    // A pool of one session: a call waits for it to be back (sqlx gives it back in a task
    // of its own, after a ping) instead of opening another, which the server would refuse
    // with its table full.
    let mut b = AdvisoryLockBackend::connect_with(&server.url(), Duration::from_secs(5), 1)
        .await
        .expect("connect");
    b.set_shared_sessions(2).expect("shared");
    let ttl = Duration::from_secs(30);
    let held: Vec<(LeaseName, Owner)> = (0..5)
        .map(|i| (name(&format!("full-{i}")), owner("a")))
        .collect();
    for (n, o) in &held {
        acquired(b.acquire(n, o, ttl).await.expect("acquire"));
    }
    let items = renew_items(&held);
    let all_renewed = |r: &[RenewOutcome]| r.iter().all(|r| *r == RenewOutcome::Renewed);
    // The pool's session opened while there is room.
    assert!(all_renewed(&b.renew(&items, ttl).await.expect("renew")));
    // Another session fills the table, a thousand locks a statement, until the server
    // refuses (session locks stay taken when the statement that took them fails).
    let mut filler = PgConnection::connect(&server.url()).await.expect("filler");
    let mut taken = 0_i64;
    let refusal = loop {
        assert!(
            taken < 1_000_000,
            "a million locks taken, the table never filled"
        );
        match sqlx::query("SELECT pg_advisory_lock(k) FROM generate_series($1::bigint, $1 + 999) k")
            .bind(1_000_000_000 + taken)
            .execute(&mut filler)
            .await
        {
            Ok(_) => taken += 1_000,
            Err(e) => break e.to_string(),
        }
    };
    assert!(refusal.contains("shared memory"), "{refusal}");
    let refused = name("full-refused");
    let error = match b.acquire(&refused, &owner("b"), ttl).await {
        Err(e) => e,
        Ok(outcome) => panic!("an attempt with the table full: {outcome:?}"),
    };
    assert!(error.is_retryable(), "{error}");
    assert!(
        error.to_string().contains("shared memory"),
        "the server's reason is kept: {error}"
    );
    // Nothing lost: every lease held renews; the refused name is held by nobody.
    let renewed = b.renew(&items, ttl).await.expect("renew");
    assert!(all_renewed(&renewed), "{renewed:?}");
    assert!(b.inspect(&held[0].0).await.expect("inspect").is_some());
    assert!(b.inspect(&refused).await.expect("inspect").is_none());
    assert!(!b.force_release(&refused).await.expect("force release"));
    let pids: std::collections::HashSet<i32> = held
        .iter()
        .map(|(n, o)| b.holder_pid(n, &o.token).expect("pid"))
        .collect();
    assert!(pids.len() <= 2, "{} sessions", pids.len());
    // Room again: another backend (another session, where a lock left on ours would
    // refuse it) takes the refused name.
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut filler)
        .await
        .expect("unlock all");
    let other = AdvisoryLockBackend::connect(&server.url())
        .await
        .expect("connect");
    let o = owner("c");
    acquired(other.acquire(&refused, &o, ttl).await.expect("acquire"));
    release_ours(&other, &refused, &o).await;
    for (n, o) in &held {
        release_ours(&b, n, o).await;
    }
}

/// Shared sessions (`set_shared_sessions`): 60 leases held at once on at most 2 server
/// sessions, each refused to another backend while held and free to it once released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_sessions_hold_more_leases_than_sessions() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    b.set_shared_sessions(2).expect("shared");
    let other = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let leases: Vec<(LeaseName, Owner)> = (0..60)
        .map(|i| (name(&format!("shared-{i}")), owner("a")))
        .collect();
    let handles: Vec<_> = leases
        .iter()
        .cloned()
        .map(|(n, o)| {
            let b = b.clone();
            tokio::spawn(async move { acquired(b.acquire(&n, &o, ttl).await.expect("acquire")) })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    let pids: std::collections::HashSet<i32> = leases
        .iter()
        .map(|(n, o)| b.holder_pid(n, &o.token).expect("pid"))
        .collect();
    assert!(
        pids.len() <= 2,
        "60 leases on at most 2 sessions, {} used",
        pids.len()
    );
    // A second owner through the same backend is refused (no re-entrant grant on the
    // session that holds the lock), and so is another backend.
    let (n0, _) = &leases[0];
    assert!(matches!(
        b.acquire(n0, &owner("b"), ttl).await.expect("acquire"),
        AcquireOutcome::Held(_)
    ));
    for (n, _) in &leases {
        assert!(
            matches!(
                other.acquire(n, &owner("c"), ttl).await.expect("acquire"),
                AcquireOutcome::Held(_)
            ),
            "{n} taken by another backend while held"
        );
    }
    let items = renew_items(&leases);
    let renewed = b.renew(&items, ttl).await.expect("renew");
    assert!(
        renewed.iter().all(|r| *r == RenewOutcome::Renewed),
        "{renewed:?}"
    );
    for (n, o) in &leases {
        release_ours(&b, n, o).await;
    }
    for (n, _) in &leases {
        let o = owner("c");
        acquired(other.acquire(n, &o, ttl).await.expect("acquire"));
        release_ours(&other, n, &o).await;
    }
}

/// A shared session that ends (here `pg_terminate_backend`, as an operator or
/// `force_release` would) loses the leases on it, and only those: their renewal says
/// lost, the other session's leases renew, and the names are taken again on a new
/// session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_session_lost_loses_the_leases_on_it_only() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    b.set_shared_sessions(2).expect("shared");
    let ttl = Duration::from_secs(30);
    // Bursts of 10 concurrent attempts, until the leases sit on both sessions (an attempt
    // opens the second session when it finds the first busy with another's statement).
    let mut leases: Vec<(LeaseName, Owner)> = Vec::new();
    let pid_of = |n: &LeaseName, o: &Owner| b.holder_pid(n, &o.token).expect("pid");
    for burst in 0.. {
        assert!(burst < 20, "20 bursts of 10 attempts used one session only");
        let batch: Vec<(LeaseName, Owner)> = (0..10)
            .map(|i| (name(&format!("shared-lost-{burst}-{i}")), owner("a")))
            .collect();
        let handles: Vec<_> = batch
            .iter()
            .cloned()
            .map(|(n, o)| {
                let b = b.clone();
                tokio::spawn(
                    async move { acquired(b.acquire(&n, &o, ttl).await.expect("acquire")) },
                )
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
        leases.extend(batch);
        let used: std::collections::BTreeSet<i32> =
            leases.iter().map(|(n, o)| pid_of(n, o)).collect();
        if used.len() == 2 {
            break;
        }
    }
    let pids: std::collections::BTreeSet<i32> = leases.iter().map(|(n, o)| pid_of(n, o)).collect();
    let victim = *pids.iter().next().expect("pid");
    let mut admin = PgConnection::connect(&db.url()).await.expect("admin");
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(victim)
        .fetch_one(&mut admin)
        .await
        .expect("terminate");
    assert!(ended);
    // Termination is asynchronous: wait until the server has let the session go.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(victim)
                .fetch_one(&mut admin)
                .await
                .expect("pg_stat_activity");
        if !alive {
            break;
        }
        assert!(Instant::now() < deadline, "session {victim} still there");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let items = renew_items(&leases);
    let renewed = b.renew(&items, ttl).await.expect("renew");
    for ((n, o), outcome) in leases.iter().zip(&renewed) {
        let expected = if pid_of(n, o) == victim {
            RenewOutcome::Lost
        } else {
            RenewOutcome::Renewed
        };
        assert_eq!(*outcome, expected, "{n} on session {}", pid_of(n, o));
    }
    // Every lost name can be taken again through the same backend (its names are not
    // left reserved on the dead session), and released.
    for (n, o) in &leases {
        if pid_of(n, o) == victim {
            assert_eq!(
                b.release(n, &o.token, Duration::ZERO)
                    .await
                    .expect("release"),
                ReleaseOutcome::NotOwner
            );
            let again = owner("again");
            acquired(b.acquire(n, &again, ttl).await.expect("acquire again"));
            assert_ne!(b.holder_pid(n, &again.token), Some(victim));
            release_ours(&b, n, &again).await;
        } else {
            release_ours(&b, n, o).await;
        }
    }
}

/// Attempts given up at every point of their flight (a timeout around each, from 0 to
/// a few ms) on shared sessions leave no lock taken for nobody: once the backend's
/// own tasks have finished, every name is free to another backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_attempts_given_up_leave_nothing_held() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    b.set_shared_sessions(2).expect("shared");
    let other = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let mut kept = Vec::new();
    let mut names: Vec<LeaseName> = Vec::new();
    let mut given_up_in_flight = 0;
    // Rounds of 40 until some attempts were given up after they were sent: on a loaded
    // machine an attempt's reply can be in before its first poll ends (the thread lost
    // its core between sending and reading).
    for round in 0..20 {
        if given_up_in_flight >= 5 {
            break;
        }
        for i in 0..40 {
            let n = name(&format!("given-up-{round}-{i}"));
            let o = owner("a");
            // Polled 0 to 4 times (a yield between two polls), then dropped: before the
            // statement is sent, with it sent and unanswered, or later; those that
            // finish in time are kept and released below.
            let mut attempt = std::pin::pin!(b.acquire(&n, &o, ttl));
            let mut outcome = None;
            for poll in 0..i % 5 {
                if poll > 0 {
                    tokio::task::yield_now().await;
                }
                if let std::task::Poll::Ready(r) =
                    std::future::poll_fn(|cx| std::task::Poll::Ready(attempt.as_mut().poll(cx)))
                        .await
                {
                    outcome = Some(r);
                    break;
                }
            }
            match outcome {
                Some(Ok(AcquireOutcome::Acquired { .. })) => kept.push((n.clone(), o.clone())),
                Some(r) => panic!("{n}: {r:?}"),
                None if i % 5 > 0 => given_up_in_flight += 1,
                None => {}
            }
            names.push(n.clone());
        }
    }
    assert!(
        given_up_in_flight > 0,
        "no attempt was given up after it was sent: the check shows nothing"
    );
    for (n, o) in &kept {
        release_ours(&b, n, o).await;
    }
    // A lock taken for a caller that gave up is released by a task of the backend's.
    wait_all_free(&other, &names).await;
    // And the backend itself takes every name again.
    for n in &names {
        let o = owner("d");
        acquired(b.acquire(n, &o, ttl).await.expect("acquire"));
        release_ours(&b, n, &o).await;
    }
}

/// Two names with the same advisory key: the MD5 collision pair of Wang and Yu (2004),
/// two 128-byte blocks with one md5, each followed by `suffix` (a common suffix keeps the
/// collision: the blocks end md5's state equal). The key is the first 64 bits of md5.
fn colliding_names(suffix: &str) -> (LeaseName, LeaseName) {
    const A: &str = "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89\
                     55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b\
                     d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0\
                     e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70";
    const B: &str = "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89\
                     55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b\
                     d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0\
                     e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70";
    let block = |hex: &str| -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        bytes.extend_from_slice(suffix.as_bytes());
        bytes
    };
    let (a, b) = (block(A), block(B));
    assert_ne!(a, b);
    (
        LeaseName::new(a).expect("name"),
        LeaseName::new(b).expect("name"),
    )
}

/// Names whose advisory keys collide are one lock on shared sessions, as they are with a
/// session per lease: with the first held, an attempt at the second is refused, on one
/// session and when a second session could try it. Before, shared sessions reserved
/// names, not keys, so the second was granted beside the first on its session (advisory
/// locks are re-entrant), and an unlock meant for one (the cleanup of a release given
/// up) could free the other's lock while its owner still held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_colliding_names_are_one_lock() {
    let db = PostgresServer::shared().await.expect("server");
    let mut admin = PgConnection::connect(&db.url()).await.expect("admin");
    let other = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    for max in [1, 2] {
        let (first, second) = colliding_names(&format!("-{max}"));
        let keys: Vec<i64> = sqlx::query_scalar(
            "SELECT ('x' || left(md5(n), 16))::bit(64)::bigint FROM unnest($1::bytea[]) AS n",
        )
        .bind(vec![first.as_bytes().to_vec(), second.as_bytes().to_vec()])
        .fetch_all(&mut admin)
        .await
        .expect("keys");
        assert_eq!(keys[0], keys[1], "the pair's keys differ: {keys:?}");
        let mut b = AdvisoryLockBackend::connect(&db.url())
            .await
            .expect("connect");
        b.set_shared_sessions(max).expect("shared");
        let (oa, ob) = (owner("a"), owner("b"));
        acquired(b.acquire(&first, &oa, ttl).await.expect("acquire"));
        let outcome = b.acquire(&second, &ob, ttl).await.expect("acquire");
        assert!(
            matches!(outcome, AcquireOutcome::Held(_)),
            "with {max} shared session(s), the name colliding with a held one was granted: \
             {outcome:?}"
        );
        for n in [&first, &second] {
            let outcome = other.acquire(n, &owner("c"), ttl).await.expect("acquire");
            assert!(matches!(outcome, AcquireOutcome::Held(_)), "{outcome:?}");
        }
        let renewed = b
            .renew(
                &[RenewItem {
                    name: first.clone(),
                    token: oa.token,
                }],
                ttl,
            )
            .await
            .expect("renew");
        assert_eq!(renewed, vec![RenewOutcome::Renewed]);
        release_ours(&b, &first, &oa).await;
        let oc = owner("c");
        acquired(other.acquire(&second, &oc, ttl).await.expect("acquire"));
        release_ours(&other, &second, &oc).await;
    }
}

/// Statements on a shared session cancelled by the server (`pg_cancel_backend` of the
/// session, again and again, while attempts and releases run on it) leave no lock held
/// for nobody, and a cancelled unlock does not close the session: an attempt the server
/// answered with an error may have taken its lock before the cancel was noticed, and its
/// key is unlocked there; an unlock that failed is sent again. After each phase every
/// name the backend does not hold is free to another backend, and every lease it still
/// holds is held (renewed, and refused to another backend) unless the session was
/// closed, which renewal then reports. Before the fix, 3 runs of 5 found a name held for
/// nobody after the paced phase, and the other 2 had lost most kept leases there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_cancelled_statements_leave_nothing_held() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    b.set_shared_sessions(1).expect("shared");
    let other = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let ttl = Duration::from_secs(30);
    let (mut errors, mut paced_errors) = (0, 0);
    let (mut paced_checked, mut paced_lost) = (false, 0);
    let mut held: Vec<(LeaseName, Owner)> = Vec::new();
    let mut names: Vec<LeaseName> = Vec::new();
    // Rounds of 100 attempts, in two phases. A cancel ends a statement only if it lands
    // while the statement runs (one that finds the session idle is dropped).
    // - Paced (a cancel about every millisecond, tokio's timer), until 2 calls failed or
    //   150 rounds: 1 to 4 calls in 6,000 fail, and the session nearly always survives,
    //   so a lock left held for nobody stays held and shows below. (Before the fix this
    //   phase found one in 2 runs of 3.)
    // - Back to back, until 5 calls failed in all: many fail, and both sends of an unlock
    //   are sometimes cancelled, which closes the session (allowed: it frees every lock
    //   on it, and its leases are reported lost).
    for round in 0..250 {
        let paced = paced_errors < 2 && round < 150;
        if !paced && !paced_checked {
            // Before the back-to-back phase can close the session (which would free a
            // lock left held for nobody, and hide it).
            paced_lost = storm_left_nothing_held(&b, &other, &names, &held).await;
            paced_checked = true;
        }
        if !paced && errors >= 5 {
            break;
        }
        let kept = (name(&format!("cancel-kept-{round}")), owner("a"));
        let mut pid = None;
        if let Ok(AcquireOutcome::Acquired { .. }) = b.acquire(&kept.0, &kept.1, ttl).await {
            pid = b.holder_pid(&kept.0, &kept.1.token);
            held.push(kept);
        }
        let Some(pid) = pid.or_else(|| held.iter().find_map(|(n, o)| b.holder_pid(n, &o.token)))
        else {
            continue;
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let canceller = {
            let (url, stop) = (db.url(), stop.clone());
            tokio::spawn(async move {
                let mut admin = PgConnection::connect(&url).await.expect("admin");
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: bool = sqlx::query_scalar("SELECT pg_cancel_backend($1)")
                        .bind(pid)
                        .fetch_one(&mut admin)
                        .await
                        .expect("cancel");
                    if paced {
                        tokio::time::sleep(Duration::from_micros(300)).await;
                    }
                }
            })
        };
        let before = errors;
        for i in 0..100 {
            let (n, o) = (name(&format!("cancel-{round}-{i}")), owner("a"));
            names.push(n.clone());
            match b.acquire(&n, &o, ttl).await {
                Ok(AcquireOutcome::Acquired { .. }) => {
                    if b.release(&n, &o.token, Duration::ZERO).await.is_err() {
                        errors += 1;
                    }
                }
                Ok(AcquireOutcome::Held(_)) => {}
                Err(_) => errors += 1,
            }
        }
        if paced {
            paced_errors += errors - before;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        canceller.await.expect("canceller");
    }
    assert!(
        errors > 0,
        "no statement was cancelled: the check shows nothing"
    );
    assert!(paced_checked, "the paced phase never ended");
    // An unlock is sent twice before a server error closes its session; two cancels in a
    // row at the paced rate (a few calls in thousands) are not expected. Before, one
    // failed unlock closed it: 25 of 29 and 30 of 37 kept leases lost in this phase.
    assert_eq!(
        paced_lost,
        0,
        "the paced phase closed the session: {paced_lost} of {} kept leases lost",
        held.len()
    );
    let lost = storm_left_nothing_held(&b, &other, &names, &held).await;
    eprintln!(
        "{errors} calls failed ({paced_errors} paced); {} names tried; kept leases lost with \
         a closed session: {paced_lost} of {} after the paced phase, {lost} after both",
        names.len(),
        held.len()
    );
}

/// After a cancel storm on `b`'s shared session: every name of `names` that `b` does not
/// hold is free to `other` (within a bound far above a statement's time: the unlocks run
/// in tasks), and every lease of `held` that renews is held (refused to `other`). Returns
/// how many of `held` renewal reported lost (their session was closed).
async fn storm_left_nothing_held(
    b: &AdvisoryLockBackend,
    other: &AdvisoryLockBackend,
    names: &[LeaseName],
    held: &[(LeaseName, Owner)],
) -> usize {
    let ttl = Duration::from_secs(30);
    wait_all_free(other, names).await;
    let items = renew_items(held);
    let renewed = b.renew(&items, ttl).await.expect("renew");
    let mut lost = 0;
    for ((n, _), outcome) in held.iter().zip(&renewed) {
        match outcome {
            RenewOutcome::Renewed => {
                let outcome = other.acquire(n, &owner("c"), ttl).await.expect("acquire");
                assert!(
                    matches!(outcome, AcquireOutcome::Held(_)),
                    "{n}: {outcome:?}"
                );
            }
            _ => lost += 1,
        }
    }
    lost
}

/// `set_shared_sessions` refuses zero, a cloned backend and a backend with a session
/// limit, changing nothing; `set_max_sessions` refuses a backend with shared sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_shared_sessions_refuse_bad_settings() {
    let db = PostgresServer::shared().await.expect("server");
    let mut b = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    let other_msg = |err: &Error| match err {
        Error::InvalidInput(InvalidInput::Other(m)) => m.clone(),
        e => panic!("{e:?}"),
    };
    let err = b.set_shared_sessions(0).expect_err("zero");
    assert!(other_msg(&err).contains("not 0"), "{err:?}");
    let clone = b.clone();
    let err = b.set_shared_sessions(2).expect_err("cloned");
    assert!(other_msg(&err).contains("cloned"), "{err:?}");
    drop(clone);
    let mut limited = AdvisoryLockBackend::connect(&db.url())
        .await
        .expect("connect");
    limited.set_max_sessions(2).expect("limit");
    let err = limited.set_shared_sessions(2).expect_err("after a limit");
    assert!(other_msg(&err).contains("set_max_sessions"), "{err:?}");
    b.set_shared_sessions(2).expect("shared");
    let err = b.set_max_sessions(2).expect_err("after sharing");
    assert!(other_msg(&err).contains("set_shared_sessions"), "{err:?}");
    let (n, a) = (name("shared-after-refusals"), owner("a"));
    acquired(
        b.acquire(&n, &a, Duration::from_secs(30))
            .await
            .expect("acquire"),
    );
    release_ours(&b, &n, &a).await;
}
