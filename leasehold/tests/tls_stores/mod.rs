//! Throwaway local servers of every store that serve TLS with one test CA, and the
//! application-side crypto provider of the TLS provider tests: aws-lc-rs with a
//! random-number source that counts its draws, so a test sees whose provider a
//! handshake used (every TLS handshake draws the client's random).

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use lease_test_servers::mariadb::MariaDbServer;
use lease_test_servers::redis::tls_args;
use lease_test_servers::{EtcdServer, PostgresServer, RedisServer, TestCerts, free_port};
use leasehold::{ConnectOptions, TlsFiles};
use rustls::crypto::{CryptoProvider, GetRandomFailed, SecureRandom};

/// Draws from the application's provider's random source.
pub static APP_DRAWS: AtomicUsize = AtomicUsize::new(0);

/// Not zero-sized: its address tells it apart from other providers' sources (those of
/// ring and aws-lc-rs are zero-sized, and references to zero-sized values may share one
/// address).
#[derive(Debug)]
struct CountingRandom {
    _sized: u8,
}

static COUNTING: CountingRandom = CountingRandom { _sized: 1 };

impl SecureRandom for CountingRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        APP_DRAWS.fetch_add(1, Ordering::SeqCst);
        rustls::crypto::aws_lc_rs::default_provider()
            .secure_random
            .fill(buf)
    }
}

/// The application's provider: aws-lc-rs, counting.
pub fn app_provider() -> CryptoProvider {
    CryptoProvider {
        secure_random: &COUNTING,
        ..rustls::crypto::aws_lc_rs::default_provider()
    }
}

/// Whether the process-wide provider is the application's.
pub fn installed_is_the_apps() -> bool {
    CryptoProvider::get_default()
        .is_some_and(|p| std::ptr::addr_eq(p.secure_random, &COUNTING as &dyn SecureRandom))
}

/// One server of each store with TLS on, and what a client needs to reach it over TLS.
pub struct Stores {
    _certs: TestCerts,
    _servers: (RedisServer, EtcdServer, PostgresServer, MariaDbServer),
    /// (store, URL) pairs, each to be reached over TLS with [`Stores::options`].
    pub urls: Vec<(&'static str, String)>,
    /// TLS files: the test CA.
    pub options: ConnectOptions,
    /// The Redis server's plain (not TLS) URL.
    pub plain_redis: String,
}

impl Stores {
    pub async fn start() -> Stores {
        let certs = TestCerts::generate().unwrap_or_else(|e| panic!("{e}"));
        let tls_port = free_port().unwrap();
        let redis = RedisServer::start_local_with_args(tls_args(&certs, tls_port, "no"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (etcd, https) = EtcdServer::start_local_tls(&certs, false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let postgres = PostgresServer::start_fast()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        postgres
            .enable_tls(&certs, &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let mariadb = MariaDbServer::start_tls(&certs)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let urls = vec![
            ("redis", format!("rediss://127.0.0.1:{tls_port}/")),
            ("etcd", https.replacen("https://", "etcds://", 1)),
            (
                "postgres",
                format!(
                    "postgres://postgres@127.0.0.1:{}/postgres",
                    postgres.port().unwrap()
                ),
            ),
            ("mysql", mariadb.url()),
        ];
        let options = ConnectOptions::default().with_tls(TlsFiles::default().with_ca(&certs.ca));
        let plain_redis = redis.url();
        Stores {
            plain_redis,
            _certs: certs,
            _servers: (redis, etcd, postgres, mariadb),
            urls,
            options,
        }
    }

    /// The URL of `store`.
    pub fn url(&self, store: &str) -> &str {
        self.urls
            .iter()
            .find(|(s, _)| *s == store)
            .map(|(_, u)| u.as_str())
            .unwrap()
    }

    /// Connects to `store` over TLS and takes and releases a lease there.
    pub async fn round_trip(&self, store: &str) {
        self.round_trip_url(store, self.url(store)).await;
    }

    /// Connects to `url` (of `store`) over TLS and takes and releases a lease there.
    pub async fn round_trip_url(&self, store: &str, url: &str) {
        let backend = leasehold::connect_with(url, &self.options)
            .await
            .unwrap_or_else(|e| panic!("{store} over TLS: {e}"));
        let client = leasehold::LeaseClient::new(backend);
        let opts = leasehold::LeaseOptions::new(std::time::Duration::from_secs(5)).unwrap();
        let guard = client
            .acquire(&format!("tls-provider-{store}"), &opts)
            .await
            .unwrap_or_else(|e| panic!("{store}: {e}"));
        guard.release().await.unwrap();
    }
}
