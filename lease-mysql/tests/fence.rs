//! The MySQL fence (`lease_mysql::fence::MysqlFence`, on MariaDB) on a real server: a stale token
//! is refused inside the caller's transaction and its write rolled back; a newer holder's
//! check waits for an older holder's open transaction; and the scenario fencing is for,
//! with real leases: a holder whose lease lapsed (paused past its TTL) writes after the
//! next holder, and its write is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, FencingToken, HolderLabel, LeaseBackend, LeaseName, Owner,
};
use lease_mysql::fence::MysqlFence;
use lease_mysql::sqlx::{self, MySqlPool};
use lease_mysql::{MysqlBackend, MysqlConfig};
use lease_test_servers::MariaDbServer;

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

async fn setup(pool: &MySqlPool) -> (MysqlFence, String) {
    let fence = MysqlFence::new(&unique("fences")).unwrap();
    fence.create_table(pool).await.unwrap();
    let data = unique("outbox");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {data} (id int PRIMARY KEY, sent_by bigint) ENGINE=InnoDB"
    )))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {data} VALUES (1, NULL)"
    )))
    .execute(pool)
    .await
    .unwrap();
    (fence, data)
}

/// The protected write: mark row 1 sent by `token`, behind the fence, in one transaction.
async fn fenced_write(
    pool: &MySqlPool,
    fence: &MysqlFence,
    data: &str,
    token: FencingToken,
) -> Result<(), Error> {
    let mut tx = pool.begin().await.unwrap();
    fence.check(&mut tx, "outbox", token).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {data} SET sent_by = ? WHERE id = 1"
    )))
    .bind(token.get() as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

async fn sent_by(pool: &MySqlPool, data: &str) -> Option<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT sent_by FROM {data} WHERE id = 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_stale_token_is_refused_and_its_write_rolled_back() {
    let db = MariaDbServer::shared().await.unwrap();
    let pool = MySqlPool::connect(&db.url()).await.unwrap();
    let (fence, data) = setup(&pool).await;
    fenced_write(&pool, &fence, &data, FencingToken(5))
        .await
        .unwrap();
    fenced_write(&pool, &fence, &data, FencingToken(5))
        .await
        .unwrap(); // same holder again
    fenced_write(&pool, &fence, &data, FencingToken(9))
        .await
        .unwrap();
    match fenced_write(&pool, &fence, &data, FencingToken(7)).await {
        Err(e @ Error::Fenced { .. }) => {
            assert!(!e.is_retryable());
            assert_eq!(e.kind(), "fenced");
            let Error::Fenced {
                resource,
                token,
                highest,
            } = e
            else {
                unreachable!()
            };
            assert_eq!((resource.as_str(), token, highest), ("outbox", 7, 9));
        }
        other => panic!("a stale token was not refused: {other:?}"),
    }
    assert_eq!(sent_by(&pool, &data).await, Some(9));
    assert_eq!(
        fence.highest(&pool, "outbox").await.unwrap(),
        Some(FencingToken(9))
    );
    assert_eq!(fence.highest(&pool, "other").await.unwrap(), None);
    assert!(
        fence
            .ddl()
            .starts_with("CREATE TABLE IF NOT EXISTS `fences_")
    );
    assert!(MysqlFence::new("bad name; DROP TABLE x").is_err());
}

/// An older holder's transaction has passed the fence and not committed yet; the newer
/// holder's check waits for it (the row is locked), then passes; the older holder's next
/// transaction is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_check_waits_for_an_open_older_transaction() {
    let db = MariaDbServer::shared().await.unwrap();
    let pool = MySqlPool::connect(&db.url()).await.unwrap();
    let (fence, data) = setup(&pool).await;
    let mut old = pool.begin().await.unwrap();
    fence
        .check(&mut old, "outbox", FencingToken(1))
        .await
        .unwrap();
    let newer = {
        let (pool, fence, data) = (pool.clone(), fence.clone(), data.clone());
        tokio::spawn(async move { fenced_write(&pool, &fence, &data, FencingToken(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !newer.is_finished(),
        "the newer check did not wait for the open transaction"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {data} SET sent_by = 1 WHERE id = 1"
    )))
    .execute(&mut *old)
    .await
    .unwrap();
    old.commit().await.unwrap();
    newer.await.unwrap().unwrap();
    assert_eq!(sent_by(&pool, &data).await, Some(2));
    assert!(matches!(
        fenced_write(&pool, &fence, &data, FencingToken(1)).await,
        Err(Error::Fenced { highest: 2, .. })
    ));
}

/// Real leases: holder A's lease lapses while it is paused (it does not renew), B takes
/// the name and writes; A resumes and writes with its token: refused, and B's write
/// stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_ttl_cannot_overwrite_the_next_holder() {
    let db = MariaDbServer::shared().await.unwrap();
    let pool = MySqlPool::connect(&db.url()).await.unwrap();
    let (fence, data) = setup(&pool).await;
    let backend = MysqlBackend::connect_with(
        &db.url(),
        MysqlConfig::default().with_table(unique("lease")),
    )
    .await
    .unwrap();
    let name = LeaseName::new("outbox-sender").unwrap();
    let (a, b) = (
        Owner::new(HolderLabel::new("a").unwrap()),
        Owner::new(HolderLabel::new("b").unwrap()),
    );
    let ttl = Duration::from_secs(1);
    let AcquireOutcome::Acquired {
        fencing: token_a, ..
    } = backend.acquire(&name, &a, ttl).await.unwrap()
    else {
        panic!("a did not acquire")
    };
    // A is paused past its TTL (no renewal).
    let by = tokio::time::Instant::now() + Duration::from_secs(5);
    let token_b = loop {
        if let AcquireOutcome::Acquired { fencing, .. } =
            backend.acquire(&name, &b, ttl).await.unwrap()
        {
            break fencing;
        }
        assert!(tokio::time::Instant::now() < by, "the lease did not lapse");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(token_b > token_a);
    fenced_write(&pool, &fence, &data, token_b).await.unwrap();
    // A resumes, still believing it holds the lease, and writes.
    assert!(matches!(
        fenced_write(&pool, &fence, &data, token_a).await,
        Err(Error::Fenced { .. })
    ));
    assert_eq!(sent_by(&pool, &data).await, Some(token_b.get() as i64));
}
