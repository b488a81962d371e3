//! A reply lost after the store applied the call, on real servers: the backend talks to
//! its store through a [`FaultProxy`] that forwards a request and then drops the reply and
//! cuts the connection. Each acquire, renewal and release must then end one of two ways:
//! the lease is ours with a guard (the store says so), or nothing is held once the cleanup
//! has run (call timeout + 1 s). A name is never blocked beyond that, let alone its TTL.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lease_test_servers::proxy::{FaultProxy, ProxyFault};
use leasehold::{
    Fencing, LeaseBackend, LeaseClient, LeaseGuard, LeaseName, LeaseOptions, ReleaseOutcome,
    TryAcquire,
};
use tokio::time::Instant;

use crate::matrix::{store_addr, with_store_addr};

/// What [`lost_replies`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostReplies {
    /// Replies the proxy dropped in all.
    pub lost: u64,
    /// Acquires whose reply was lost that still ended with a guard (the backend's retry
    /// recognised its own token).
    pub acquired_anyway: usize,
    /// Acquires whose reply was lost that failed with a retryable error, and whose lease
    /// was gone once the cleanup ran.
    pub failed_and_cleaned: usize,
    /// Renewals with a lost reply after which the guard still held the lease (the store
    /// agreeing), and after which it reported the lease lost.
    pub renewals_kept: usize,
    /// See `renewals_kept`.
    pub renewals_lost: usize,
    /// Releases with a lost reply that returned an error (retryable); the name was free
    /// after the cleanup all the same.
    pub releases_failed: usize,
    /// The longest a name stayed held after a call whose reply was lost had returned.
    pub longest_blocked: Duration,
    /// Releases with keep-for whose reply was lost (where the store has keep-for): the
    /// name stayed taken until acquisition + keep-for, and was free soon after.
    pub keep_for_kept: usize,
    /// The latest, after acquisition + keep-for, that such a name became free.
    pub keep_for_overrun: Duration,
    /// Acquires whose reply was lost and whose cleanup failed too (the store unreachable
    /// at once after the lost reply, for longer than both cleanup releases take), while the
    /// same client kept another lease of the same TTL alive.
    pub orphans: usize,
    /// The longest such a name stayed held after the store came back; every one must be
    /// free within one TTL.
    pub orphan_held_after_restore: Duration,
}

/// Rounds per primitive: each loses one reply.
pub const ROUNDS: usize = 5;

fn name(prefix: &str, i: usize) -> LeaseName {
    LeaseName::new(format!(
        "lost-reply-{}/{prefix}-{i}",
        uuid::Uuid::new_v4().simple()
    ))
    .unwrap()
}

/// Waits until the store (asked directly, not through the proxy) reports `n` free.
async fn free_within(direct: &dyn LeaseBackend, n: &LeaseName, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if direct.inspect(n).await.unwrap().is_none() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{n} still held {within:?} after a call whose reply was lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Acquires `n` through `client`, which must get it.
async fn take(client: &LeaseClient, store: &str, n: &LeaseName, opts: &LeaseOptions) -> LeaseGuard {
    match client.try_acquire(n, opts).await.unwrap() {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("{store}: {n} held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    }
}

/// Acquires and releases a throwaway name with `opts`, trying again on retryable errors
/// for up to 10 s, before a phase whose acquires must succeed: a store that opens
/// something per TTL at its first acquire (a ZooKeeper session: TCP, the handshake,
/// through the proxy) does it here, not within the 1 s call timeout of a phase's `take`,
/// as an application whose TTLs are known does at start. (The clean-clone run on
/// 5fd2cb7 failed on the orphan phase's first `take` on ZooKeeper: `Timeout { operation:
/// "acquire", after: 1s }`, the first acquire of that phase's 6 s TTL.)
async fn warm(client: &LeaseClient, store: &str, opts: &LeaseOptions) {
    let n = name("warm", 0);
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        match client.try_acquire(&n, opts).await {
            Ok(TryAcquire::Acquired(g)) => {
                let _ = g.release().await;
                return;
            }
            Ok(TryAcquire::Held(by)) => panic!("{store}: {n} held by {by}"),
            Err(e) if e.is_retryable() && Instant::now() < by => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{store}: warming the TTL {:?}: {e}", opts.ttl()),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    }
}

/// Releases `g` with the proxy losing the release's reply; the outcome, checked to be a
/// success or a retryable error.
async fn release_losing_reply(
    proxy: &FaultProxy,
    store: &str,
    g: LeaseGuard,
) -> leasehold::Result<ReleaseOutcome> {
    proxy.set(ProxyFault::LoseNextReply);
    let released = g.release().await;
    proxy.set(ProxyFault::Pass);
    if let Err(e) = &released {
        assert!(e.is_retryable(), "{store}: {e}");
    }
    released
}

/// Arms the proxy to lose the next reply and waits until it has (or `within` passed).
async fn until_lost(proxy: &FaultProxy, before: u64, within: Duration) -> bool {
    let start = Instant::now();
    while proxy.replies_lost() == before {
        if start.elapsed() >= within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// Loses the reply of `ROUNDS` acquires, renewals and releases each against the store at
/// `url` (one of `leasehold::connect`'s URLs). Panics on a violation: a lease held without a
/// guard beyond the cleanup, a guard that believes what the store denies, an error that
/// says no retry may help.
pub async fn lost_replies(store: &str, url: &str) -> LostReplies {
    lost_replies_with(store, url, &|u| {
        Box::pin(async move { leasehold::connect(&u).await.expect("connect") })
    })
    .await
}

/// How [`lost_replies_with`] makes a backend for a URL. (A boxed future: the nested
/// future types of a generic one overflow the compiler's query depth in a fresh build.)
pub type Connect<'a> =
    &'a (dyn Fn(String) -> Pin<Box<dyn Future<Output = Arc<dyn LeaseBackend>> + Send>> + Sync);

/// [`lost_replies`] with backends made by `connect` from a URL (for backends
/// `leasehold::connect` does not build, such as the PostgreSQL advisory-lock mode).
pub async fn lost_replies_with(store: &str, url: &str, connect: Connect<'_>) -> LostReplies {
    let target = store_addr(url).expect("store address");
    let proxy = FaultProxy::start(target).await.unwrap();
    let via_proxy = with_store_addr(url, proxy.addr());
    let backend = connect(via_proxy).await;
    let direct = connect(url.to_owned()).await;
    let caps = backend.capabilities();
    let call_timeout = Duration::from_secs(1);
    let cleanup = call_timeout * 2 + Duration::from_secs(1);
    // A TTL far longer than the test: whatever it finds free, expiry did not free.
    let long = LeaseOptions::builder(caps.effective_ttl(Duration::from_secs(60)))
        .call_timeout(call_timeout)
        .build()
        .unwrap();
    let client = LeaseClient::new(backend.clone());
    let mut seen = LostReplies::default();
    let mut lost_in_acquire = 0;

    // Acquire.
    for i in 0..ROUNDS {
        let n = name("acquire", i);
        let before = proxy.replies_lost();
        proxy.set(ProxyFault::LoseNextReply);
        match client.try_acquire(&n, &long).await {
            Ok(TryAcquire::Acquired(g)) => {
                seen.acquired_anyway += 1;
                let info = direct.inspect(&n).await.unwrap().expect("ours, so held");
                // A store without fencing tokens reports none (the guard's is then 0).
                let token = (caps.fencing != Fencing::None).then(|| g.fencing());
                assert_eq!(info.fencing, token, "{store}");
                assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
            }
            Ok(TryAcquire::Held(by)) => panic!("{store}: {n} held by {by}"),
            Err(e) => {
                seen.failed_and_cleaned += 1;
                assert!(e.is_retryable(), "{store}: {e}");
                let blocked = free_within(&*direct, &n, cleanup).await;
                seen.longest_blocked = seen.longest_blocked.max(blocked);
            }
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
        proxy.set(ProxyFault::Pass);
        lost_in_acquire += proxy.replies_lost() - before;
    }
    assert!(
        lost_in_acquire > 0,
        "{store}: no acquire reply was lost: the check tested nothing"
    );

    // Renewal: the guard either stays held (the store keeps the lease for us) or hears
    // "lost"; it never believes it holds a lease the store does not give it.
    let short = LeaseOptions::builder(caps.effective_ttl(Duration::from_secs(3)))
        .call_timeout(call_timeout)
        .build()
        .unwrap();
    warm(&client, store, &short).await;
    for i in 0..ROUNDS {
        let n = name("renew", i);
        let g = take(&client, store, &n, &short).await;
        let before = proxy.replies_lost();
        proxy.set(ProxyFault::LoseNextReply);
        let lost = until_lost(&proxy, before, short.renew_every() * 3).await;
        proxy.set(ProxyFault::Pass);
        assert!(lost, "{store}: no renewal reply was lost in round {i}");
        // Two renewal periods later: what the guard believes, the store confirms.
        tokio::time::sleep(short.renew_every() * 2).await;
        let on_store = direct.inspect(&n).await.unwrap();
        if g.is_held() {
            seen.renewals_kept += 1;
            // The store must show the lease held, with our token where it has tokens.
            let on_store = on_store.unwrap_or_else(|| {
                panic!("{store}: the guard believes it holds {n}, the store says free")
            });
            if caps.fencing != leasehold::Fencing::None {
                assert_eq!(
                    on_store.fencing,
                    Some(g.fencing()),
                    "{store}: the guard believes it holds {n}, the store disagrees"
                );
            }
        } else {
            seen.renewals_lost += 1;
        }
        let _ = g.release().await;
        free_within(&*direct, &n, cleanup).await;
    }

    // Release: the call may fail, the name is free once the release's retry has run.
    for i in 0..ROUNDS {
        let n = name("release", i);
        let g = take(&client, store, &n, &long).await;
        if release_losing_reply(&proxy, store, g).await.is_err() {
            seen.releases_failed += 1;
        }
        let blocked = free_within(&*direct, &n, cleanup).await;
        seen.longest_blocked = seen.longest_blocked.max(blocked);
    }
    // Release with keep-for: whether the release's reply is lost or not, the name stays
    // taken until acquisition + keep-for, and no longer than that plus the store's
    // rounding (etcd: whole seconds, and an expiry check every 500 ms).
    if caps.keep_for {
        let keep_for = caps.effective_ttl(Duration::from_secs(3));
        let kept = LeaseOptions::builder(caps.effective_ttl(Duration::from_secs(60)))
            .call_timeout(call_timeout)
            .keep_for(keep_for)
            .build()
            .unwrap();
        for i in 0..KEEP_FOR_ROUNDS {
            let n = name("release-keep-for", i);
            let t0 = Instant::now();
            let g = take(&client, store, &n, &kept).await;
            let released = release_losing_reply(&proxy, store, g).await;
            loop {
                let held = direct.inspect(&n).await.unwrap().is_some();
                let at = t0.elapsed();
                if !held {
                    // 500 ms: the acquire's start here is before the store's.
                    assert!(
                        at + Duration::from_millis(500) >= keep_for,
                        "{store}: {n} free {at:?} after acquisition, keep-for {keep_for:?} \
                         (release: {released:?})"
                    );
                    seen.keep_for_overrun = seen.keep_for_overrun.max(at.saturating_sub(keep_for));
                    break;
                }
                assert!(
                    at < keep_for + Duration::from_secs(3),
                    "{store}: {n} still held {at:?} after acquisition, keep-for {keep_for:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen.keep_for_kept += 1;
        }
    }

    // An acquire whose reply is lost, and the store unreachable right after, for longer
    // than both cleanup releases take: nothing can release the name. It must still be
    // free within one TTL of the store coming back, although the same client keeps
    // another lease of the same TTL alive meanwhile (on etcd, the same etcd lease).
    let ttl = caps.effective_ttl(Duration::from_secs(6));
    let orphan_opts = LeaseOptions::builder(ttl)
        .call_timeout(call_timeout)
        .build()
        .unwrap();
    let cut_for = call_timeout * 3;
    warm(&client, store, &orphan_opts).await;
    for i in 0..ORPHAN_ROUNDS {
        let neighbour = name("orphan-neighbour", i);
        let a = take(&client, store, &neighbour, &orphan_opts).await;
        let n = name("orphan", i);
        let before = proxy.replies_lost();
        proxy.set(ProxyFault::LoseNextReplyThenReset);
        let out = client.try_acquire(&n, &orphan_opts).await;
        let lost = proxy.replies_lost() > before;
        tokio::time::sleep(cut_for).await;
        proxy.set(ProxyFault::Pass);
        let restored = Instant::now();
        let held_at_restore = direct.inspect(&n).await.unwrap().is_some();
        match out {
            Ok(TryAcquire::Acquired(g)) => {
                // The reply lost was another call's (a renewal of the neighbour's): no
                // orphan this round.
                let _ = g.release().await;
            }
            Ok(TryAcquire::Held(by)) => panic!("{store}: {n} held by {by}"),
            Err(e) => {
                assert!(e.is_retryable(), "{store}: {e}");
                if lost && held_at_restore {
                    seen.orphans += 1;
                }
            }
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
        loop {
            if direct.inspect(&n).await.unwrap().is_none() {
                break;
            }
            assert!(
                restored.elapsed() < ttl + Duration::from_secs(1),
                "{store}: {n} still held {:?} after the store came back (TTL {ttl:?}), \
                 with no guard for it",
                restored.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen.orphan_held_after_restore = seen.orphan_held_after_restore.max(restored.elapsed());
        let _ = a.release().await;
    }

    seen.lost = proxy.replies_lost();
    seen
}

/// Rounds of the release with keep-for.
pub const KEEP_FOR_ROUNDS: usize = 3;

/// Rounds of the acquire whose cleanup fails.
pub const ORPHAN_ROUNDS: usize = 3;
