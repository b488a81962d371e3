//! PostgreSQL outages on a server the harness owns: stopped for twice the TTL, and frozen
//! (SIGSTOP) with its connections open. Callers get typed, retryable errors within their
//! call timeout, a holder is told at its safety deadline, and work resumes when the server
//! is back, with fencing tokens continuing where they were (the lock table survives).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::outage::{acquire_fails_typed, lost_at_the_deadline};
use lease_core::{HolderLabel, LeaseBackend, LeaseClient, LeaseGuard, LeaseOptions, TryAcquire};
use lease_postgres::PostgresBackend;
use lease_test_servers::postgres::PostgresServer;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(1);

async fn setup() -> (PostgresServer, LeaseClient, LeaseOptions, String) {
    let server = PostgresServer::start_fast()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let backend: Arc<dyn LeaseBackend> =
        Arc::new(PostgresBackend::connect(&server.url()).await.unwrap());
    let client = LeaseClient::with_label(backend, HolderLabel::new("holder").unwrap());
    let opts = LeaseOptions::new(TTL).unwrap();
    let prefix = format!("outage-{}", uuid::Uuid::new_v4().simple());
    (server, client, opts, prefix)
}

async fn take(client: &LeaseClient, name: &str, opts: &LeaseOptions) -> LeaseGuard {
    match client.try_acquire(name, opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("{name} held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    }
}

/// Once the server is back, the lease the lost holder had is taken again (its row expired
/// meanwhile) with a larger fencing token, within 5 s; only retryable errors before that.
async fn recovers(client: &LeaseClient, name: &str, opts: &LeaseOptions, old_token: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let g = loop {
        match client.try_acquire(name, opts).await {
            Ok(TryAcquire::Acquired(g)) => break g,
            Ok(TryAcquire::Held(by)) => {
                assert!(
                    Instant::now() < deadline,
                    "still held 5 s after recovery: {by}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(Instant::now() < deadline, "no recovery within 5 s: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    };
    assert!(
        g.fencing().get() > old_token,
        "token {} after the outage, {old_token} before",
        g.fencing()
    );
    eprintln!("recovered: token {} (was {old_token})", g.fencing());
    g.release().await.unwrap();
}

/// The server stopped for 2x the TTL: typed errors without hangs, the lost signal at the
/// deadline, recovery when the server is back, fencing continuing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_for_twice_the_ttl() {
    let (mut server, client, opts, prefix) = setup().await;
    let held = format!("{prefix}/held");
    let guard = take(&client, &held, &opts).await;
    let token = guard.fencing().get();
    server.stop().await.unwrap();
    let stopped_at = Instant::now();

    acquire_fails_typed(&client, &format!("{prefix}/other"), &opts).await;
    lost_at_the_deadline(&guard, &opts, stopped_at).await;

    if let Some(rest) = (TTL * 2).checked_sub(stopped_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    server.start_again().await.unwrap();
    recovers(&client, &held, &opts, token).await;
}

/// The server frozen (SIGSTOP to every server process) for 2x the TTL: connections stay
/// open and nothing answers, so only the client's timeouts end the calls. The same
/// guarantees as a stopped server; after SIGCONT the pool works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_for_twice_the_ttl() {
    let (server, client, opts, prefix) = setup().await;
    let held = format!("{prefix}/held");
    let guard = take(&client, &held, &opts).await;
    let token = guard.fencing().get();
    server.pause().unwrap();
    let paused_at = Instant::now();

    acquire_fails_typed(&client, &format!("{prefix}/other"), &opts).await;
    lost_at_the_deadline(&guard, &opts, paused_at).await;

    if let Some(rest) = (TTL * 2).checked_sub(paused_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    server.resume().unwrap();
    recovers(&client, &held, &opts, token).await;
}
