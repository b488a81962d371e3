//! The whole conformance suite over mutual TLS, as a user whose role may only read and
//! write the lease prefix: what a production deployment runs. Each check gets its own
//! throwaway etcd.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Fixture;
use lease_core::TlsFiles;
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_test_servers::{EtcdServer, TestCerts};

async fn secure_single() -> Fixture {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let (server, https) = EtcdServer::start_local_tls(&certs, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let prefix = lease_conformance::suite::namespace()
        .trim_end_matches('/')
        .to_owned();
    // Authentication on, through the plain port: root, and a user limited to the prefix.
    let mut raw = etcd_client::Client::connect(server.endpoints(), None)
        .await
        .unwrap();
    raw.user_add("root", "root-pw", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.role_add("lease-rw").await.unwrap();
    raw.role_grant_permission(
        "lease-rw",
        etcd_client::Permission::read_write(format!("{prefix}/")).with_prefix(),
    )
    .await
    .unwrap();
    raw.user_add("leaser", "user-pw", None).await.unwrap();
    raw.user_grant_role("leaser", "lease-rw").await.unwrap();
    raw.auth_enable().await.unwrap();
    let config = EtcdConfig::default()
        .with_key_prefix(prefix)
        .with_user(Some("leaser".into()))
        .with_password(Some("user-pw".into()))
        .with_request_timeout(Duration::from_secs(2))
        .with_tls(Some(
            TlsFiles::default()
                .with_ca(&certs.ca)
                .with_client(&certs.client_cert, &certs.client_key),
        ));
    let backend = EtcdBackend::connect_endpoints(&[https], config)
        .await
        .expect("connect over mutual TLS as the prefix-limited user");
    Fixture::new(Arc::new(backend)).keep(server).keep(certs)
}

lease_conformance::conformance_suite!(secure_single);
