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
    let config = PostgresConfig {
        table: format!("lease_{}", uuid::Uuid::new_v4().simple()),
        max_connections: 16,
        ..PostgresConfig::default()
    };
    let backend = PostgresBackend::connect_with(&db.url(), config)
        .await
        .expect("connect");
    Fixture::new(Arc::new(backend)).keep(db)
}

lease_conformance::conformance_suite!(table_mode);

/// The advisory-lock mode (no TTL, no fencing, no keep-for): the whole suite; checks
/// that need a capability it lacks skip themselves.
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
