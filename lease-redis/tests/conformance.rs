//! The whole conformance suite against a real Redis started by the harness.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use lease_conformance::Fixture;
use lease_redis::RedisBackend;
use lease_test_servers::RedisServer;

async fn redis() -> Fixture {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    Fixture::new(Arc::new(backend)).keep(server)
}

lease_conformance::conformance_suite!(redis);
