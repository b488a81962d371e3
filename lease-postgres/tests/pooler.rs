//! The PostgreSQL backends behind a real PgBouncer (local process) in transaction pooling
//! mode, where one client's statements run in whichever server session is free and one
//! server session serves many clients.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, HolderLabel, LeaseBackend, LeaseName, Owner, ReleaseOutcome,
};
use lease_postgres::{AdvisoryLockBackend, PostgresBackend};
use lease_test_servers::postgres::PostgresServer;
use lease_test_servers::{PgBouncer, PoolMode};

fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).unwrap())
}

async fn bouncer(
    db: &lease_test_servers::postgres::PostgresDatabase,
    ignore_options: bool,
) -> PgBouncer {
    PgBouncer::start(
        db.port().expect("a local server"),
        PoolMode::Transaction,
        2,
        ignore_options,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Without being told, the table backend meets PgBouncer's refusal of the startup
/// parameter `options`: a clear configuration error that names the fix, not retryable
/// (retrying cannot help), and no endless reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_startup_parameter_names_the_fix() {
    let db = PostgresServer::shared().await.unwrap();
    if db.port().is_none() {
        eprintln!("skipped: needs the local shared server");
        return;
    }
    let pgb = bouncer(&db, false).await;
    let url = pgb.url(db.name().unwrap());
    let started = tokio::time::Instant::now();
    let err = PostgresBackend::connect(&url).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(matches!(err, Error::Rejected { .. }), "{err:?}");
    assert!(err.to_string().contains("pooler=transaction"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    eprintln!("refused startup parameter: {err}");
}

/// The advisory mode needs a server session per lock. Through transaction pooling two
/// clients share one session, and each would be told it holds the same lock; so it
/// refuses a pooler, whether the pooler refuses or ignores the startup parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_mode_refuses_a_pooler() {
    let db = PostgresServer::shared().await.unwrap();
    if db.port().is_none() {
        eprintln!("skipped: needs the local shared server");
        return;
    }
    for ignore_options in [false, true] {
        let pgb = bouncer(&db, ignore_options).await;
        let url = pgb.url(db.name().unwrap());
        match AdvisoryLockBackend::connect(&url).await {
            Err(e) => {
                assert!(!e.is_retryable(), "{e}");
                assert!(e.to_string().contains("advisory"), "{e}");
                eprintln!("advisory through pgbouncer (ignore options: {ignore_options}): {e}");
            }
            Ok(first) => {
                // What it would do: two holders of one lock.
                let second = AdvisoryLockBackend::connect(&url).await.unwrap();
                let name = LeaseName::new("pooled-advisory").unwrap();
                let a = first
                    .acquire(&name, &owner("a"), Duration::from_secs(30))
                    .await;
                let b = second
                    .acquire(&name, &owner("b"), Duration::from_secs(30))
                    .await;
                panic!(
                    "advisory mode accepted a transaction pooler (ignore options: \
                     {ignore_options}); first: {a:?}, second: {b:?}"
                );
            }
        }
    }
    // With `pooler=transaction` in the URL it refuses at once.
    let pgb = bouncer(&db, true).await;
    let url = format!("{}&pooler=transaction", pgb.url(db.name().unwrap()));
    let e = AdvisoryLockBackend::connect(&url).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
}

/// With `pooler=transaction` the table backend keeps no session state: 8 clients with
/// 4 connections each share 2 server sessions, take turns on 3 names for 3 s, and never
/// overlap; tokens only grow; release notification is off (waiters poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_mode_through_transaction_pooling() {
    let db = PostgresServer::shared().await.unwrap();
    if db.port().is_none() {
        eprintln!("skipped: needs the local shared server");
        return;
    }
    let pgb = bouncer(&db, false).await;
    let url = format!("{}&pooler=transaction", pgb.url(db.name().unwrap()));
    let config = lease_postgres::PostgresConfig::default().with_max_connections(4);
    let mut backends = Vec::new();
    for _ in 0..8 {
        backends.push(Arc::new(
            PostgresBackend::connect_with(&url, config.clone())
                .await
                .unwrap(),
        ));
    }
    assert!(!backends[0].capabilities().release_notification);
    let names: Vec<LeaseName> = (0..3)
        .map(|i| LeaseName::new(format!("pooled-{i}")).unwrap())
        .collect();
    let inside = Arc::new(
        (0..3)
            .map(|_| std::sync::atomic::AtomicU32::new(0))
            .collect::<Vec<_>>(),
    );
    let last_token = Arc::new(
        (0..3)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let stop = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        for k in 0..4 {
            let (b, names, inside, last_token) =
                (b.clone(), names.clone(), inside.clone(), last_token.clone());
            tasks.push(tokio::spawn(async move {
                let o = owner(&format!("c{i}-{k}"));
                let mut held = 0u32;
                let mut j = i + k;
                while tokio::time::Instant::now() < stop {
                    j += 1;
                    let n = j % names.len();
                    match b
                        .acquire(&names[n], &o, Duration::from_secs(10))
                        .await
                        .unwrap()
                    {
                        AcquireOutcome::Acquired { fencing, .. } => {
                            use std::sync::atomic::Ordering::SeqCst;
                            assert_eq!(inside[n].fetch_add(1, SeqCst), 0, "two holders of {n}");
                            let prev = last_token[n].swap(fencing.get(), SeqCst);
                            assert!(fencing.get() > prev, "token {} after {prev}", fencing.get());
                            let renewed = b
                                .renew(
                                    &[lease_core::RenewItem {
                                        name: names[n].clone(),
                                        token: o.token,
                                    }],
                                    Duration::from_secs(10),
                                )
                                .await
                                .unwrap();
                            assert_eq!(renewed, vec![lease_core::RenewOutcome::Renewed]);
                            let info = b.inspect(&names[n]).await.unwrap().expect("held");
                            assert_eq!(info.fencing, Some(fencing));
                            inside[n].fetch_sub(1, SeqCst);
                            assert_eq!(
                                b.release(&names[n], &o.token, Duration::ZERO)
                                    .await
                                    .unwrap(),
                                ReleaseOutcome::Released
                            );
                            held += 1;
                        }
                        AcquireOutcome::Held(_) => tokio::task::yield_now().await,
                    }
                }
                held
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total > 10, "only {total} acquisitions in 3 s");
    eprintln!(
        "transaction pooling: {total} acquisitions by 32 clients over 2 server sessions, no overlap"
    );
}
