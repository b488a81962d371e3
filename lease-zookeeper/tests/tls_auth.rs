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

/// The `digest` ACL id of `user:password`: `user:base64(sha1(user:password))` (computed
/// with the `openssl` command, as ZooKeeper's `DigestAuthenticationProvider` does).
fn digest_id(user: &str, password: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf '%s' '{user}:{password}' | openssl dgst -sha1 -binary | openssl base64"
        ))
        .output()
        .expect("openssl");
    assert!(out.status.success());
    format!("{user}:{}", String::from_utf8_lossy(&out.stdout).trim())
}

/// Least privilege: an administrator makes the application's root `/app` with create,
/// read, write and delete (no admin) for the lease user and nothing for anyone else; the
/// backend, as that user, makes its prefix under it and does everything a lease needs
/// (acquire, renewal through the heartbeat, keep-for release, takeover of the lapsed
/// keep-for node, inspect, forced release); without the user's credentials it is refused.
#[tokio::test]
async fn a_user_with_create_read_write_delete_on_the_root_only() {
    use lease_zookeeper::zookeeper_client as zk;
    let servers = ZooKeeperServer::shared().await.unwrap();
    let admin = zk::Client::connector()
        .with_auth("digest", b"admin:admin-pw")
        .connect(&servers)
        .await
        .unwrap();
    let root = format!("/app-{}", uuid::Uuid::new_v4().simple());
    let lease_id = digest_id("lease", "lease-pw");
    let acls = [
        zk::Acl::new(
            zk::Permission::CREATE
                | zk::Permission::READ
                | zk::Permission::WRITE
                | zk::Permission::DELETE,
            zk::AuthId::new("digest", &lease_id),
        ),
        zk::Acl::new(
            zk::Permission::ALL,
            zk::AuthId::new("digest", &digest_id("admin", "admin-pw")),
        ),
    ];
    admin
        .create(
            &root,
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acls)),
        )
        .await
        .unwrap();

    let cfg = ZkConfig::default()
        .with_prefix(format!("{root}/locks"))
        .with_credentials("lease", "lease-pw");
    let b: std::sync::Arc<dyn LeaseBackend> = std::sync::Arc::new(
        ZkBackend::connect_with(&servers, cfg.clone())
            .await
            .unwrap(),
    );
    let client = lease_core::LeaseClient::new(b.clone());
    let ttl = Duration::from_millis(900);
    let opts = lease_core::LeaseOptions::builder(ttl)
        .keep_for(Duration::from_millis(3000))
        .build()
        .unwrap();
    let lease_core::TryAcquire::Acquired(g) = client.try_acquire("job", &opts).await.unwrap()
    else {
        panic!("held")
    };
    tokio::time::sleep(ttl * 2).await;
    assert!(g.is_held(), "renewal failed: {:?}", g.loss_reason());
    let token = g.fencing();
    g.release().await.unwrap();
    let name = LeaseName::new("job").unwrap();
    assert!(
        b.inspect(&name).await.unwrap().is_some(),
        "keep-for not kept"
    );
    let start = std::time::Instant::now();
    let taken = loop {
        match client.try_acquire("job", &opts).await.unwrap() {
            lease_core::TryAcquire::Acquired(g) => break g,
            _ => {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "keep-for never lapsed"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(taken.fencing() > token);
    assert!(b.force_release(&name).await.unwrap());
    drop(taken);

    // Without the credentials: refused, typed.
    let anonymous = ZkConfig::default().with_prefix(format!("{root}/locks"));
    let e = ZkBackend::connect_with(&servers, anonymous)
        .await
        .expect_err("no credentials");
    assert!(matches!(e, Error::Rejected { .. }), "{e:?}");
}
