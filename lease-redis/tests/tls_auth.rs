//! TLS, mutual TLS, passwords and ACL users on a real redis-server, with certificates
//! made at test time. Each test is one cell of the README's "Production connections"
//! table; the CLI runs the same cases in lease-cli/tests/tls_auth.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{Error, HolderLabel, LeaseBackend, Owner, TlsFiles};
use lease_redis::{RedisBackend, RedisConfig};
use lease_test_servers::redis::{LEASE_USER_ACL, tls_args};
use lease_test_servers::{RedisServer, TestCerts, free_port};
mod common;
use common::admin;
use lease_conformance::expect::{cycle, expect_auth, expect_tls, unique_name};

async fn connect(url: &str, tls: TlsFiles) -> lease_core::Result<RedisBackend> {
    let config = RedisConfig::default()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(3));
    RedisBackend::connect_with(url, config).await
}

/// A redis-server with a plain port and a TLS port (client certificates required when
/// `mtls`); returns it and the TLS port.
async fn tls_server(certs: &TestCerts, mtls: bool) -> (RedisServer, u16) {
    let tls_port = free_port().unwrap();
    let server = RedisServer::start_local_with_args(tls_args(
        certs,
        tls_port,
        if mtls { "yes" } else { "no" },
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    (server, tls_port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_and_refuses_a_wrong_ca_a_wrong_host_and_a_plain_port() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let (server, port) = tls_server(&certs, false).await;
    let ca = TlsFiles::default().with_ca(&certs.ca);

    // The CA that signed the server's certificate: works, as a config field and as a
    // URL parameter.
    let url = format!("rediss://127.0.0.1:{port}/");
    cycle(&connect(&url, ca.clone()).await.unwrap()).await;
    let in_url = format!("{url}?tls_ca={}", certs.ca.display());
    cycle(&connect(&in_url, TlsFiles::default()).await.unwrap()).await;

    // Another CA, or the system's trust store: refused, naming the check.
    let other = TlsFiles::default().with_ca(&certs.other_ca);
    expect_tls(connect(&url, other).await, "not signed by a CA you trust");
    expect_tls(
        connect(&url, TlsFiles::default()).await,
        "not signed by a CA you trust",
    );
    // The certificate is for 127.0.0.1 only: `localhost` is a host-name mismatch.
    expect_tls(
        connect(&format!("rediss://localhost:{port}/"), ca.clone()).await,
        "not valid for the host name",
    );
    // TLS to the plain port: redis-server reads the TLS hello as the start of an inline
    // command and waits for the rest of the line, so nothing comes back; the backend
    // then finds that the port answers a plain PING.
    let plain = server.port().unwrap();
    expect_tls(
        connect(&format!("rediss://127.0.0.1:{plain}/"), ca.clone()).await,
        "speaks plain text",
    );
    // A missing CA file: named, before anything is sent.
    let missing = certs.dir().join("nope.pem");
    expect_tls(
        connect(&url, TlsFiles::default().with_ca(&missing)).await,
        "nope.pem",
    );
    // TLS files with a plain redis:// URL: a usage error, not a silent plain connection.
    let e = connect(&format!("redis://127.0.0.1:{plain}/"), ca)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate_the_server_trusts() {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let (_server, port) = tls_server(&certs, true).await;
    let url = format!("rediss://127.0.0.1:{port}/");
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
    let in_url = format!(
        "{url}?tls_ca={}&tls_cert={}&tls_key={}",
        certs.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    );
    cycle(&connect(&in_url, TlsFiles::default()).await.unwrap()).await;

    expect_tls(
        connect(&url, ca.clone()).await,
        "requires a client certificate",
    );
    expect_tls(
        connect(
            &url,
            ca.clone()
                .with_client(&certs.stranger_cert, &certs.stranger_key),
        )
        .await,
        "refused the client certificate",
    );
    // A certificate without its key.
    let half = TlsFiles {
        cert: Some(certs.client_cert.clone()),
        ..ca
    };
    expect_tls(connect(&url, half).await, "without its key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_alone() {
    let server =
        RedisServer::start_local_with_args(vec!["--requirepass".into(), "s3cret-pw".into()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    let port = server.port().unwrap();
    cycle(
        &connect(
            &format!("redis://:s3cret-pw@127.0.0.1:{port}/"),
            TlsFiles::default(),
        )
        .await
        .unwrap(),
    )
    .await;
    // A wrong password, and none at all.
    expect_auth(
        connect(
            &format!("redis://:wrong-pw@127.0.0.1:{port}/"),
            TlsFiles::default(),
        )
        .await,
        "refused the credentials",
        "wrong-pw",
    );
    expect_auth(
        connect(&format!("redis://127.0.0.1:{port}/"), TlsFiles::default()).await,
        "refused the credentials",
        "s3cret-pw",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_least_privilege() {
    let server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let port = server.port().unwrap();
    let mut root = admin(&server.url()).await;
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("leaser").arg(">user-pw");
    for rule in LEASE_USER_ACL {
        setuser.arg(*rule);
    }
    let _: () = setuser.query_async(&mut root).await.unwrap();

    let url = format!("redis://leaser:user-pw@127.0.0.1:{port}/");
    let backend = connect(&url, TlsFiles::default()).await.unwrap();
    cycle(&backend).await;
    // Notification of a release (pub/sub on the lease's channel) works under the ACL.
    let owner = Owner::new(HolderLabel::new("acl").unwrap());
    let n = unique_name("tls");
    backend
        .acquire(&n, &owner, Duration::from_secs(10))
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
        .release(&n, &owner.token, Duration::ZERO)
        .await
        .unwrap();
    let waited = wait.await.unwrap();
    assert!(waited < Duration::from_secs(4), "woken after {waited:?}");

    // Its limits hold: keys outside its pattern are refused (NOPERM: rejected).
    let outside = RedisBackend::connect_with(&url, RedisConfig::default().with_key_prefix("other"))
        .await
        .unwrap();
    let e = outside
        .acquire(&unique_name("tls"), &owner, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");

    // A wrong password for the user.
    expect_auth(
        connect(
            &format!("redis://leaser:not-it@127.0.0.1:{port}/"),
            TlsFiles::default(),
        )
        .await,
        "refused the credentials",
        "not-it",
    );
}
