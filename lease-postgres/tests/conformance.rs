//! The conformance suite against a real Postgres: the table mode, and the advisory-lock
//! mode. Each check gets a fresh database on the test binary's shared server (see
//! `lease_test_servers::postgres`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failures are assertions

use std::sync::Arc;

use lease_conformance::Fixture;
use lease_postgres::{AdvisoryLockBackend, PostgresBackend, PostgresConfig};
use lease_test_servers::postgres::PostgresServer;

async fn table_mode() -> Fixture {
    let db = PostgresServer::shared()
        .await
        .expect("postgres test server");
    // A table of its own too, so that the checks also isolate on a server from
    // LEASE_TEST_POSTGRES_URL (where no database is created per check).
    let config = PostgresConfig::default()
        .with_table(format!("lease_{}", uuid::Uuid::new_v4().simple()))
        .with_max_connections(16);
    let backend = PostgresBackend::connect_with(&db.url(), config)
        .await
        .expect("connect");
    Fixture::new(Arc::new(backend)).keep(db)
}

lease_conformance::conformance_suite!(table_mode);

/// The advisory-lock mode (no TTL, no lead time, no fencing, no keep-for): the whole
/// suite; checks that need a capability it lacks skip themselves, and the lead-time checks
/// report themselves not applicable (a line on standard error).
mod advisory {
    use super::*;

    async fn advisory_mode() -> Fixture {
        let db = PostgresServer::shared()
            .await
            .expect("postgres test server");
        let backend = AdvisoryLockBackend::connect(&db.url())
            .await
            .expect("connect");
        Fixture::new(Arc::new(backend)).keep(db)
    }

    lease_conformance::conformance_suite!(advisory_mode);
}

/// The advisory-lock mode with a session limit (`set_max_sessions`), as sqlx's pool
/// bounds `PgAdvisoryLock`: the whole suite. The limit is the most leases the suite
/// holds at once (`heartbeat_batches_renewals` holds 200; with a limit of 8 it and
/// `names_do_not_collide` time out waiting for a session, as the limit says they must).
/// Attempts queuing at the limit are shown by `postgres_specific`'s
/// `advisory_session_limit_*` tests.
mod advisory_limited {
    use super::*;

    async fn advisory_mode_limited() -> Fixture {
        let db = PostgresServer::shared()
            .await
            .expect("postgres test server");
        let mut backend = AdvisoryLockBackend::connect(&db.url())
            .await
            .expect("connect");
        backend.set_max_sessions(200).expect("session limit");
        Fixture::new(Arc::new(backend)).keep(db)
    }

    lease_conformance::conformance_suite!(advisory_mode_limited);
}

/// The advisory-lock mode with leases sharing sessions (`set_shared_sessions`): the whole
/// suite on at most 3 sessions, so that every check holds several leases on one session
/// (`heartbeat_batches_renewals` holds 200 on them).
mod advisory_shared {
    use super::*;

    async fn advisory_mode_shared() -> Fixture {
        let db = PostgresServer::shared()
            .await
            .expect("postgres test server");
        let mut backend = AdvisoryLockBackend::connect(&db.url())
            .await
            .expect("connect");
        backend.set_shared_sessions(3).expect("shared sessions");
        Fixture::new(Arc::new(backend)).keep(db)
    }

    lease_conformance::conformance_suite!(advisory_mode_shared);
}

/// The table mode behind a real PgBouncer in transaction pooling mode
/// (`pooler=transaction`): the whole suite; checks that need release notification
/// (off behind a transaction pooler) skip themselves.
mod through_pgbouncer {
    use super::*;
    use lease_core::LeaseBackend;
    use lease_test_servers::{PgBouncer, PoolMode};

    static BOUNCER: tokio::sync::OnceCell<Option<PgBouncer>> = tokio::sync::OnceCell::const_new();

    async fn pooled_table_mode() -> Fixture {
        let db = PostgresServer::shared()
            .await
            .expect("postgres test server");
        let Some(port) = db.port() else {
            // A server from LEASE_TEST_POSTGRES_URL: no local server to put PgBouncer in
            // front of; run against it directly.
            return table_mode().await;
        };
        let bouncer = BOUNCER
            .get_or_init(|| async move {
                Some(
                    PgBouncer::start(port, PoolMode::Transaction, 8, false)
                        .await
                        .unwrap_or_else(|e| panic!("{e}")),
                )
            })
            .await
            .as_ref()
            .expect("pgbouncer");
        let url = format!(
            "{}&pooler=transaction",
            bouncer.url(db.name().expect("a database of its own"))
        );
        let config = PostgresConfig::default()
            .with_table(format!("lease_{}", uuid::Uuid::new_v4().simple()))
            .with_max_connections(16);
        let backend = PostgresBackend::connect_with(&url, config)
            .await
            .expect("connect through pgbouncer");
        assert!(!backend.capabilities().release_notification);
        Fixture::new(Arc::new(backend)).keep(db)
    }

    lease_conformance::conformance_suite!(pooled_table_mode);
}
