//! The start-up rule and the health probe on etcd (see `lease_core::startup`): a server
//! cut off at connect is a retryable error within the connect bound (etcd's client would
//! otherwise connect lazily: the backend asks a member for its status before it returns),
//! `connect_when_ready` connects once it is back, and `LeaseClient::health` tells a
//! reachable store from a cut one. The server sits behind a fault proxy that refuses and
//! cuts connections.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::startup::startup_and_health;
use lease_core::LeaseBackend;
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_test_servers::etcd::EtcdServer;
use lease_test_servers::proxy::{FaultProxy, ProxyFault};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_rule_and_health_probe() {
    let server = EtcdServer::start().await.expect("etcd test server");
    let (proxy, url) = FaultProxy::in_front_of(&server.url()).await.unwrap();
    let proxy = Arc::new(proxy);
    let config = EtcdConfig::default()
        .with_key_prefix(format!("startup-{}", uuid::Uuid::new_v4().simple()))
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(1));
    let bound = config.connect_timeout + config.request_timeout;
    let connect = || {
        let (url, config) = (url.clone(), config.clone());
        async move {
            let backend = EtcdBackend::connect_with(&url, config).await?;
            Ok(Arc::new(backend) as Arc<dyn LeaseBackend>)
        }
    };
    let (cut, restore) = (proxy.clone(), proxy);
    startup_and_health(
        connect,
        move || cut.set(ProxyFault::Reset),
        move || restore.set(ProxyFault::Pass),
        bound,
    )
    .await;
}
