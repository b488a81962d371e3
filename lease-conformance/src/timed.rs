//! [`TimedBackend`]: wraps any backend and records every call that took longer than a
//! limit (measured until it returned or was cancelled), to check that no call to a store
//! outlives its timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, Capabilities, LeaseBackend, LeaseInfo, LeaseName, Owner, OwnerToken,
    ReleaseOutcome, RenewItem, RenewOutcome, Result,
};
use tokio::time::Instant;

/// One call that took longer than the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overrun {
    /// The primitive.
    pub operation: &'static str,
    /// How long it took (until it returned or was dropped).
    pub took: Duration,
}

/// A decorator that measures every call except `wait_released` (which waits on purpose).
#[derive(Debug, Clone)]
pub struct TimedBackend {
    inner: Arc<dyn LeaseBackend>,
    limit: Duration,
    overruns: Arc<Mutex<Vec<Overrun>>>,
}

struct CallTimer<'a> {
    started: Instant,
    operation: &'static str,
    backend: &'a TimedBackend,
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        if took > self.backend.limit {
            self.backend
                .overruns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Overrun {
                    operation: self.operation,
                    took,
                });
        }
    }
}

impl TimedBackend {
    /// Wraps `inner`; calls longer than `limit` are recorded.
    pub fn new(inner: Arc<dyn LeaseBackend>, limit: Duration) -> Self {
        TimedBackend {
            inner,
            limit,
            overruns: Arc::default(),
        }
    }

    /// Takes the overruns recorded so far.
    pub fn take_overruns(&self) -> Vec<Overrun> {
        std::mem::take(&mut *self.overruns.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn timer(&self, operation: &'static str) -> CallTimer<'_> {
        CallTimer {
            started: Instant::now(),
            operation,
            backend: self,
        }
    }
}

#[async_trait]
impl LeaseBackend for TimedBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let _t = self.timer("acquire");
        self.inner.acquire(name, owner, ttl).await
    }

    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        let _t = self.timer("renew");
        self.inner.renew(leases, ttl).await
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let _t = self.timer("release");
        self.inner.release(name, token, keep_for).await
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let _t = self.timer("inspect");
        self.inner.inspect(name).await
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let _t = self.timer("force_release");
        self.inner.force_release(name).await
    }

    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        self.inner.wait_released(name, max_wait).await
    }
}
