//! The start-up rule and the health probe on MySQL/MariaDB (see `lease_core::startup`):
//! a server cut off at connect is a retryable error within the connect bound,
//! `connect_when_ready` connects once it is back, and `LeaseClient::health` tells a
//! reachable store from a cut one. The server sits behind a fault proxy that refuses and
//! cuts connections.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::startup::startup_and_health;
use lease_core::LeaseBackend;
use lease_mysql::{MysqlBackend, MysqlConfig};
use lease_test_servers::MariaDbServer;
use lease_test_servers::proxy::{FaultProxy, ProxyFault};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_rule_and_health_probe() {
    let server = MariaDbServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (proxy, url) = FaultProxy::in_front_of(&server.url()).await.unwrap();
    let proxy = Arc::new(proxy);
    let config = MysqlConfig::default().with_request_timeout(REQUEST_TIMEOUT);
    let connect = || {
        let (url, config) = (url.clone(), config.clone());
        async move {
            let backend = MysqlBackend::connect_with(&url, config).await?;
            Ok(Arc::new(backend) as Arc<dyn LeaseBackend>)
        }
    };
    let (cut, restore) = (proxy.clone(), proxy);
    startup_and_health(
        connect,
        move || cut.set(ProxyFault::Reset),
        move || restore.set(ProxyFault::Pass),
        REQUEST_TIMEOUT,
    )
    .await;
}
