//! The crypto provider is the application's choice: an application that installs its own
//! rustls provider (aws-lc-rs here) before connecting keeps it, and the TLS handshakes to
//! Redis and etcd use it. PostgreSQL and MySQL connections (their driver builds its TLS
//! settings with the provider its feature names) leave it installed. Process-wide state:
//! this order has a test binary of its own (`tls_provider_lease_first` the other).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::atomic::Ordering;

mod tls_stores;
use tls_stores::{APP_DRAWS, Stores, app_provider, installed_is_the_apps};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_the_application_installed_first_is_kept_and_used() {
    app_provider()
        .install_default()
        .expect("no provider is installed before the application's");
    let stores = Stores::start().await;
    leasehold::connect(&stores.plain_redis).await.unwrap();
    assert!(installed_is_the_apps());
    for store in ["redis", "etcd"] {
        let before = APP_DRAWS.load(Ordering::SeqCst);
        stores.round_trip(store).await;
        assert!(
            APP_DRAWS.load(Ordering::SeqCst) > before,
            "{store}: the TLS handshake did not use the application's provider"
        );
        assert!(
            installed_is_the_apps(),
            "{store} replaced the application's provider"
        );
    }
    for store in ["postgres", "mysql"] {
        stores.round_trip(store).await;
        assert!(
            installed_is_the_apps(),
            "{store} replaced the application's provider"
        );
    }
}
