//! ZooKeeper's secure client port (TLS through Netty, PEM files) with certificates made
//! at test time: `zks://` connects and holds leases; a wrong CA, a server certificate for
//! another name and a missing client certificate are refused with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{AcquireOutcome, Error, HolderLabel, LeaseBackend, LeaseName, Owner};
use lease_test_servers::ZooKeeperServer;
use lease_test_servers::tls::TestCerts;
use lease_zookeeper::{ZkBackend, ZkConfig};

fn query(path: &std::path::Path) -> String {
    path.display().to_string().replace('/', "%2F")
}

fn config() -> ZkConfig {
    ZkConfig::default()
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(3))
}

#[tokio::test]
async fn tls_connects_and_refuses_a_wrong_ca_and_a_wrong_host() {
    let certs = TestCerts::generate().unwrap();
    let server = ZooKeeperServer::start_local_tls(&certs, false)
        .await
        .unwrap();
    let addr = server.secure_address().unwrap();
    let url = format!("zks://{addr}/tls?tls_ca={}", query(&certs.ca));
    let b = ZkBackend::connect_url_with(&url, config()).await.unwrap();
    let owner = Owner::new(HolderLabel::new("tls").unwrap());
    let got = b
        .acquire(
            &LeaseName::new("over-tls").unwrap(),
            &owner,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(matches!(got, AcquireOutcome::Acquired { .. }), "{got:?}");

    let wrong_ca = format!("zks://{addr}/tls?tls_ca={}", query(&certs.other_ca));
    let e = ZkBackend::connect_url_with(&wrong_ca, config())
        .await
        .expect_err("a server certificate from an untrusted CA");
    eprintln!("wrong CA: {e}");
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
    assert!(!e.is_retryable());

    let port = addr.rsplit(':').next().unwrap();
    let wrong_host = format!("zks://localhost:{port}/tls?tls_ca={}", query(&certs.ca));
    let e = ZkBackend::connect_url_with(&wrong_host, config())
        .await
        .expect_err("a certificate for 127.0.0.1 reached as localhost");
    eprintln!("wrong host: {e}");
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");

    let plain = format!("zk://{addr}/tls");
    let e = ZkBackend::connect_url_with(&plain, config())
        .await
        .expect_err("plain text to the TLS port");
    eprintln!("plain text to the TLS port: {e}");
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_the_server_trusts() {
    let certs = TestCerts::generate().unwrap();
    let server = ZooKeeperServer::start_local_tls(&certs, true)
        .await
        .unwrap();
    let addr = server.secure_address().unwrap();
    let with = format!(
        "zks://{addr}/mtls?tls_ca={}&tls_cert={}&tls_key={}",
        query(&certs.ca),
        query(&certs.client_cert),
        query(&certs.client_key)
    );
    let b = ZkBackend::connect_url_with(&with, config()).await.unwrap();
    assert!(
        b.inspect(&LeaseName::new("x").unwrap())
            .await
            .unwrap()
            .is_none()
    );

    let without = format!("zks://{addr}/mtls?tls_ca={}", query(&certs.ca));
    let e = ZkBackend::connect_url_with(&without, config())
        .await
        .expect_err("no client certificate");
    eprintln!("no client certificate: {e}");
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");

    let stranger = format!(
        "zks://{addr}/mtls?tls_ca={}&tls_cert={}&tls_key={}",
        query(&certs.ca),
        query(&certs.stranger_cert),
        query(&certs.stranger_key)
    );
    let e = ZkBackend::connect_url_with(&stranger, config())
        .await
        .expect_err("a client certificate from an untrusted CA");
    eprintln!("stranger's certificate: {e}");
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
}
