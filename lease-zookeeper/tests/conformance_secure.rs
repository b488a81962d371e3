//! The conformance suite over mutual TLS (the secure client port, a client certificate
//! the server requires) as a `digest` user whose nodes carry the `auth` ACL: one server for
//! the binary, each check under a prefix of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::Fixture;
use lease_core::TlsFiles;
use lease_test_servers::ZooKeeperServer;
use lease_test_servers::tls::TestCerts;
use lease_zookeeper::{ZkBackend, ZkConfig};

/// The server, its certificates and the TLS files a client gives.
async fn server() -> &'static (String, TlsFiles) {
    static SHARED: tokio::sync::OnceCell<(String, TlsFiles)> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            // On a runtime of its own, kept for the binary's life (the first caller's
            // runtime ends with its test); the server and files live as long.
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let certs = TestCerts::generate().unwrap();
                let server = rt
                    .block_on(ZooKeeperServer::start_local_tls(&certs, true))
                    .unwrap();
                let files = TlsFiles::default()
                    .with_ca(&certs.ca)
                    .with_client(&certs.client_cert, &certs.client_key);
                let addr = server.secure_address().unwrap();
                // Kept until the process exits.
                std::mem::forget(server);
                std::mem::forget(certs);
                (addr, files)
            })
            .join()
            .unwrap()
        })
        .await
}

async fn secure() -> Fixture {
    let (addr, files) = server().await;
    let ns = lease_conformance::suite::namespace();
    let config = ZkConfig::default()
        .with_prefix(format!("/{}", ns.trim_end_matches('/')))
        .with_request_timeout(Duration::from_secs(2))
        .with_credentials("lease", "lease-password")
        .with_tls(files.clone());
    let backend = ZkBackend::connect_with(addr, config)
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

lease_conformance::conformance_suite!(secure);
