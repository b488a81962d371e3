//! [`FaultyBackend`]: wraps any backend and fails, delays, hangs or panics its calls, or
//! delays or loses their replies after the store applied them, on demand, counting every
//! call, so the client's error paths can be tested against real stores.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, Capabilities, Error, LeaseBackend, LeaseInfo, LeaseName, Owner, OwnerToken,
    ReleaseOutcome, RenewItem, RenewOutcome, Result,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A primitive of [`LeaseBackend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `acquire`
    Acquire,
    /// `renew`
    Renew,
    /// `release`
    Release,
    /// `inspect`
    Inspect,
    /// `wait_released`
    WaitReleased,
}

/// What to do with calls of one [`Op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    /// Pass the call through.
    #[default]
    Pass,
    /// Fail at once with [`Error::Unavailable`] (as if the store were down).
    Fail,
    /// Fail at once with [`Error::InvalidInput`], as a backend does that refuses an input
    /// before sending anything (the client then knows nothing was taken).
    RefuseInput,
    /// Never answer (as if the store hung).
    Hang,
    /// Pass the call through after a delay.
    Delay(Duration),
    /// `renew` only: answer [`RenewOutcome::Lost`] for every lease without asking the
    /// store, as a store does after losing its data (other primitives pass through).
    AnswerLost,
    /// Send the call to the store at once, then hold its reply back for this long: the
    /// store has applied the call well before the caller hears of it (a slow network on
    /// the way back, a stalled reader).
    DelayReply(Duration),
    /// Send the call to the store, then never answer: the store applied the call and the
    /// reply was lost (a reset stream, a leader change after the commit).
    LoseReply,
    /// Panic instead of calling the store (a bug in a backend). The panic unwinds without
    /// the panic hook (no message, no backtrace on stderr).
    Panic,
}

/// One recorded `renew` call.
#[derive(Clone, Debug)]
pub struct RenewCall {
    /// When the call started.
    pub started: Instant,
    /// When it returned, with a reply or an error (`None` while in flight, and for a
    /// call dropped before it returned).
    pub finished: Option<Instant>,
    /// When the call was dropped before it returned (`None` otherwise): its caller gave
    /// up on it, as the heartbeat does at the call timeout, or it panicked
    /// ([`Fault::Panic`]). A dropped call may still have reached the store; the caller
    /// hears nothing more of it.
    pub dropped: Option<Instant>,
    /// The leases in the batch.
    pub names: Vec<LeaseName>,
}

/// One recorded `acquire` call.
#[derive(Clone, Debug)]
pub struct AcquireCall {
    /// The lease asked for.
    pub name: LeaseName,
    /// When the call started: no earlier than this can the store have taken the lease
    /// for it.
    pub started: Instant,
    /// When it returned, with a reply or an error (`None` while in flight, and for a
    /// call dropped before it returned): no later than this had the store taken the
    /// lease, if it was taken.
    pub finished: Option<Instant>,
    /// Whether it returned [`AcquireOutcome::Acquired`].
    pub acquired: bool,
}

#[derive(Debug, Default)]
struct State {
    faults: HashMap<Op, Fault>,
    /// Faults for the next call of an op only; they take precedence over `faults`.
    once: HashMap<Op, Fault>,
    calls: HashMap<Op, u64>,
    renew_log: Vec<RenewCall>,
    acquire_log: Vec<AcquireCall>,
}

/// A decorator that injects faults into any backend.
#[derive(Debug, Clone)]
pub struct FaultyBackend {
    inner: Arc<dyn LeaseBackend>,
    state: Arc<Mutex<State>>,
    call_started: Arc<Notify>,
    max_renew_batch: Option<usize>,
}

impl FaultyBackend {
    /// Wraps `inner`; every call passes through until told otherwise.
    pub fn new(inner: Arc<dyn LeaseBackend>) -> Self {
        FaultyBackend {
            inner,
            state: Arc::default(),
            call_started: Arc::new(Notify::new()),
            max_renew_batch: None,
        }
    }

    /// Reports [`Capabilities::max_renew_batch`] as `max` instead of the inner backend's
    /// (at least 1), so that a client splits its renewals into calls of at most `max`
    /// leases; the calls still go to the inner backend.
    pub fn with_max_renew_batch(mut self, max: usize) -> Self {
        self.max_renew_batch = Some(max.max(1));
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the fault for one primitive.
    pub fn set(&self, op: Op, fault: Fault) {
        self.state().faults.insert(op, fault);
    }

    /// Sets a fault for the next call of `op` only; later calls get the fault set with
    /// [`FaultyBackend::set`] again.
    pub fn set_once(&self, op: Op, fault: Fault) {
        self.state().once.insert(op, fault);
    }

    /// Sets the same fault for every primitive (the whole store down, hung or slow).
    pub fn set_all(&self, fault: Fault) {
        for op in [
            Op::Acquire,
            Op::Renew,
            Op::Release,
            Op::Inspect,
            Op::WaitReleased,
        ] {
            self.set(op, fault);
        }
    }

    /// How many calls of `op` have started.
    pub fn calls(&self, op: Op) -> u64 {
        self.state().calls.get(&op).copied().unwrap_or(0)
    }

    /// Every `renew` call so far.
    pub fn renew_log(&self) -> Vec<RenewCall> {
        self.state().renew_log.clone()
    }

    /// Every `acquire` call so far, in the order they started. Each bounds when the store
    /// took a lease it acquired: not before `started`, not after `finished`.
    pub fn acquire_log(&self) -> Vec<AcquireCall> {
        self.state().acquire_log.clone()
    }

    /// Waits until at least `n` calls of `op` have started.
    pub async fn wait_for_calls(&self, op: Op, n: u64) {
        loop {
            let notified = self.call_started.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.calls(op) >= n {
                return;
            }
            notified.await;
        }
    }

    /// Counts the call and applies the part of its fault that comes before the store is
    /// asked; returns the fault, whose reply part [`FaultyBackend::leave`] applies.
    async fn enter(&self, op: Op) -> Result<Fault> {
        let fault = {
            let mut st = self.state();
            *st.calls.entry(op).or_default() += 1;
            match st.once.remove(&op) {
                Some(f) => f,
                None => st.faults.get(&op).copied().unwrap_or_default(),
            }
        };
        self.call_started.notify_waiters();
        match fault {
            Fault::Fail => Err(Error::unavailable("faulty", "injected fault: store down")),
            Fault::RefuseInput => Err(lease_core::InvalidInput::Other(
                "injected fault: input refused before anything was sent".into(),
            )
            .into()),
            Fault::Hang => std::future::pending().await,
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(fault)
            }
            // Unwinds without running the panic hook: a hook that prints a backtrace can
            // block the runtime thread for a second, which would be the hook's delay and
            // not what the check is about.
            Fault::Panic => std::panic::resume_unwind(Box::new(format!(
                "injected fault: the backend panicked in {op:?}"
            ))),
            Fault::Pass | Fault::AnswerLost | Fault::DelayReply(_) | Fault::LoseReply => Ok(fault),
        }
    }

    /// Applies the reply part of `fault` to a reply the store has already given.
    async fn leave<T>(fault: Fault, reply: Result<T>) -> Result<T> {
        match fault {
            Fault::DelayReply(d) => {
                tokio::time::sleep(d).await;
                reply
            }
            Fault::LoseReply => std::future::pending().await,
            _ => reply,
        }
    }
}

/// A `renew` call's entry in the log while the call runs: dropped while the entry has no
/// `finished` time (the call did not return), it records when.
struct RenewEntry<'a> {
    state: &'a Mutex<State>,
    idx: usize,
}

impl Drop for RenewEntry<'_> {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(call) = st.renew_log.get_mut(self.idx)
            && call.finished.is_none()
        {
            call.dropped = Some(Instant::now());
        }
    }
}

#[async_trait]
impl LeaseBackend for FaultyBackend {
    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        match self.max_renew_batch {
            Some(max) => caps.with_max_renew_batch(max),
            None => caps,
        }
    }

    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        let idx = {
            let mut st = self.state();
            st.acquire_log.push(AcquireCall {
                name: name.clone(),
                started: Instant::now(),
                finished: None,
                acquired: false,
            });
            st.acquire_log.len() - 1
        };
        let r = match self.enter(Op::Acquire).await {
            Err(e) => Err(e),
            Ok(fault) => Self::leave(fault, self.inner.acquire(name, owner, ttl).await).await,
        };
        if let Some(call) = self.state().acquire_log.get_mut(idx) {
            call.finished = Some(Instant::now());
            call.acquired = matches!(r, Ok(AcquireOutcome::Acquired { .. }));
        }
        r
    }

    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        let idx = {
            let mut st = self.state();
            st.renew_log.push(RenewCall {
                started: Instant::now(),
                finished: None,
                dropped: None,
                names: leases.iter().map(|l| l.name.clone()).collect(),
            });
            st.renew_log.len() - 1
        };
        // Marks the entry dropped if this future is dropped before the call returns.
        let _entry = RenewEntry {
            state: &self.state,
            idx,
        };
        let r = match self.enter(Op::Renew).await {
            Err(e) => Err(e),
            Ok(Fault::AnswerLost) => Ok(vec![RenewOutcome::Lost; leases.len()]),
            Ok(fault) => Self::leave(fault, self.inner.renew(leases, ttl).await).await,
        };
        if let Some(call) = self.state().renew_log.get_mut(idx) {
            call.finished = Some(Instant::now());
        }
        r
    }

    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        let fault = self.enter(Op::Release).await?;
        Self::leave(fault, self.inner.release(name, token, keep_for).await).await
    }

    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        let fault = self.enter(Op::Inspect).await?;
        Self::leave(fault, self.inner.inspect(name).await).await
    }

    async fn force_release(&self, name: &LeaseName) -> Result<bool> {
        let fault = self.enter(Op::Release).await?;
        Self::leave(fault, self.inner.force_release(name).await).await
    }

    async fn wait_released(&self, name: &LeaseName, max_wait: Duration) -> Result<()> {
        let fault = self.enter(Op::WaitReleased).await?;
        Self::leave(fault, self.inner.wait_released(name, max_wait).await).await
    }
}
