//! The whole conformance suite over TLS (`VERIFY_IDENTITY`) with the client certificate as
//! the only credential, as a user that may only SELECT, INSERT and UPDATE on the lock
//! table: what a production deployment runs. One server for the test binary, a fresh
//! database per check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use lease_conformance::Fixture;
use lease_core::{LeaseBackend, TlsFiles};
use lease_mysql::{MysqlBackend, MysqlConfig};
use lease_test_servers::{MariaDbServer, TestCerts};

struct Secure {
    server: MariaDbServer,
    tls: TlsFiles,
    // Removed with the handle: the files must outlive every check.
    _certs: TestCerts,
}

static SECURE: tokio::sync::OnceCell<Secure> = tokio::sync::OnceCell::const_new();

async fn secure() -> &'static Secure {
    SECURE
        .get_or_init(|| async {
            let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
            let server = MariaDbServer::start_tls(&certs)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            server
                .sql("CREATE USER 'lease_client'@'%' REQUIRE SUBJECT '/CN=lease_client'")
                .unwrap_or_else(|e| panic!("{e}"));
            let tls = TlsFiles::default()
                .with_ca(&certs.ca)
                .with_client(&certs.client_cert, &certs.client_key);
            Secure {
                server,
                tls,
                _certs: certs,
            }
        })
        .await
}

async fn secure_mysql() -> Fixture {
    let s = secure().await;
    let db = format!("sec_{}", uuid::Uuid::new_v4().simple());
    let ddl = lease_mysql::schema_sql(&format!("{db}.lease_locks")).unwrap();
    s.server
        .sql(&format!(
            "CREATE DATABASE {db}; {ddl}; \
             GRANT SELECT, INSERT, UPDATE ON {db}.lease_locks TO 'lease_client'@'%';"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let port = s.server.port().unwrap();
    let backend = MysqlBackend::connect_with(
        &format!("mysql://lease_client@127.0.0.1:{port}/{db}"),
        MysqlConfig::default()
            .with_tls(s.tls.clone())
            .with_max_connections(16)
            .with_create_table(false),
    )
    .await
    .expect("connect over TLS with a client certificate, as a least-privilege user");
    // Open the pool's connections now: the checks time calls against TTLs of a few
    // hundred milliseconds, and a TLS handshake inside a call would count against them
    // (as the PostgreSQL secure suite found).
    let probe = lease_core::LeaseName::new("warm-up").unwrap();
    let warm = (0..8).map(|_| backend.inspect(&probe));
    for r in futures::future::join_all(warm).await {
        r.expect("warm-up");
    }
    Fixture::new(Arc::new(backend))
}

lease_conformance::conformance_suite!(secure_mysql);
