//! When the backend's watch of its key range runs, and what `renew` trusts it for, against
//! a real etcd:
//!
//! - a lease acquired and released before its first renewal costs no watch (every acquire
//!   and release under the prefix would otherwise come back to the instance as events);
//! - the first renewal asks etcd which keys are attached to the session lease, so a key
//!   deleted before the watch started is reported lost at once; the watch then starts and
//!   stops again once nothing is held or waited for;
//! - history compacted away while the watch was disconnected makes the next renewal ask
//!   etcd again instead of trusting a watch that restarted from "now", and wakes release
//!   waiters whose delete can no longer be replayed;
//! - releasing a key the watch saw taken forgets it, so the watch stops;
//! - a session lease carries no more keys than etcd's list of them in one gRPC reply holds,
//!   so that asking is possible at any number of keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lease_core::{
    AcquireOutcome, HolderLabel, LeaseBackend, LeaseName, Owner, OwnerToken, ReleaseOutcome,
    RenewItem, RenewOutcome,
};
use lease_etcd::etcd_client;
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_test_servers::etcd::EtcdServer;
use lease_test_servers::proxy::{FaultProxy, ProxyFault};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A config with a key prefix of its own (each call a new one): backends that must see
/// each other's keys share one.
fn config() -> EtcdConfig {
    EtcdConfig::default()
        .with_key_prefix(
            lease_conformance::suite::namespace()
                .trim_end_matches('/')
                .to_owned(),
        )
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1))
}

async fn connect(endpoints: &[String], cfg: &EtcdConfig) -> EtcdBackend {
    EtcdBackend::connect_endpoints(endpoints, cfg.clone())
        .await
        .unwrap()
}

fn owner(label: &str) -> Owner {
    Owner {
        token: OwnerToken::random(),
        label: HolderLabel::new(label).unwrap(),
    }
}

fn unique(what: &str) -> LeaseName {
    LeaseName::new(format!("{what}-{}", uuid::Uuid::new_v4().simple())).unwrap()
}

async fn acquired(b: &EtcdBackend, name: &LeaseName, who: &Owner) {
    let out = b.acquire(name, who, TTL).await.unwrap();
    assert!(matches!(out, AcquireOutcome::Acquired { .. }), "{out:?}");
}

async fn renew_one(b: &EtcdBackend, name: &LeaseName, who: &Owner) -> RenewOutcome {
    let item = RenewItem {
        name: name.clone(),
        token: who.token,
    };
    let out = b.renew(&[item], TTL).await.unwrap();
    assert_eq!(out.len(), 1);
    out[0]
}

/// Waits until `done()` holds, failing with `what` after `within`. Nothing outside the
/// backend is an event for its watch's state, so this polls it every 10 ms; the bounds
/// the tests give are generous (the states waited for come within milliseconds, or
/// within the watch's 1 s reconnection backoff).
async fn poll_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < until, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the backend's watch stream is established (`in_step`), or until the watch
/// has noticed that its stream broke (`!in_step`).
async fn wait_watch(b: &EtcdBackend, in_step: bool, within: Duration) {
    let what = if in_step {
        "the watch was not in step"
    } else {
        "the watch did not notice the cut"
    };
    poll_until(within, what, || b.watch_healthy() == in_step).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_runs_only_while_a_renewed_key_is_held() {
    init_tracing();
    let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let cfg = config();
    let b = connect(&server.endpoints(), &cfg).await;
    let me = owner("short");

    // Acquired and released before any renewal: no watch.
    let name = unique("short");
    acquired(&b, &name, &me).await;
    assert!(!b.watch_running(), "an acquire started the watch");
    assert_eq!(
        b.release(&name, &me.token, Duration::ZERO).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(!b.watch_running());

    // A held attempt neither.
    let other = owner("other");
    acquired(&b, &name, &other).await;
    let held = b.acquire(&name, &me, TTL).await.unwrap();
    assert!(matches!(held, AcquireOutcome::Held(_)), "{held:?}");
    assert!(!b.watch_running());

    // The first renewal starts it; it is established soon after.
    assert_eq!(renew_one(&b, &name, &other).await, RenewOutcome::Renewed);
    assert!(
        b.watch_running(),
        "the first renewal did not start the watch"
    );
    wait_watch(&b, true, Duration::from_secs(5)).await;
    assert_eq!(renew_one(&b, &name, &other).await, RenewOutcome::Renewed);

    // Released: nothing held or waited for, so the watch stops.
    assert_eq!(
        b.release(&name, &other.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
    assert!(!b.watch_running(), "the watch outlived the last held key");

    // A release waiter starts it again, and it stops when the waiter is done.
    acquired(&b, &name, &me).await;
    let waiter = {
        let b = b.clone();
        let name = name.clone();
        tokio::spawn(async move { b.wait_released(&name, Duration::from_secs(10)).await })
    };
    poll_until(
        Duration::from_secs(5),
        "the waiter did not start the watch",
        || b.watch_running(),
    )
    .await;
    wait_watch(&b, true, Duration::from_secs(5)).await;
    let t0 = Instant::now();
    assert_eq!(
        b.release(&name, &me.token, Duration::ZERO).await.unwrap(),
        ReleaseOutcome::Released
    );
    waiter.await.unwrap().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the waiter was not woken by the release ({:?})",
        t0.elapsed()
    );
    assert!(!b.watch_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_before_the_first_renewal_is_lost_at_that_renewal() {
    init_tracing();
    let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let cfg = config();
    let holder = connect(&server.endpoints(), &cfg).await;
    let operator = connect(&server.endpoints(), &cfg).await;
    let me = owner("holder");

    // Deleted by someone else.
    let deleted = unique("deleted");
    acquired(&holder, &deleted, &me).await;
    assert!(operator.force_release(&deleted).await.unwrap());
    assert_eq!(
        renew_one(&holder, &deleted, &me).await,
        RenewOutcome::Lost,
        "a key deleted before the first renewal was renewed"
    );

    // Deleted and taken by another holder.
    let taken = unique("taken");
    acquired(&holder, &taken, &me).await;
    assert!(operator.force_release(&taken).await.unwrap());
    acquired(&operator, &taken, &owner("thief")).await;
    assert_eq!(renew_one(&holder, &taken, &me).await, RenewOutcome::Lost);

    // A key nobody touched is renewed in the same way.
    let kept = unique("kept");
    acquired(&holder, &kept, &me).await;
    assert_eq!(renew_one(&holder, &kept, &me).await, RenewOutcome::Renewed);
}

/// The watch is disconnected while keys are deleted and the history compacted past the
/// deletes: when it reconnects, etcd cannot replay them, and the watch starts again from
/// "now". The backend must then ask etcd which keys are attached to its lease instead of
/// trusting the watch (it does so after every reconnection, since etcd 3.4 does not say
/// when a replay of the missed events is done), and wake its release waiters, whose
/// delete events are gone: only the compaction's handling wakes this one before its
/// 30 s bound. A server of its own: the test compacts the store's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_compacted_while_the_watch_was_cut_is_checked_on_the_store() {
    init_tracing();
    let server = EtcdServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let cfg = config();
    let endpoint = server.endpoints()[0].clone();
    let addr: SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
    let proxy = FaultProxy::start(addr).await.unwrap();
    let holder = connect(&[format!("http://{}", proxy.addr())], &cfg).await;
    let operator = connect(&server.endpoints(), &cfg).await;
    let me = owner("holder");
    let name = unique("compacted");
    acquired(&holder, &name, &me).await;
    assert_eq!(renew_one(&holder, &name, &me).await, RenewOutcome::Renewed);
    wait_watch(&holder, true, Duration::from_secs(5)).await;
    // A name held elsewhere, waited for through the holder's instance.
    let awaited = unique("awaited");
    acquired(&operator, &awaited, &owner("other")).await;
    let waiter = {
        let (holder, awaited) = (holder.clone(), awaited.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            holder
                .wait_released(&awaited, Duration::from_secs(30))
                .await
                .unwrap();
            t0.elapsed()
        })
    };
    // Its look at the key must be answered before the cut. No event for that outside the
    // backend: poll its count of armed waits.
    poll_until(
        Duration::from_secs(5),
        "the waiter did not look at its key",
        || holder.release_waits_armed() > 0,
    )
    .await;

    proxy.set(ProxyFault::Reset);
    wait_watch(&holder, false, Duration::from_secs(10)).await;
    assert!(operator.force_release(&awaited).await.unwrap());
    assert!(operator.force_release(&name).await.unwrap());
    let mut raw = etcd_client::Client::connect(server.endpoints(), None)
        .await
        .unwrap();
    let put = raw.put("unrelated-key", "x", None).await.unwrap();
    let rev = put.header().unwrap().revision();
    raw.compact(rev, None).await.unwrap();
    proxy.set(ProxyFault::Pass);

    // Reconnected: etcd answers that the revision to resume from is compacted, and the
    // watch starts again from "now".
    wait_watch(&holder, true, Duration::from_secs(10)).await;
    assert_eq!(
        renew_one(&holder, &name, &me).await,
        RenewOutcome::Lost,
        "a key deleted while the watch was cut, its history compacted, was renewed"
    );
    let waited = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the release waiter was not woken after the compaction")
        .unwrap();
    assert!(
        waited < Duration::from_secs(20),
        "the release waiter waited {waited:?}"
    );
}

/// A key the watch saw deleted by someone else, then released by its guard (answered
/// `NotOwner`): its record goes, so nothing is held and the watch stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_key_seen_lost_stops_the_watch() {
    init_tracing();
    let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let cfg = config();
    let holder = connect(&server.endpoints(), &cfg).await;
    let operator = connect(&server.endpoints(), &cfg).await;
    let me = owner("holder");
    let name = unique("seen-lost");
    acquired(&holder, &name, &me).await;
    assert_eq!(renew_one(&holder, &name, &me).await, RenewOutcome::Renewed);
    wait_watch(&holder, true, Duration::from_secs(5)).await;
    assert!(operator.force_release(&name).await.unwrap());
    // No event to wait on from outside the backend: poll until its watch has applied the
    // delete (normally within milliseconds).
    poll_until(
        Duration::from_secs(5),
        "the watch did not see the delete",
        || holder.holds_lost(&name),
    )
    .await;
    assert!(
        holder.watch_running(),
        "the lost record should still be held here"
    );
    assert_eq!(
        holder
            .release(&name, &me.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::NotOwner
    );
    assert_eq!(
        holder.etcd_leases_in_use(),
        0,
        "the lost record outlived its release"
    );
    assert!(
        !holder.watch_running(),
        "the watch outlived the last record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_beyond_one_reply_are_spread_over_session_leases() {
    // 3,000 names of 1,000 bytes: about 6 MB of keys, more than the 4 MiB a gRPC reply of
    // etcd-client's lease client may carry, so one session lease could not list them.
    const KEYS: usize = 3_000;
    init_tracing();
    let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let cfg = config();
    let b = Arc::new(connect(&server.endpoints(), &cfg).await);
    let me = owner("many");
    let names: Vec<LeaseName> = (0..KEYS)
        .map(|i| LeaseName::new(format!("{i:04}-{}", "n".repeat(995))).unwrap())
        .collect();
    let acquired = futures::stream::iter(names.iter())
        .map(|n| {
            let (b, me) = (b.clone(), me.clone());
            async move { b.acquire(n, &me, TTL).await.unwrap() }
        })
        // All at once: each acquire reserves its key's bytes when it picks its session,
        // so concurrent acquires cannot all pile onto one session.
        .buffer_unordered(KEYS)
        .filter(|o| std::future::ready(matches!(o, AcquireOutcome::Acquired { .. })))
        .count()
        .await;
    assert_eq!(acquired, KEYS);
    let leases = b.etcd_leases_in_use();
    assert!(
        leases >= 2,
        "{KEYS} keys of 1,000-byte names on {leases} session lease(s)"
    );

    let items: Vec<RenewItem> = names
        .iter()
        .map(|n| RenewItem {
            name: n.clone(),
            token: me.token,
        })
        .collect();
    // The first renewal asks etcd for the keys of every session lease; the second may
    // trust the watch.
    for _ in 0..2 {
        let out = b.renew(&items, TTL).await.unwrap();
        let renewed = out.iter().filter(|o| **o == RenewOutcome::Renewed).count();
        assert_eq!(renewed, KEYS, "renewed {renewed} of {KEYS}");
    }
    let released = futures::stream::iter(names.iter())
        .map(|n| {
            let b = b.clone();
            async move { b.release(n, &me.token, Duration::ZERO).await.unwrap() }
        })
        .buffer_unordered(32)
        .filter(|r| std::future::ready(*r == ReleaseOutcome::Released))
        .count()
        .await;
    assert_eq!(released, KEYS);
}
