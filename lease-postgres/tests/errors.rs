//! The error mapping over real error replies: each row puts a real PostgreSQL server (and
//! PgBouncer) into a state that makes it answer with one SQLSTATE, sends a lease call,
//! and checks the kind of error the caller gets and whether it says a retry may help.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{Error, HolderLabel, LeaseBackend, LeaseName, Owner};
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_test_servers::postgres::PostgresServer;
use lease_test_servers::{PgBouncer, PoolMode};

fn owner() -> Owner {
    Owner::new(HolderLabel::new("errors").unwrap())
}

fn name() -> LeaseName {
    LeaseName::new(format!("errors-{}", uuid::Uuid::new_v4().simple())).unwrap()
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Kind {
    Rejected,
    Auth,
    Transient,
    Unavailable,
    Timeout,
}

fn kind(e: &Error) -> Option<Kind> {
    match e {
        Error::Rejected { .. } => Some(Kind::Rejected),
        Error::Auth { .. } => Some(Kind::Auth),
        Error::Backend {
            retryable: true, ..
        } => Some(Kind::Transient),
        Error::Unavailable { .. } => Some(Kind::Unavailable),
        Error::Timeout { .. } => Some(Kind::Timeout),
        _ => None,
    }
}

fn check<T: std::fmt::Debug>(
    table: &mut Vec<String>,
    what: &str,
    says: &str,
    r: lease_core::Result<T>,
    want: Kind,
) {
    let e = match r {
        Err(e) => e,
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
    };
    assert_eq!(kind(&e), Some(want), "{what}: {e:?}");
    assert_eq!(
        e.is_retryable(),
        !matches!(want, Kind::Rejected | Kind::Auth),
        "{what}: {e}"
    );
    assert!(e.to_string().contains(says), "{what}: {e}");
    table.push(format!(
        "| {what} | {want:?} | {} | {e} |",
        e.is_retryable()
    ));
}

fn config(create_table: bool) -> PostgresConfig {
    PostgresConfig::default()
        .with_create_table(create_table)
        .with_request_timeout(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_error_replies_map_to_typed_errors() {
    let db = PostgresServer::shared().await.unwrap();
    let (Some(port), Some(dbname)) = (db.port(), db.name().map(str::to_owned)) else {
        eprintln!("skipped: needs the local shared server (it creates roles)");
        return;
    };
    let url_as = |role: &str, database: &str| {
        format!("postgres://{role}@127.0.0.1:{port}/{database}?sslmode=disable")
    };
    let ttl = Duration::from_secs(30);
    let mut table = Vec::new();
    let tag = uuid::Uuid::new_v4().simple().to_string();

    // 3D000: no such database.
    check(
        &mut table,
        "3D000 invalid_catalog_name (no such database)",
        "does not exist",
        PostgresBackend::connect_with(&url_as("postgres", &format!("nodb_{tag}")), config(true))
            .await,
        Kind::Rejected,
    );

    // 28000: a role that may not log in.
    let nologin = format!("nologin_{tag}");
    db.sql(&format!("CREATE ROLE {nologin} NOLOGIN")).unwrap();
    check(
        &mut table,
        "28000 invalid_authorization_specification (role may not log in)",
        "not permitted to log in",
        PostgresBackend::connect_with(&url_as(&nologin, &dbname), config(true)).await,
        Kind::Auth,
    );

    // 53300: too many connections for the role. The pool (sqlx) counts it as a refusal
    // worth retrying and keeps trying until the call timeout: unavailable, retryable, and
    // the message no longer names the SQLSTATE.
    let capped = format!("capped_{tag}");
    db.sql(&format!("CREATE ROLE {capped} LOGIN CONNECTION LIMIT 0"))
        .unwrap();
    check(
        &mut table,
        "53300 too_many_connections (at connect)",
        "unreachable",
        PostgresBackend::connect_with(&url_as(&capped, &dbname), config(true)).await,
        Kind::Unavailable,
    );

    // 42501: a role without privileges on the lock table.
    let owner_backend = PostgresBackend::connect(&db.url()).await.unwrap();
    let reader = format!("reader_{tag}");
    db.sql(&format!("CREATE ROLE {reader} LOGIN")).unwrap();
    let unprivileged = PostgresBackend::connect_with(&url_as(&reader, &dbname), config(false))
        .await
        .unwrap();
    check(
        &mut table,
        "42501 insufficient_privilege",
        "permission denied",
        unprivileged.acquire(&name(), &owner(), ttl).await,
        Kind::Rejected,
    );
    drop(owner_backend);

    // 25006: a read-only database (as a hot standby answers).
    let ro = PostgresBackend::connect(&db.url()).await.unwrap();
    db.sql(&format!(
        "ALTER DATABASE {dbname} SET default_transaction_read_only = on"
    ))
    .unwrap();
    let ro_fresh = PostgresBackend::connect_with(&db.url(), config(false))
        .await
        .unwrap();
    check(
        &mut table,
        "25006 read_only_sql_transaction",
        "read-only",
        ro_fresh.acquire(&name(), &owner(), ttl).await,
        Kind::Rejected,
    );
    db.sql(&format!(
        "BEGIN READ WRITE; ALTER DATABASE {dbname} SET default_transaction_read_only = off; COMMIT"
    ))
    .unwrap();
    drop(ro_fresh);

    // 57P01: the server ends the backend's sessions (an administrator, a failover tool).
    // An acquire on such a pooled connection fails (it is not sent again: it may have
    // taken the lease, which the client's cleanup then releases by owner token).
    let n = name();
    ro.acquire(&n, &owner(), ttl).await.unwrap();
    let terminate = || {
        db.sql(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
        ))
        .unwrap();
    };
    terminate();
    tokio::time::sleep(Duration::from_millis(100)).await;
    check(
        &mut table,
        "57P01 admin_shutdown (session terminated), acquire",
        "terminating connection",
        ro.acquire(&name(), &owner(), ttl).await,
        Kind::Unavailable,
    );
    // Calls that are safe to repeat are sent again on another connection: with every
    // pooled session terminated, inspect and renew still answer at the first call.
    ro.inspect(&n).await.unwrap();
    terminate();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(ro.inspect(&n).await.unwrap().is_some());
    terminate();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let renewed = ro
        .renew(
            &[lease_core::RenewItem {
                name: n.clone(),
                token: owner().token,
            }],
            ttl,
        )
        .await
        .unwrap();
    assert_eq!(renewed, vec![lease_core::RenewOutcome::Lost]);

    // 57014: statement_timeout (the row locked by another open transaction).
    let quick = PostgresBackend::connect_with(
        &db.url(),
        PostgresConfig::default().with_request_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let n = name();
    quick
        .acquire(&n, &owner(), Duration::from_millis(1))
        .await
        .unwrap();
    let url = db.url();
    let table_name = quick.table().to_owned();
    let locker = std::thread::spawn(move || {
        // psql holds the row lock for 2 s in an open transaction.
        let _ = std::process::Command::new("psql")
            .arg(&url)
            .arg("-c")
            .arg(format!(
                "BEGIN; SELECT 1 FROM {table_name} FOR UPDATE; SELECT pg_sleep(2); COMMIT;"
            ))
            .output();
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(
        &mut table,
        "57014 query_canceled (statement_timeout)",
        "timed out",
        quick.acquire(&n, &owner(), ttl).await,
        Kind::Timeout,
    );
    let _ = locker.join();

    // 08P01 from PgBouncer: a startup parameter it does not accept.
    let pgb = PgBouncer::start(port, PoolMode::Transaction, 2, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    check(
        &mut table,
        "08P01 protocol_violation from PgBouncer (unsupported startup parameter)",
        "pooler=transaction",
        PostgresBackend::connect(&pgb.url(&dbname)).await,
        Kind::Rejected,
    );

    eprintln!(
        "| SQLSTATE | kind | retryable | error |\n|---|---|---|---|\n{}",
        table.join("\n")
    );
}
