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

/// The sessions of every TTL the checks use opened before they run, as an application
/// whose TTLs are known does at start (`ZkBackend::prepare`): a check's first acquire of a
/// TTL has a per-call timeout of a third of it (200 ms for the base TTL, 400 ms for twice
/// that), and opening a session on a loaded machine (TCP, TLS, the session handshake) has
/// taken longer (`heartbeat_batches_renewals` and `missed_firing_runs_once_on_recovery`
/// over TLS, once each in clean-clone runs).
async fn prepared(backend: ZkBackend) -> Fixture {
    for ttl in lease_conformance::suite::ttls(&backend) {
        backend
            .prepare(ttl)
            .await
            .unwrap_or_else(|e| panic!("prepare the session of {ttl:?}: {e}"));
    }
    Fixture::new(Arc::new(backend))
}

lease_conformance::conformance_suite!(single);

/// The same checks with the sessions on the calling test's runtime
/// (`ZkConfig::with_runtime`) instead of the crate's own I/O thread.
mod caller_runtime {
    use super::*;

    async fn on_callers_runtime() -> Fixture {
        let servers = ZooKeeperServer::shared()
            .await
            .expect("zookeeper test server");
        let config = config().with_runtime(tokio::runtime::Handle::current());
        let backend = ZkBackend::connect_with(&servers, config)
            .await
            .expect("connect");
        prepared(backend).await
    }

    lease_conformance::conformance_suite!(on_callers_runtime);
}

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
