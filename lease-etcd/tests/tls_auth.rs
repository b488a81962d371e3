//! TLS, mutual TLS, passwords and a user whose role covers only the lease prefix, on a
//! real etcd, with certificates made at test time. Each test is one cell of the README's
//! "Production connections" table; the CLI runs the same cases in
//! lease-cli/tests/tls_auth.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_conformance::expect::{cycle, expect_auth, expect_tls, owner, unique_name};
use lease_core::{Error, LeaseBackend, TlsFiles};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_test_servers::{EtcdServer, TestCerts};

async fn connect(url: &str, tls: TlsFiles) -> lease_core::Result<EtcdBackend> {
    let (endpoints, mut config) = EtcdConfig::from_url(url)?;
    config.connect_timeout = Duration::from_secs(3);
    config.request_timeout = Duration::from_secs(3);
    if let Some(files) = &config.tls {
        config.tls = Some(files.merged(&tls)?);
    }
    EtcdBackend::connect_endpoints(&endpoints, config).await
}

/// `https://127.0.0.1:PORT` -> `127.0.0.1:PORT`.
fn host_port(https: &str) -> &str {
    https.trim_start_matches("https://")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_and_refuses_a_wrong_ca_and_a_wrong_host() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let (_server, https) = EtcdServer::start_local_tls(&certs, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let at = host_port(&https);
    let ca = TlsFiles::default().with_ca(&certs.ca);
    let url = format!("etcds://{at}/tls");

    cycle(&connect(&url, ca.clone()).await.unwrap()).await;
    cycle(
        &connect(
            &format!("{url}?tls_ca={}", certs.ca.display()),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    expect_tls(
        connect(&url, TlsFiles::default().with_ca(&certs.other_ca)).await,
        "not signed by a CA you trust",
    );
    expect_tls(
        connect(&url, TlsFiles::default()).await,
        "not signed by a CA you trust",
    );
    let port = at.rsplit(':').next().unwrap();
    expect_tls(
        connect(&format!("etcds://localhost:{port}/tls"), ca.clone()).await,
        "not valid for the host name",
    );
    // TLS files with a plain etcd:// URL: a usage error.
    let e = connect(
        &format!("etcd://{at}/tls?tls_ca=x.pem"),
        TlsFiles::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate_the_server_trusts() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let (_server, https) = EtcdServer::start_local_tls(&certs, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("etcds://{}/tls", host_port(&https));
    let ca = TlsFiles::default().with_ca(&certs.ca);

    cycle(
        &connect(
            &url,
            ca.clone()
                .with_client(&certs.client_cert, &certs.client_key),
        )
        .await
        .unwrap(),
    )
    .await;
    expect_tls(
        connect(&url, ca.clone()).await,
        "requires a client certificate",
    );
    expect_tls(
        connect(
            &url,
            ca.with_client(&certs.stranger_cert, &certs.stranger_key),
        )
        .await,
        "refused the client certificate",
    );
}

/// Turns authentication on with `root` (password `root-pw`) and a user `leaser`
/// (password `user-pw`) whose only role may read and write keys under `prefix/`.
async fn enable_auth(endpoints: Vec<String>, prefix: &str) {
    let mut raw = etcd_client::Client::connect(endpoints, None).await.unwrap();
    raw.user_add("root", "root-pw", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.role_add("lease-rw").await.unwrap();
    let range_end = etcd_client::Permission::read_write(format!("{prefix}/")).with_prefix();
    raw.role_grant_permission("lease-rw", range_end)
        .await
        .unwrap();
    raw.user_add("leaser", "user-pw", None).await.unwrap();
    raw.user_grant_role("leaser", "lease-rw").await.unwrap();
    raw.auth_enable().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password() {
    let server = EtcdServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    enable_auth(server.endpoints(), "app").await;
    let at = server.endpoints()[0]
        .trim_start_matches("http://")
        .to_owned();
    cycle(
        &connect(
            &format!("etcd://root:root-pw@{at}/app"),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    expect_auth(
        connect(
            &format!("etcd://root:wrong-pw@{at}/app"),
            TlsFiles::default(),
        )
        .await,
        "refused the credentials",
        "wrong-pw",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_the_lease_prefix() {
    let server = EtcdServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    enable_auth(server.endpoints(), "app").await;
    let at = server.endpoints()[0]
        .trim_start_matches("http://")
        .to_owned();
    let backend = connect(
        &format!("etcd://leaser:user-pw@{at}/app"),
        TlsFiles::default(),
    )
    .await
    .unwrap();
    cycle(&backend).await;
    // Notification of a release (a watch on the prefix) works with the role.
    let holder = owner("tls-test");
    let n = unique_name("tls");
    backend
        .acquire(&n, &holder, Duration::from_secs(10))
        .await
        .unwrap();
    let waiter = backend.clone();
    let n2 = n.clone();
    let wait = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        waiter
            .wait_released(&n2, Duration::from_secs(5))
            .await
            .unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    backend
        .release(&n, &holder.token, Duration::ZERO)
        .await
        .unwrap();
    let waited = wait.await.unwrap();
    assert!(waited < Duration::from_secs(4), "woken after {waited:?}");
    // Outside its prefix: permission denied (rejected, not retryable).
    let outside = connect(
        &format!("etcd://leaser:user-pw@{at}/other"),
        TlsFiles::default(),
    )
    .await;
    let e = match outside {
        Ok(b) => b
            .acquire(
                &unique_name("tls"),
                &owner("tls-test"),
                Duration::from_secs(10),
            )
            .await
            .map(|_| ())
            .unwrap_err(),
        Err(e) => e,
    };
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
    assert!(e.to_string().contains("permission denied"), "{e}");
    expect_auth(
        connect(
            &format!("etcd://leaser:not-it@{at}/app"),
            TlsFiles::default(),
        )
        .await,
        "refused the credentials",
        "not-it",
    );
}
