//! The conformance suite against a real etcd: a single node, and a 3-member cluster.
//!
//! Each check gets its own throwaway etcd (a node starts in ~0.1 s, a cluster in 0.2-2 s)
//! and its own key prefix; set `LEASE_TEST_ETCD_ENDPOINTS` to run the single-node checks
//! against an existing cluster instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Fixture;
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_test_servers::etcd::{EtcdCluster, EtcdServer};

fn config() -> EtcdConfig {
    EtcdConfig::default()
        .with_key_prefix(
            lease_conformance::suite::namespace()
                .trim_end_matches('/')
                .to_owned(),
        )
        .with_request_timeout(Duration::from_secs(2))
}

async fn single() -> Fixture {
    let server = EtcdServer::start().await.expect("etcd test server");
    let backend = EtcdBackend::connect_endpoints(&server.endpoints(), config())
        .await
        .expect("connect");
    Fixture::new(Arc::new(backend)).keep(server)
}

lease_conformance::conformance_suite!(single);

mod cluster {
    use super::*;

    async fn cluster() -> Fixture {
        let cluster = EtcdCluster::start(3).await.expect("etcd test cluster");
        let backend = EtcdBackend::connect_endpoints(&cluster.endpoints(), config())
            .await
            .expect("connect");
        Fixture::new(Arc::new(backend)).keep(cluster)
    }

    lease_conformance::conformance_suite!(cluster);
}
