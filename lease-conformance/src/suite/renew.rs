//! Checks of renewal: only the owner renews, batches, extension, the heartbeat's batching.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{LeaseBackend, ReleaseOutcome, RenewItem, RenewOutcome, TryAcquire};

use crate::faulty::FaultyBackend;

use super::support::*;

/// Only the owner token renews.
pub async fn only_owner_renews(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "renew-owner");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl * 10).await;
    let stranger = owner("stranger");
    let r = backend
        .renew(
            &[
                RenewItem {
                    name: n.clone(),
                    token: stranger.token,
                },
                RenewItem {
                    name: n.clone(),
                    token: a.token,
                },
            ],
            ttl * 10,
        )
        .await
        .expect("renew");
    assert_eq!(r, vec![RenewOutcome::Lost, RenewOutcome::Renewed]);
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
}

/// A holder whose lease expired cannot renew it back to life.
pub async fn stale_renew_is_lost(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "stale_renew_is_lost",
        crate::not_applicable::Needs::Expiry,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "stale-renew");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let b = owner("b");
    acquire_when_free(&*backend, &n, &b, ttl * 10, ttl + EXPIRY_TOLERANCE).await;
    let r = backend
        .renew(
            &[RenewItem {
                name: n.clone(),
                token: a.token,
            }],
            ttl * 10,
        )
        .await
        .expect("renew");
    assert_eq!(r, vec![RenewOutcome::Lost]);
    assert_eq!(
        backend
            .release(&n, &b.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released,
        "the stale renewal disturbed the new holder"
    );
}

/// A batch answers per lease, in input order.
pub async fn renew_batch_mixed(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    let n1 = name(&ns, "one");
    let n2 = name(&ns, "two");
    let never = name(&ns, "never-taken");
    raw_acquire(&*backend, &n1, &a, ttl).await;
    raw_acquire(&*backend, &n2, &a, ttl).await;
    let stranger = owner("stranger");
    let r = backend
        .renew(
            &[
                RenewItem {
                    name: n1.clone(),
                    token: a.token,
                },
                RenewItem {
                    name: n2.clone(),
                    token: stranger.token,
                },
                RenewItem {
                    name: never.clone(),
                    token: a.token,
                },
                RenewItem {
                    name: n2.clone(),
                    token: a.token,
                },
            ],
            ttl,
        )
        .await
        .expect("renew");
    assert_eq!(
        r,
        vec![
            RenewOutcome::Renewed,
            RenewOutcome::Lost,
            RenewOutcome::Lost,
            RenewOutcome::Renewed
        ]
    );
    assert!(
        !is_held(&*backend, &never).await,
        "renewing a free name must not take it"
    );
    for n in [&n1, &n2] {
        backend
            .release(n, &a.token, Duration::ZERO)
            .await
            .expect("release");
    }
}

/// An empty batch is answered with an empty result.
pub async fn renew_empty_batch(backend: Arc<dyn LeaseBackend>) {
    let r = backend
        .renew(&[], base_ttl(&*backend))
        .await
        .expect("renew");
    assert!(r.is_empty());
}

/// Renewal extends the lease from the store's now.
pub async fn renew_extends_ttl(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "renew_extends_ttl",
        crate::not_applicable::Needs::Expiry,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "extend");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    // Renew a few times at half the TTL: after 2.5 TTLs the lease must still be held.
    for _ in 0..5 {
        tokio::time::sleep(ttl / 2).await;
        let r = backend
            .renew(
                &[RenewItem {
                    name: n.clone(),
                    token: a.token,
                }],
                ttl,
            )
            .await
            .expect("renew");
        assert_eq!(r, vec![RenewOutcome::Renewed]);
    }
    assert!(is_held(&*backend, &n).await);
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
}

/// One client renews many leases with one `renew` call per tick, not one per lease.
pub async fn heartbeat_batches_renewals(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let ttl = base_ttl(&*backend) * 2;
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    let c = client(&(faulty.clone() as Arc<dyn LeaseBackend>), "batcher");
    let options = opts(ttl);
    let count = 200;
    let mut guards = Vec::new();
    for i in 0..count {
        match c
            .try_acquire(name(&ns, &format!("lease-{i}")), &options)
            .await
            // Which one: the first of a TTL also opens what the store needs for it (a
            // ZooKeeper session, a pooled connection), within the same call timeout.
            .unwrap_or_else(|e| panic!("acquire {i} of {count}: {e:?}"))
        {
            TryAcquire::Acquired(g) => guards.push(g),
            TryAcquire::Held(by) => panic!("held by {by}"),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    }
    // Let the leases fall into step, then count calls over six renewal periods.
    tokio::time::sleep(options.renew_every() * 3).await;
    let before = faulty.renew_log().len();
    tokio::time::sleep(options.renew_every() * 6).await;
    let log = faulty.renew_log();
    let calls = &log[before..];
    let items: usize = calls.iter().map(|c| c.names.len()).sum();
    assert!(calls.len() <= 8, "{} renew calls for 6 ticks", calls.len());
    assert!(
        items >= count * 5,
        "only {items} renewals of {count} leases in 6 ticks"
    );
    assert!(guards.iter().all(|g| g.is_held()));
    for g in guards {
        g.release().await.expect("release");
    }
}
