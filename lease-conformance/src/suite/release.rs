//! Checks of release: only the owner releases, at once or after keep-for; inspection and
//! an operator's forced release.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    Error, Fencing, LeaseBackend, LossReason, ReleaseOutcome, RenewItem, RenewOutcome, TryAcquire,
};
use tokio::time::Instant;

use super::support::*;

/// Only the owner token releases; a stranger's release changes nothing.
pub async fn only_owner_releases(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "release-owner");
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let stranger = owner("stranger");
    assert_eq!(
        backend
            .release(&n, &stranger.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner
    );
    assert!(
        is_held(&*backend, &n).await,
        "a stranger's release freed the lease"
    );
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner,
        "a second release must say NotOwner"
    );
}

/// A holder whose lease expired cannot release the next holder's lease.
pub async fn stale_release_is_noop(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "stale_release_is_noop",
        crate::not_applicable::Needs::Expiry,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "stale-release");
    let ttl = base_ttl(&*backend);
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    let b = owner("b");
    acquire_when_free(&*backend, &n, &b, ttl * 10, ttl + EXPIRY_TOLERANCE).await;
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::NotOwner
    );
    assert!(
        is_held(&*backend, &n).await,
        "stale release freed the new holder's lease"
    );
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// Release frees the lease at once (keep-for zero).
pub async fn release_frees_immediately(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "release");
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::ZERO)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    let b = owner("b");
    raw_acquire(&*backend, &n, &b, ttl).await;
    assert!(backend.inspect(&n).await.expect("inspect").is_some());
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// keep-for (lockAtLeastFor) keeps the lease taken after release, not renewable, and then
/// frees it.
pub async fn keep_for_holds_after_release(backend: Arc<dyn LeaseBackend>) {
    let caps = backend.capabilities();
    if !crate::not_applicable::applies(
        &*backend,
        "keep_for_holds_after_release",
        crate::not_applicable::Needs::KeepFor,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "keep-for");
    let ttl = base_ttl(&*backend);
    let keep_for = caps.effective_ttl(ttl * 2);
    let a = owner("a");
    let started = Instant::now();
    raw_acquire(&*backend, &n, &a, ttl * 10).await;
    assert_eq!(
        backend
            .release(&n, &a.token, keep_for)
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        is_held(&*backend, &n).await,
        "keep-for did not keep the lease"
    );
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
    assert_eq!(
        r,
        vec![RenewOutcome::Lost],
        "a released lease must not be renewable"
    );
    let b = owner("b");
    acquire_when_free(&*backend, &n, &b, ttl, keep_for + EXPIRY_TOLERANCE).await;
    assert!(
        started.elapsed() + Duration::from_millis(50) >= keep_for,
        "freed after {:?}, before keep-for {keep_for:?}",
        started.elapsed()
    );
    backend
        .release(&n, &b.token, Duration::ZERO)
        .await
        .expect("release");
}

/// keep-for already elapsed since acquisition: release frees at once.
pub async fn keep_for_elapsed_frees(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::applies(
        &*backend,
        "keep_for_elapsed_frees",
        crate::not_applicable::Needs::KeepFor,
    ) {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "keep-for-elapsed");
    let ttl = base_ttl(&*backend) * 10;
    let a = owner("a");
    raw_acquire(&*backend, &n, &a, ttl).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend
            .release(&n, &a.token, Duration::from_millis(1))
            .await
            .expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        !is_held(&*backend, &n).await,
        "elapsed keep-for still held the lease"
    );
}

/// inspect shows holder, fencing token and remaining time; `None` once free.
pub async fn inspect_reports_holder(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "inspect");
    let ttl = base_ttl(&*backend) * 10;
    let caps = backend.capabilities();
    assert_eq!(backend.inspect(&n).await.expect("inspect"), None);
    let a = owner("inspect-holder");
    let f = raw_acquire(&*backend, &n, &a, ttl).await;
    let info = backend.inspect(&n).await.expect("inspect").expect("held");
    if caps.holder_info {
        assert_eq!(info.holder.as_deref(), Some("inspect-holder"));
    }
    if let Some(seen) = info.fencing {
        assert_eq!(seen, f);
    }
    if caps.expires {
        let r = info.remaining.expect("remaining");
        assert!(r <= caps.effective_ttl(ttl) && r > Duration::ZERO, "{r:?}");
    }
    backend
        .release(&n, &a.token, Duration::ZERO)
        .await
        .expect("release");
    assert_eq!(backend.inspect(&n).await.expect("inspect"), None);
}

/// An operator's force release frees the lease, keeps the fencing sequence, and the
/// former holder learns at its next renewal. Skipped where the backend does not support it.
pub async fn force_release_frees_and_holder_learns(backend: Arc<dyn LeaseBackend>) {
    let ns = namespace();
    let n = name(&ns, "force");
    let ttl = base_ttl(&*backend);
    match backend.force_release(&n).await {
        Err(Error::Unsupported { .. }) => return,
        Ok(freed) => assert!(!freed, "nothing was held"),
        Err(e) => panic!("force_release on a free name: {e}"),
    }
    let c = client(&backend, "victim");
    let guard = match c.try_acquire(&n, &opts(ttl)).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    };
    assert!(backend.force_release(&n).await.expect("force_release"));
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the holder never learnt of the force release");
    assert_eq!(reason, LossReason::NotOwner);
    let o = owner("next");
    let f = raw_acquire(&*backend, &n, &o, ttl).await;
    if backend.capabilities().fencing != Fencing::None {
        assert!(
            f > guard.fencing(),
            "fencing sequence reset by force release"
        );
    }
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::NotOwner
    );
    backend
        .release(&n, &o.token, Duration::ZERO)
        .await
        .expect("release");
}
