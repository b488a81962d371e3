//! A lease granted but answered after its safety deadline is no lease to work under: the
//! store may give it away at any moment. `LeaseClient` releases it and reports a timeout,
//! instead of handing out a guard that is lost the moment it is returned (what a holder
//! heard in the lab's 1,000-contender scenario on a PostgreSQL server starved of CPU:
//! lost 35 µs after its acquire returned).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Capabilities, Error, LeaseBackend, LeaseClient, LeaseInfo, LeaseName,
    LeaseOptions, MemoryBackend, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome,
    Result, TryAcquire, async_trait,
};

/// The memory store, whose acquire answers after `delay` and says it granted only
/// `granted` (a store whose leases are shorter than asked, e.g. a shared lease with
/// little left). Everything else passes through.
#[derive(Debug)]
struct ShortGrant {
    inner: MemoryBackend,
    delay: Duration,
    granted: Duration,
}

#[async_trait]
impl LeaseBackend for ShortGrant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let outcome = self.inner.acquire(name, owner, ttl).await?;
        tokio::time::sleep(self.delay).await;
        Ok(match outcome {
            AcquireOutcome::Acquired { fencing, .. } => AcquireOutcome::Acquired {
                fencing,
                ttl: self.granted,
            },
            other => other,
        })
    }
    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(leases, ttl).await
    }
    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        self.inner.release(name, token, keep_for).await
    }
    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        self.inner.inspect(name).await
    }
}

/// Asked for 1 s (safety margin 100 ms, call timeout 333 ms), granted 120 ms, answered
/// after 60 ms: the safety deadline was 20 ms after the send. The call reports a
/// retryable timeout, and the lease is free again at once (released in the background by
/// its owner token), not only at the store's expiry.
#[tokio::test]
async fn a_grant_answered_after_its_safety_deadline_is_released_and_reported_as_a_timeout() {
    let memory = MemoryBackend::new();
    let backend = Arc::new(ShortGrant {
        inner: memory.clone(),
        delay: Duration::from_millis(60),
        granted: Duration::from_millis(120),
    });
    let client = LeaseClient::new(backend);
    let opts = LeaseOptions::new(Duration::from_secs(1)).unwrap();
    let name = LeaseName::new("late-grant").unwrap();
    match client.try_acquire(&name, &opts).await {
        Err(e @ Error::Timeout { .. }) => {
            assert!(e.is_retryable(), "{e}");
            assert!(e.to_string().contains("acquire"), "{e}");
        }
        Ok(TryAcquire::Acquired(g)) => panic!(
            "handed out a lease past its deadline (lost: {:?})",
            g.loss_reason()
        ),
        other => panic!("{other:?}"),
    }
    // The memory store still held it for the 1 s asked; the client's release frees it.
    let freed_by = tokio::time::Instant::now() + Duration::from_millis(500);
    while memory.inspect(&name).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < freed_by,
            "the late grant was not released within 500 ms (the store keeps it for 1 s)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The same store answering in time keeps handing out guards: only a late answer is
/// refused. Asked for 1 s, granted 500 ms, answered after 10 ms: usable for 390 ms more.
#[tokio::test]
async fn a_short_grant_answered_in_time_is_handed_out() {
    let backend = Arc::new(ShortGrant {
        inner: MemoryBackend::new(),
        delay: Duration::from_millis(10),
        granted: Duration::from_millis(500),
    });
    let client = LeaseClient::new(backend);
    let opts = LeaseOptions::new(Duration::from_secs(1)).unwrap();
    match client.try_acquire("short-grant", &opts).await.unwrap() {
        TryAcquire::Acquired(g) => {
            assert!(g.loss_reason().is_none());
            g.release().await.unwrap();
        }
        other => panic!("{other:?}"),
    }
}
