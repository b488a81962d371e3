//! The conformance suite against a real ZooKeeper 3.8 (Debian's package): on one
//! standalone server and on one 3-member ensemble per test binary, each check under a
//! path prefix of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Fixture;
use lease_test_servers::ZooKeeperServer;
use lease_zookeeper::{ZkBackend, ZkConfig};

/// The harness's server ticks every 200 ms: the backend finds its shortest session
/// (400 ms) at connect.
fn config() -> ZkConfig {
    let ns = lease_conformance::suite::namespace();
    ZkConfig::default()
        .with_prefix(format!("/{}", ns.trim_end_matches('/')))
        .with_request_timeout(Duration::from_secs(2))
}

async fn single() -> Fixture {
    let servers = ZooKeeperServer::shared()
        .await
        .expect("zookeeper test server");
    let backend = ZkBackend::connect_with(&servers, config())
        .await
        .expect("connect");
    prepared(backend).await
}

/// The session of the checks' base TTL opened before they run, as an application whose
/// TTLs are known does at start (`ZkBackend::prepare`): the checks' first acquire has a
/// per-call timeout of a third of that TTL (200 ms), and opening a session on a loaded
/// machine (TCP, TLS, the session handshake) has taken longer.
async fn prepared(backend: ZkBackend) -> Fixture {
    let ttl = lease_conformance::suite::base_ttl(&backend);
    backend.prepare(ttl).await.expect("prepare");
    Fixture::new(Arc::new(backend))
}

lease_conformance::conformance_suite!(single);

mod ensemble {
    use super::*;
    use lease_test_servers::ZooKeeperEnsemble;

    /// One 3-member ensemble (on loopback) for every check of this binary.
    async fn ensemble() -> Fixture {
        let servers = ZooKeeperEnsemble::shared()
            .await
            .expect("zookeeper test ensemble");
        let backend = ZkBackend::connect_with(&servers, config())
            .await
            .expect("connect");
        prepared(backend).await
    }

    lease_conformance::conformance_suite!(ensemble);
}
