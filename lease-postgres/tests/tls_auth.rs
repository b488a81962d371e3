//! TLS (libpq's sslmode values), client certificates, SCRAM passwords and least-privilege
//! roles on a real PostgreSQL server, with certificates made at test time. Each test is
//! one cell of the README's "Production connections" table; the CLI runs the same cases
//! (and PGPASSWORD and ~/.pgpass) in lease-cli/tests/tls_auth.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_conformance::expect::{cycle, expect_auth, expect_tls, owner, unique_name};
use lease_core::{AcquireOutcome, Error, LeaseBackend, TlsFiles};
use lease_postgres::{PostgresBackend, PostgresConfig};
use lease_test_servers::{PostgresServer, TestCerts};

async fn connect(url: &str, tls: TlsFiles) -> lease_core::Result<PostgresBackend> {
    let config = PostgresConfig::default()
        .with_tls(tls)
        .with_request_timeout(Duration::from_secs(3));
    PostgresBackend::connect_with(url, config).await
}

/// A server with TLS on and these rules: `lease_client` only over TLS with a client
/// certificate; everyone else (but the harness's own `postgres`) with a SCRAM password.
/// The lock table exists (created by `postgres`), and `lease_app` (password `app-pw`)
/// may only SELECT, INSERT, UPDATE and DELETE on it.
async fn secure_server(certs: &TestCerts) -> PostgresServer {
    let server = PostgresServer::start_fast()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    server
        .enable_tls(
            certs,
            &[
                "hostssl all lease_client 127.0.0.1/32 cert",
                "host all lease_client 127.0.0.1/32 reject",
                "host all all 127.0.0.1/32 scram-sha-256",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let ddl = lease_postgres::schema_sql("lease_locks").unwrap();
    for sql in [
        ddl.as_str(),
        "CREATE ROLE lease_app LOGIN PASSWORD 'app-pw'",
        "CREATE ROLE lease_client LOGIN",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.lease_locks TO lease_app, lease_client",
    ] {
        server
            .sql("postgres", sql)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    server
}

fn url(role: &str, host: &str, port: u16, params: &str) -> String {
    format!("postgres://{role}@{host}:{port}/postgres?{params}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sslmodes_wrong_ca_and_host_name() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let server = secure_server(&certs).await;
    let port = server.port().unwrap();
    let ca = certs.ca.display().to_string();
    let app = |host: &str, params: &str| url("lease_app:app-pw", host, port, params);

    // verify-full with the right CA, from the URL and from the config.
    cycle(
        &connect(
            &app(
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    // A CA file given and no sslmode: verify-full.
    cycle(
        &connect(
            &app("127.0.0.1", ""),
            TlsFiles::default().with_ca(&certs.ca),
        )
        .await
        .unwrap(),
    )
    .await;
    // require: encrypted, the certificate not checked (libpq's meaning).
    cycle(
        &connect(&app("127.0.0.1", "sslmode=require"), TlsFiles::default())
            .await
            .unwrap(),
    )
    .await;
    // Another CA: refused under verify-ca and verify-full.
    let other = certs.other_ca.display().to_string();
    for mode in ["verify-ca", "verify-full"] {
        expect_tls(
            connect(
                &app("127.0.0.1", &format!("sslmode={mode}&sslrootcert={other}")),
                TlsFiles::default(),
            )
            .await,
            "not signed by a CA you trust",
        );
    }
    // The certificate is for 127.0.0.1 only: `localhost` fails verify-full, passes
    // verify-ca (which checks the CA, not the name).
    expect_tls(
        connect(
            &app(
                "localhost",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            TlsFiles::default(),
        )
        .await,
        "not valid for the host name",
    );
    cycle(
        &connect(
            &app("localhost", &format!("sslmode=verify-ca&sslrootcert={ca}")),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    // A CA file that is not there: named.
    let missing = certs.dir().join("missing-ca.pem");
    expect_tls(
        connect(&app("127.0.0.1", ""), TlsFiles::default().with_ca(&missing)).await,
        "missing-ca.pem",
    );
    // TLS required of a server that has it off: a TLS error, not "unreachable".
    let plain = PostgresServer::start_fast()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    expect_tls(
        connect(
            &url(
                "postgres",
                "127.0.0.1",
                plain.port().unwrap(),
                "sslmode=require",
            ),
            TlsFiles::default(),
        )
        .await,
        "does not accept TLS",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_client_certificate_authentication() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let server = secure_server(&certs).await;
    let port = server.port().unwrap();
    let client = |params: &str| url(TestCerts::CLIENT_CN, "127.0.0.1", port, params);
    let ca = TlsFiles::default().with_ca(&certs.ca);

    // The client certificate (its common name is the role): in, as config fields and as
    // libpq's URL parameters.
    cycle(
        &connect(
            &client(""),
            ca.clone()
                .with_client(&certs.client_cert, &certs.client_key),
        )
        .await
        .unwrap(),
    )
    .await;
    cycle(
        &connect(
            &client(&format!(
                "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
                certs.ca.display(),
                certs.client_cert.display(),
                certs.client_key.display()
            )),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    // No client certificate: the server refuses the login (28000).
    expect_auth(
        connect(&client(""), ca.clone()).await,
        "certificate",
        "no secret",
    );
    // A certificate from a CA the server does not trust: refused in the handshake.
    expect_tls(
        connect(
            &client(""),
            ca.with_client(&certs.stranger_cert, &certs.stranger_key),
        )
        .await,
        "refused the client certificate",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_password() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let server = secure_server(&certs).await;
    let port = server.port().unwrap();
    let rows = server
        .sql(
            "postgres",
            "SELECT left(rolpassword, 13) FROM pg_authid WHERE rolname = 'lease_app'",
        )
        .unwrap();
    assert_eq!(rows[0][0].as_deref(), Some("SCRAM-SHA-256"));
    cycle(
        &connect(
            &url("lease_app:app-pw", "127.0.0.1", port, "sslmode=disable"),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    expect_auth(
        connect(
            &url("lease_app:wrong-pw", "127.0.0.1", port, "sslmode=disable"),
            TlsFiles::default(),
        )
        .await,
        "password authentication failed",
        "wrong-pw",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_role_and_schema_qualified_table() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let server = secure_server(&certs).await;
    let port = server.port().unwrap();
    let app = |params: &str| url("lease_app:app-pw", "127.0.0.1", port, params);

    // The role may not create anything; the table exists: creation is skipped (the
    // default), or turned off.
    let denied = server.sql(
        "postgres",
        "SELECT has_schema_privilege('lease_app', 'public', 'CREATE')",
    );
    assert_eq!(denied.unwrap()[0][0].as_deref(), Some("f"));
    let backend = connect(&app("sslmode=disable"), TlsFiles::default())
        .await
        .unwrap();
    cycle(&backend).await;
    cycle(
        &connect(
            &app("sslmode=disable&create_table=false"),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    // A missing table it may not create: rejected, naming the privilege.
    let e = connect(&app("sslmode=disable&table=nope"), TlsFiles::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
    assert!(e.to_string().contains("permission denied"), "{e}");

    // A schema-qualified table in a schema of its own.
    for sql in [
        "CREATE SCHEMA ops",
        &lease_postgres::schema_sql("ops.leases").unwrap(),
        "GRANT USAGE ON SCHEMA ops TO lease_app",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ops.leases TO lease_app",
    ] {
        server
            .sql("postgres", sql)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let ops = connect(
        &app("sslmode=disable&table=ops.leases"),
        TlsFiles::default(),
    )
    .await
    .unwrap();
    assert_eq!(ops.table(), "ops.leases");
    cycle(&ops).await;

    // A role with a schema of its own name has it first on its default search_path
    // ("$user", public). An unqualified table name must still mean public.lease_locks:
    // otherwise this role would create and use a table of its own, and hold a lease that
    // everyone else holds too.
    for sql in [
        "CREATE ROLE alice LOGIN PASSWORD 'alice-pw'",
        "CREATE SCHEMA alice AUTHORIZATION alice",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.lease_locks TO alice",
    ] {
        server
            .sql("postgres", sql)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let alice = connect(
        &url("alice:alice-pw", "127.0.0.1", port, "sslmode=disable"),
        TlsFiles::default(),
    )
    .await
    .unwrap();
    assert_eq!(alice.table(), "public.lease_locks");
    let n = unique_name("tls");
    let holder = owner("tls-test");
    assert!(matches!(
        backend
            .acquire(&n, &holder, Duration::from_secs(10))
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert!(
        matches!(
            alice
                .acquire(&n, &owner("tls-test"), Duration::from_secs(10))
                .await
                .unwrap(),
            AcquireOutcome::Held(_)
        ),
        "a role with its own schema first on the search_path took a held lease"
    );
    let tables = server
        .sql(
            "postgres",
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'alice'",
        )
        .unwrap();
    assert_eq!(tables[0][0].as_deref(), Some("0"));
}
