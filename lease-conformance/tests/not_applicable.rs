//! A check that does not apply to a backend is reported as such, not passed in silence:
//! the lead-time checks on a backend whose capabilities say it has no lead time (as the
//! Postgres advisory-lock mode says), and on one whose leases do not expire.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{NO_EXPIRY, NO_LEAD_TIME, NotApplicable, suite};
use lease_core::{
    AcquireOutcome, Capabilities, LeaseBackend, LeaseInfo, LeaseName, MemoryBackend, Owner,
    OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
};

/// The in-memory store under capabilities of the test's choosing.
#[derive(Debug)]
struct Claiming {
    inner: MemoryBackend,
    caps: Capabilities,
}

#[lease_core::async_trait]
impl LeaseBackend for Claiming {
    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }
    async fn acquire(&self, n: &LeaseName, o: &Owner, ttl: Duration) -> Result<AcquireOutcome> {
        self.inner.acquire(n, o, ttl).await
    }
    async fn renew(&self, l: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(l, ttl).await
    }
    async fn release(&self, n: &LeaseName, t: &OwnerToken, k: Duration) -> Result<ReleaseOutcome> {
        self.inner.release(n, t, k).await
    }
    async fn inspect(&self, n: &LeaseName) -> Result<Option<LeaseInfo>> {
        self.inner.inspect(n).await
    }
}

fn claiming(backend: &'static str, edit: impl FnOnce(&mut Capabilities)) -> Arc<dyn LeaseBackend> {
    let inner = MemoryBackend::new();
    let mut caps = inner.capabilities();
    caps.backend = backend;
    edit(&mut caps);
    Arc::new(Claiming { inner, caps })
}

const LEAD_TIME_CHECKS: [&str; 3] = [
    "lost_signal_before_store_expiry",
    "semaphore_lost_before_permit_taken_over",
    "election_deposed_leader_knows_first",
];

async fn lead_time_checks(backend: Arc<dyn LeaseBackend>) {
    suite::lost_signal_before_store_expiry(backend.clone()).await;
    suite::semaphore_lost_before_permit_taken_over(backend.clone()).await;
    suite::election_deposed_leader_knows_first(backend).await;
}

fn reported(backend: &str) -> Vec<NotApplicable> {
    lease_conformance::not_applicable_reports()
        .into_iter()
        .filter(|r| r.backend == backend)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lead_time_checks_are_reported_not_applicable_without_lead_time() {
    lead_time_checks(claiming("no-lead-time", |c| c.lost_before_taken = false)).await;
    let got = reported("no-lead-time");
    let checks: Vec<&str> = got.iter().map(|r| r.check).collect();
    assert_eq!(checks, LEAD_TIME_CHECKS);
    assert!(got.iter().all(|r| r.reason == NO_LEAD_TIME), "{got:?}");
    assert!(
        got[0].to_string().starts_with(
            "lost_signal_before_store_expiry not applicable on no-lead-time: no lead time"
        ),
        "{}",
        got[0]
    );

    // Without expiry (and lead time left at its default), also reported, with that reason.
    lead_time_checks(claiming("no-expiry", |c| c.expires = false)).await;
    let got = reported("no-expiry");
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|r| r.reason == NO_EXPIRY), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lead_time_checks_run_where_the_store_has_lead_time() {
    assert!(Capabilities::default().lost_before_taken);
    let backend: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new());
    assert!(backend.capabilities().lost_before_taken);
    let started = std::time::Instant::now();
    lead_time_checks(backend).await;
    // They ran: each waits for a lease to lapse (the base TTL is 600 ms).
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert!(reported("memory").is_empty());
}
