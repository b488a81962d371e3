//! Checking the server's certificate against the CA without its host name (PostgreSQL's
//! `sslmode=verify-ca`, MySQL's `ssl-mode=VERIFY_CA`) makes the driver ask rustls for
//! the process-wide crypto provider, and rustls panics when none is installed and both
//! ring and aws-lc-rs are built in (as here: the application's graph has both). The
//! backends install the built-in provider first (the application installed none), so
//! these connections work. Process-wide state: a test binary of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use rustls::crypto::CryptoProvider;

mod tls_stores;
use tls_stores::{Stores, installed_is_the_apps};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_connections_work_when_the_application_installed_no_provider() {
    let stores = Stores::start().await;
    assert!(CryptoProvider::get_default().is_none());
    let postgres = format!("{}?sslmode=verify-ca", stores.url("postgres"));
    stores.round_trip_url("postgres", &postgres).await;
    assert!(
        CryptoProvider::get_default().is_some() && !installed_is_the_apps(),
        "the built-in provider is installed for verify-ca"
    );
    let mysql = format!("{}?ssl-mode=VERIFY_CA", stores.url("mysql"));
    stores.round_trip_url("mysql", &mysql).await;
}
