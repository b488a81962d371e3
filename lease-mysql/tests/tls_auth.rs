//! TLS and authentication on a real MariaDB server that accepts TLS with the harness's
//! test certificates (`TestCerts`: a server certificate for `IP:127.0.0.1` only, a client
//! certificate with the common name `lease_client`, and an unrelated CA). Each case says
//! which typed error a user gets, and whether a retry may help.
//!
//! Users: `lease_client` (`REQUIRE SUBJECT '/CN=lease_client'`, no password: the client
//! certificate is the credential), `lease_app` (a password, `REQUIRE SSL`), each with
//! only `SELECT, INSERT, UPDATE` on the lock table of a database of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::{Path, PathBuf};
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, HolderLabel, LeaseBackend, LeaseName, Owner, ReleaseOutcome, TlsFiles,
};
use lease_mysql::{MysqlBackend, MysqlConfig};
use lease_test_servers::{MariaDbServer, TestCerts};

struct Secure {
    server: MariaDbServer,
    certs: TestCerts,
    port: u16,
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
                .sql(
                    "CREATE USER 'lease_client'@'%' REQUIRE SUBJECT '/CN=lease_client'; \
                     CREATE USER 'lease_app'@'%' IDENTIFIED BY 'app-secret' REQUIRE SSL;",
                )
                .unwrap_or_else(|e| panic!("{e}"));
            let port = server.port().unwrap();
            Secure {
                server,
                certs,
                port,
            }
        })
        .await
}

/// A fresh database with the lock table, on which both users may only read and write.
fn database(s: &Secure) -> String {
    let db = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let ddl = lease_mysql::schema_sql(&format!("{db}.lease_locks")).unwrap();
    s.server
        .sql(&format!(
            "CREATE DATABASE {db}; {ddl}; \
             GRANT SELECT, INSERT, UPDATE ON {db}.lease_locks TO 'lease_client'@'%', 'lease_app'@'%';"
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    db
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn config(tls: TlsFiles) -> MysqlConfig {
    MysqlConfig::default()
        .with_tls(tls)
        .with_request_timeout(Duration::from_secs(5))
}

/// One acquire and release, and the session's TLS version as the server reports it.
async fn round(backend: &MysqlBackend) -> String {
    let name = LeaseName::new("tls-round").unwrap();
    let owner = Owner::new(HolderLabel::new("tls-test").unwrap());
    match backend
        .acquire(&name, &owner, Duration::from_secs(5))
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired { .. } => {}
        AcquireOutcome::Held(by) => panic!("held by {by}"),
    }
    assert_eq!(
        backend
            .release(&name, &owner.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
    let (_, version): (String, String) =
        lease_mysql::sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'")
            .fetch_one(backend.pool())
            .await
            .unwrap();
    version
}

fn expect_tls(result: Result<MysqlBackend, Error>, what: &str) -> String {
    match result {
        Err(e @ Error::Tls { .. }) => {
            eprintln!("{what}: {e}");
            assert!(!e.is_retryable(), "{what}: {e} is retryable");
            e.to_string()
        }
        Err(other) => panic!("{what}: expected Error::Tls, got {other:?}"),
        Ok(_) => panic!("{what}: connected"),
    }
}

fn expect_auth(result: Result<MysqlBackend, Error>, what: &str) -> String {
    match result {
        Err(e @ Error::Auth { .. }) => {
            eprintln!("{what}: {e}");
            assert!(!e.is_retryable(), "{what}: {e} is retryable");
            e.to_string()
        }
        Err(other) => panic!("{what}: expected Error::Auth, got {other:?}"),
        Ok(_) => panic!("{what}: connected"),
    }
}

#[tokio::test]
async fn client_certificate_as_the_credential_with_verify_identity() {
    let s = secure().await;
    let db = database(s);
    // The files in the config, no ssl-mode in the URL: VERIFY_IDENTITY.
    let tls = TlsFiles::default()
        .with_ca(&s.certs.ca)
        .with_client(&s.certs.client_cert, &s.certs.client_key);
    let backend = MysqlBackend::connect_with(
        &format!("mysql://lease_client@127.0.0.1:{}/{db}", s.port),
        config(tls),
    )
    .await
    .expect("mutual TLS as a least-privilege user");
    let version = round(&backend).await;
    assert!(version.starts_with("TLSv1."), "Ssl_version {version:?}");
}

#[tokio::test]
async fn tls_files_in_the_url() {
    let s = secure().await;
    let db = database(s);
    let url = format!(
        "mysql://lease_app:app-secret@127.0.0.1:{}/{db}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        s.port,
        path(&s.certs.ca)
    );
    let backend = MysqlBackend::connect(&url).await.expect("TLS from the URL");
    assert!(round(&backend).await.starts_with("TLSv1."));
}

#[tokio::test]
async fn a_user_that_needs_tls_connecting_without_it_is_refused_as_auth() {
    let s = secure().await;
    let db = database(s);
    let url = format!(
        "mysql://lease_app:app-secret@127.0.0.1:{}/{db}?ssl-mode=DISABLED",
        s.port
    );
    let text = expect_auth(
        MysqlBackend::connect(&url).await,
        "REQUIRE SSL over plain TCP",
    );
    assert!(!text.contains("app-secret"), "{text}");
    // The certificate user without its certificate.
    let url = format!(
        "mysql://lease_client@127.0.0.1:{}/{db}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        s.port,
        path(&s.certs.ca)
    );
    expect_auth(
        MysqlBackend::connect(&url).await,
        "REQUIRE SUBJECT without a client certificate",
    );
}

#[tokio::test]
async fn wrong_password_over_tls_is_auth_and_never_shows_the_password() {
    let s = secure().await;
    let db = database(s);
    let url = format!(
        "mysql://lease_app:not-the-secret@127.0.0.1:{}/{db}?ssl-ca={}",
        s.port,
        path(&s.certs.ca)
    );
    let err = MysqlBackend::connect(&url).await.expect_err("refused");
    let text = format!("{err} {err:?}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(!text.contains("not-the-secret"), "{text}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_a_tls_error() {
    let s = secure().await;
    let db = database(s);
    let url = format!(
        "mysql://lease_app:app-secret@127.0.0.1:{}/{db}?ssl-mode=VERIFY_CA&ssl-ca={}",
        s.port,
        path(&s.certs.other_ca)
    );
    let text = expect_tls(MysqlBackend::connect(&url).await, "another CA");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_host_name_the_certificate_does_not_name_is_a_tls_error() {
    let s = secure().await;
    let db = database(s);
    // The certificate names IP:127.0.0.1 only.
    let url = format!(
        "mysql://lease_app:app-secret@localhost:{}/{db}?ssl-ca={}",
        s.port,
        path(&s.certs.ca)
    );
    let text = expect_tls(MysqlBackend::connect(&url).await, "host name mismatch");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    // VERIFY_CA does not check the name: the same connection is accepted.
    let url = format!("{url}&ssl-mode=VERIFY_CA");
    let backend = MysqlBackend::connect(&url).await.expect("VERIFY_CA");
    assert!(round(&backend).await.starts_with("TLSv1."));
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let s = secure().await;
    let db = database(s);
    let tls = TlsFiles::default()
        .with_ca(&s.certs.ca)
        .with_client(&s.certs.stranger_cert, &s.certs.stranger_key);
    let result = MysqlBackend::connect_with(
        &format!("mysql://lease_client@127.0.0.1:{}/{db}", s.port),
        config(tls),
    )
    .await;
    match result {
        Err(e @ (Error::Tls { .. } | Error::Auth { .. })) => {
            eprintln!("a stranger's client certificate: {e}");
            assert!(!e.is_retryable(), "{e}");
        }
        Err(other) => panic!("expected Tls or Auth, got {other:?}"),
        Ok(_) => panic!("a stranger's certificate was accepted"),
    }
}

#[tokio::test]
async fn missing_or_malformed_tls_files_are_named_before_connecting() {
    let missing = PathBuf::from("/nonexistent/lease-ca.pem");
    // Port 9 (discard): nothing is sent; the file is checked first.
    let url = format!("mysql://u@127.0.0.1:9/db?ssl-ca={}", path(&missing));
    let text = expect_tls(MysqlBackend::connect(&url).await, "missing CA in the URL");
    assert!(text.contains("/nonexistent/lease-ca.pem"), "{text}");
    let not_pem = tempfile_with(b"not a certificate");
    let text = expect_tls(
        MysqlBackend::connect_with(
            "mysql://u@127.0.0.1:9/db",
            config(TlsFiles::default().with_ca(not_pem.path())),
        )
        .await,
        "a CA that is not PEM",
    );
    assert!(text.contains("not a PEM file"), "{text}");
    let cert_only = TlsFiles {
        cert: Some(missing.clone()),
        ..TlsFiles::default()
    };
    expect_tls(
        MysqlBackend::connect_with("mysql://u@127.0.0.1:9/db", config(cert_only)).await,
        "a certificate without its key",
    );
}

#[tokio::test]
async fn the_same_file_given_twice_differently_is_invalid_input() {
    let result = MysqlBackend::connect_with(
        "mysql://u@127.0.0.1:9/db?ssl-ca=/a.pem",
        config(TlsFiles::default().with_ca("/b.pem")),
    )
    .await;
    assert!(
        matches!(result, Err(Error::InvalidInput(_))),
        "{:?}",
        result.err()
    );
    let result = MysqlBackend::connect("mysql://u@127.0.0.1:9/db?ssl-ca=/a.pem&sslca=/a.pem").await;
    assert!(
        matches!(result, Err(Error::InvalidInput(_))),
        "{:?}",
        result.err()
    );
}

#[tokio::test]
async fn tls_required_of_a_server_without_tls_is_a_tls_error() {
    // The test binary's shared server has no certificate.
    let db = MariaDbServer::shared().await.unwrap();
    let url = format!("{}?ssl-mode=REQUIRED", db.url());
    let text = expect_tls(
        MysqlBackend::connect(&url).await,
        "REQUIRED against a plain server",
    );
    assert!(!text.is_empty());
}

fn tempfile_with(bytes: &[u8]) -> NamedFile {
    let path = std::env::temp_dir().join(format!("lease-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, bytes).unwrap();
    NamedFile(path)
}

struct NamedFile(PathBuf);

impl NamedFile {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for NamedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
