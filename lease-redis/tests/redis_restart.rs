//! Redis-specific behaviour under restarts and outages, on real redis-server processes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::outage::{acquire_fails_typed, lost_at_the_deadline};
use lease_core::{
    AcquireOutcome, Fencing, HolderLabel, LeaseBackend, LeaseClient, LeaseName, LeaseOptions,
    LossReason, Owner, TryAcquire,
};
use lease_redis::RedisBackend;
use lease_test_servers::RedisServer;
use tokio::time::Instant;

fn owner() -> Owner {
    Owner::new(HolderLabel::new("restart-test").unwrap())
}

async fn take(b: &dyn LeaseBackend, name: &LeaseName) -> u64 {
    match b
        .acquire(name, &owner(), Duration::from_secs(30))
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired { fencing, .. } => fencing.get(),
        AcquireOutcome::Held(by) => panic!("held by {by}"),
    }
}

/// Without persistence a restart loses every lease: the holder is told at its next
/// renewal (or at its deadline). The fencing counter is lost with it, and seeded again
/// from the server's clock in microseconds, so the next token is still above every token
/// before the restart (before the seeding, the sequence started again at 1: 3 -> 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_loses_leases_and_fencing_keeps_rising() {
    let mut server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let backend: Arc<dyn LeaseBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    assert_eq!(backend.capabilities().fencing, Fencing::Volatile);
    let client = LeaseClient::with_label(backend.clone(), HolderLabel::new("holder").unwrap());
    let opts = LeaseOptions::new(Duration::from_secs(2)).unwrap();
    let guarded = LeaseName::new("restart/guarded").unwrap();
    let guard = match client.try_acquire(&guarded, &opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    let before = guard.fencing().get();
    server.stop().await.unwrap();
    server.start_again().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(4), guard.lost())
        .await
        .expect("the holder was not told its lease vanished");
    assert!(
        matches!(reason, LossReason::NotOwner | LossReason::DeadlinePassed),
        "{reason:?}"
    );
    // The data is gone: the name is free, and the token still rises.
    let after = take(&*backend, &guarded).await;
    assert!(
        after > before,
        "token {after} after the restart, {before} before"
    );
    eprintln!("no persistence: token {before} before the restart, {after} after");
}

/// Redis without persistence, restarted 3 times, with acquisitions of one name between
/// the restarts (several per run, released in between): every token after a restart is
/// above every token before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_three_restarts_without_persistence() {
    let mut server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let name = LeaseName::new("restart/{fenced}").unwrap();
    let mut runs: Vec<Vec<u64>> = Vec::new();
    for restart in 0..=3 {
        if restart > 0 {
            server.stop().await.unwrap();
            server.start_again().await.unwrap();
        }
        let mut tokens = Vec::new();
        for _ in 0..5 {
            let o = owner();
            let t = loop {
                // The first call after a restart may meet the dropped connection.
                match backend.acquire(&name, &o, Duration::from_secs(30)).await {
                    Ok(AcquireOutcome::Acquired { fencing, .. }) => break fencing.get(),
                    Ok(AcquireOutcome::Held(by)) => panic!("held by {by}"),
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            backend
                .release(&name, &o.token, Duration::ZERO)
                .await
                .unwrap();
            tokens.push(t);
        }
        runs.push(tokens);
    }
    eprintln!("tokens per server run (restarts between): {runs:?}");
    for pair in runs.windows(2) {
        let before = pair[0].iter().max().unwrap();
        let after = pair[1].iter().min().unwrap();
        assert!(
            after > before,
            "token {after} after a restart, {before} before: {runs:?}"
        );
    }
    for run in &runs {
        assert!(run.windows(2).all(|w| w[0] < w[1]), "{runs:?}");
    }
}

/// With `appendonly yes` + `appendfsync always`, the fencing counter survives a
/// restart, and the backend says `Fencing::Durable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aof_fencing_survives_restart() {
    let mut server = RedisServer::start_persistent()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    assert_eq!(backend.capabilities().fencing, Fencing::Durable);
    let name = LeaseName::new("restart/{durable}:x").unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let o = owner();
        let t = match backend
            .acquire(&name, &o, Duration::from_secs(30))
            .await
            .unwrap()
        {
            AcquireOutcome::Acquired { fencing, .. } => fencing.get(),
            AcquireOutcome::Held(by) => panic!("held by {by}"),
        };
        assert!(t > last);
        last = t;
        backend
            .release(&name, &o.token, Duration::ZERO)
            .await
            .unwrap();
    }
    server.stop().await.unwrap();
    server.start_again().await.unwrap();
    let after = take(&backend, &name).await;
    assert!(after > last, "token {after} after restart, {last} before");
    eprintln!("appendonly: token {last} before the restart, {after} after");
}

/// The server stopped for 2x the TTL: typed errors without hangs, the lost signal at the
/// deadline, and recovery when the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_for_twice_the_ttl() {
    let mut server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let backend: Arc<dyn LeaseBackend> =
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    let client = LeaseClient::with_label(backend.clone(), HolderLabel::new("holder").unwrap());
    let ttl = Duration::from_secs(1);
    let opts = LeaseOptions::new(ttl).unwrap();
    let guard = match client.try_acquire("down/held", &opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    let acquired_at = Instant::now();
    let token = guard.fencing().get();
    server.stop().await.unwrap();
    let stopped_at = Instant::now();

    // A new acquisition fails with a typed, retryable error within the call timeout.
    acquire_fails_typed(&client, "down/other", &opts).await;

    // The holder is told at its deadline: last successful renewal + ttl - margin, so at
    // most ttl - margin after the stop (plus scheduling slack).
    let after_stop = lost_at_the_deadline(&guard, &opts, stopped_at).await;
    eprintln!(
        "lost signal {:?} after acquisition",
        (stopped_at - acquired_at) + after_stop
    );

    // Stay down for 2x ttl in total, then come back: work resumes.
    let down_for = ttl * 2;
    if let Some(rest) = down_for.checked_sub(stopped_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    server.start_again().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let g = loop {
        match client.try_acquire("down/held", &opts).await {
            Ok(TryAcquire::Acquired(g)) => break g,
            Ok(TryAcquire::Held(by)) => {
                panic!("still held after a restart without persistence: {by}")
            }
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(Instant::now() < deadline, "no recovery within 5 s: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    };
    eprintln!("recovered: new token {} (was {token})", g.fencing());
    g.release().await.unwrap();
}
