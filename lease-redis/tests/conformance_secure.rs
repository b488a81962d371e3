//! The whole conformance suite over mutual TLS, as a least-privilege ACL user (its keys
//! and channels only, no administrative commands): what a production deployment runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use lease_conformance::Fixture;
use lease_core::TlsFiles;
use lease_redis::{RedisBackend, RedisConfig};
use lease_test_servers::redis::{LEASE_USER_ACL, tls_args};
use lease_test_servers::{RedisServer, TestCerts, free_port};
mod common;

async fn secure_redis() -> Fixture {
    let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
    let tls_port = free_port().unwrap();
    let server = RedisServer::start_local_with_args(tls_args(&certs, tls_port, "yes"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut root = common::admin(&server.url()).await;
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("leaser").arg(">user-pw");
    for rule in LEASE_USER_ACL {
        setuser.arg(*rule);
    }
    let _: () = setuser.query_async(&mut root).await.unwrap();
    let config = RedisConfig::default().with_tls(
        TlsFiles::default()
            .with_ca(&certs.ca)
            .with_client(&certs.client_cert, &certs.client_key),
    );
    let backend = RedisBackend::connect_with(
        &format!("rediss://leaser:user-pw@127.0.0.1:{tls_port}/"),
        config,
    )
    .await
    .expect("connect over mutual TLS as the ACL user");
    Fixture::new(Arc::new(backend)).keep(server).keep(certs)
}

lease_conformance::conformance_suite!(secure_redis);
