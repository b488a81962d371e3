//! The table mode's whole conformance suite over TLS (`verify-full`) with client
//! certificate authentication, as a role that may only SELECT, INSERT, UPDATE and DELETE
//! on the lock table: what a production deployment runs. One server for the test binary,
//! a fresh database per check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;
use std::sync::Arc;

use lease_conformance::Fixture;
use lease_core::{LeaseBackend, TlsFiles};
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_test_servers::{PostgresServer, TestCerts};

/// The server, and the client's TLS files (copied into the server's directory, which is
/// removed with it).
struct Secure {
    server: PostgresServer,
    tls: TlsFiles,
}

static SECURE: tokio::sync::OnceCell<Secure> = tokio::sync::OnceCell::const_new();

async fn secure() -> &'static Secure {
    SECURE
        .get_or_init(|| async {
            let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
            let server = PostgresServer::start_fast()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            server
                .enable_tls(
                    &certs,
                    &[
                        "hostssl all lease_client 127.0.0.1/32 cert",
                        "host all lease_client 127.0.0.1/32 reject",
                    ],
                )
                .unwrap_or_else(|e| panic!("{e}"));
            server
                .sql("postgres", "CREATE ROLE lease_client LOGIN")
                .unwrap_or_else(|e| panic!("{e}"));
            let dir = server.dir().unwrap().to_owned();
            let keep = |from: &PathBuf, name: &str| {
                let to = dir.join(name);
                std::fs::copy(from, &to).unwrap();
                to
            };
            let tls = TlsFiles::default()
                .with_ca(keep(&certs.ca, "client-ca.pem"))
                .with_client(
                    keep(&certs.client_cert, "client.pem"),
                    keep(&certs.client_key, "client.key"),
                );
            Secure { server, tls }
        })
        .await
}

async fn secure_table_mode() -> Fixture {
    let s = secure().await;
    let url = s.server.create_database().unwrap_or_else(|e| panic!("{e}"));
    let database = url
        .rsplit('/')
        .next()
        .and_then(|d| d.split('?').next())
        .unwrap()
        .to_owned();
    let ddl = lease_postgres::schema_sql("lease_locks").unwrap();
    for sql in [
        ddl.as_str(),
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.lease_locks TO lease_client",
    ] {
        s.server
            .sql(&database, sql)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let port = s.server.port().unwrap();
    let config = PostgresConfig::default()
        .with_tls(s.tls.clone())
        .with_max_connections(16);
    let backend = PostgresBackend::connect_with(
        &format!("postgres://lease_client@127.0.0.1:{port}/{database}?sslmode=verify-full"),
        config,
    )
    .await
    .expect("connect over TLS with a client certificate, as a least-privilege role");
    // Open the pool's connections now: the checks time calls against TTLs of a few
    // hundred milliseconds, and a TLS connection made inside a call (a handshake, and
    // sqlx reading the system's trust store for each new connection) took more than the
    // 125 ms such a check leaves a call when all 43 checks started at once (seen once in
    // a full run: an acquire past its 200 ms timeout).
    let probe = lease_core::LeaseName::new("warm-up").unwrap();
    let warm = (0..8).map(|_| backend.inspect(&probe));
    for r in futures::future::join_all(warm).await {
        r.expect("warm-up");
    }
    Fixture::new(Arc::new(backend))
}

lease_conformance::conformance_suite!(secure_table_mode);
