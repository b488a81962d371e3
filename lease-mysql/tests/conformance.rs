//! The conformance suite against a real MariaDB: each check gets a fresh database on the
//! test binary's shared server (a container, or a throwaway local `mariadbd`), or the server of
//! `LEASE_TEST_MYSQL_URL` with a table of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Fixture;
use lease_mysql::{MysqlBackend, MysqlConfig};
use lease_test_servers::mariadb::MariaDbServer;

async fn table() -> Fixture {
    let db = MariaDbServer::shared().await.expect("mariadb test server");
    let config = MysqlConfig::default()
        .with_table(format!("lease_{}", uuid::Uuid::new_v4().simple()))
        .with_request_timeout(Duration::from_secs(5))
        .with_max_connections(20);
    let backend = MysqlBackend::connect_with(&db.url(), config)
        .await
        .expect("connect");
    Fixture::new(Arc::new(backend)).keep(db)
}

lease_conformance::conformance_suite!(table);
