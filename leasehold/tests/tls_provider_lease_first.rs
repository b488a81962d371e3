//! The crypto provider when the application installs none before connecting (its graph
//! has both ring and aws-lc-rs here, so rustls cannot pick one by itself): plain
//! connections install nothing; etcd,
//! PostgreSQL and MySQL connect over TLS with the provider they were built with and
//! install nothing, so the application may still install its own. The Redis client builds
//! its TLS settings from rustls's process-wide provider, so the first TLS connection to
//! Redis installs the built-in one (ring) and says so; an application that installs its
//! own after that gets rustls's refusal (one provider per process, as documented), and
//! every connection keeps working. Process-wide state: this order has a test binary of
//! its own (`tls_provider_app_first` the other).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::atomic::Ordering;

use rustls::crypto::CryptoProvider;

mod tls_stores;
use tls_stores::{APP_DRAWS, Stores, app_provider, installed_is_the_apps};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_before_the_application_chose_a_provider() {
    let stores = Stores::start().await;
    // A plain connection to Redis needs no provider and installs none.
    leasehold::connect(&stores.plain_redis).await.unwrap();
    assert!(
        CryptoProvider::get_default().is_none(),
        "redis:// installed a provider"
    );
    for store in ["etcd", "postgres", "mysql"] {
        stores.round_trip(store).await;
        assert!(
            CryptoProvider::get_default().is_none(),
            "{store} installed a process-wide provider"
        );
    }
    stores.round_trip("redis").await;
    assert!(
        CryptoProvider::get_default().is_some() && !installed_is_the_apps(),
        "the first TLS connection to Redis installs the built-in provider"
    );
    assert!(
        app_provider().install_default().is_err(),
        "rustls keeps one provider per process"
    );
    for store in ["redis", "etcd", "postgres", "mysql"] {
        stores.round_trip(store).await;
    }
    assert_eq!(APP_DRAWS.load(Ordering::SeqCst), 0);
}
