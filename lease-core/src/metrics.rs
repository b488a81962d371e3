//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`):
//! the application installs the recorder (a Prometheus exporter, StatsD, OpenTelemetry
//! ...) and the client reports to it. Without a recorder every report is a no-op; without
//! the feature the calls are compiled out.
//!
//! Names and units follow Prometheus conventions. Every series carries the label
//! `backend` (`redis`, `postgres`, `etcd`, `mysql`, `memory`, or a custom backend's
//! name); the label `lease` (the lease name) is off by default, because a process with
//! many lease names would make many series: turn it on with [`set_lease_name_label`].
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `lease_acquire_attempts_total` | counter | `outcome`: `acquired`, `held`, or an [error kind](crate::Error::kind) | acquire calls to the store |
//! | `lease_acquire_duration_seconds` | histogram | | time of each acquire call |
//! | `lease_renewals_total` | counter | `outcome`: `renewed`, `lost`, `error` | renewals, one per lease in a batch |
//! | `lease_renew_duration_seconds` | histogram | | time of each renew call (one batch) |
//! | `lease_renew_batch_size` | histogram | | leases per renew call |
//! | `lease_renewal_margin_seconds` | histogram | | at each successful renewal: how long the lease still had before its safety deadline. The early warning: a margin that shrinks towards 0 comes before a loss |
//! | `lease_losses_total` | counter | `reason`: `deadline_passed`, `not_owner`, `heartbeat_stopped` | leases lost while held (not counting releases) |
//! | `lease_releases_total` | counter | `outcome`: `released`, `not_owner`, or an error kind | release calls to the store |
//! | `lease_held` | gauge | | leases this process holds now |
//! | `lease_waiters` | gauge | | callers waiting for a held lease or permit now |

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use metrics::{Label, histogram};
    use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};

    use crate::types::LeaseName;

    static NAME_LABEL: AtomicBool = AtomicBool::new(false);

    pub(crate) fn set_lease_name_label(on: bool) {
        NAME_LABEL.store(on, Ordering::Relaxed);
    }

    fn labels(
        backend: &'static str,
        name: &LeaseName,
        extra: Option<(&'static str, &'static str)>,
    ) -> Vec<Label> {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::from_static_parts("backend", backend));
        if let Some((k, v)) = extra {
            labels.push(Label::from_static_parts(k, v));
        }
        if NAME_LABEL.load(Ordering::Relaxed) {
            labels.push(Label::new("lease", name.to_string_lossy()));
        }
        labels
    }

    pub(crate) fn describe() {
        describe_counter!(
            "lease_acquire_attempts_total",
            Unit::Count,
            "Acquire calls to the store, by outcome (acquired, held, or the error kind)."
        );
        describe_histogram!(
            "lease_acquire_duration_seconds",
            Unit::Seconds,
            "Time of each acquire call to the store."
        );
        describe_counter!(
            "lease_renewals_total",
            Unit::Count,
            "Renewals, one per lease in a batch, by outcome (renewed, lost, error)."
        );
        describe_histogram!(
            "lease_renew_duration_seconds",
            Unit::Seconds,
            "Time of each renew call (one batch) to the store."
        );
        describe_histogram!(
            "lease_renew_batch_size",
            Unit::Count,
            "Leases per renew call."
        );
        describe_histogram!(
            "lease_renewal_margin_seconds",
            Unit::Seconds,
            "At each successful renewal, the time the lease still had before its safety \
             deadline; a margin shrinking towards 0 comes before a loss."
        );
        describe_counter!(
            "lease_losses_total",
            Unit::Count,
            "Leases lost while held, by reason (deadline_passed, not_owner, heartbeat_stopped)."
        );
        describe_counter!(
            "lease_releases_total",
            Unit::Count,
            "Release calls to the store, by outcome (released, not_owner, or the error kind)."
        );
        describe_gauge!("lease_held", Unit::Count, "Leases this process holds now.");
        describe_gauge!(
            "lease_waiters",
            Unit::Count,
            "Callers waiting now for a held lease or permit."
        );
    }

    pub(crate) fn acquire(
        backend: &'static str,
        name: &LeaseName,
        outcome: &'static str,
        took: Duration,
    ) {
        counter!(
            "lease_acquire_attempts_total",
            labels(backend, name, Some(("outcome", outcome)))
        )
        .increment(1);
        histogram!(
            "lease_acquire_duration_seconds",
            labels(backend, name, None)
        )
        .record(took.as_secs_f64());
    }

    pub(crate) fn renew_call(backend: &'static str, leases: usize, took: Duration) {
        let labels = [Label::from_static_parts("backend", backend)];
        histogram!("lease_renew_duration_seconds", labels.iter()).record(took.as_secs_f64());
        // A batch size is a count far below 2^52; the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        histogram!("lease_renew_batch_size", labels.iter()).record(leases as f64);
    }

    pub(crate) fn renewal(backend: &'static str, name: &LeaseName, outcome: &'static str) {
        counter!(
            "lease_renewals_total",
            labels(backend, name, Some(("outcome", outcome)))
        )
        .increment(1);
    }

    pub(crate) fn renewal_margin(backend: &'static str, name: &LeaseName, margin: Duration) {
        histogram!("lease_renewal_margin_seconds", labels(backend, name, None))
            .record(margin.as_secs_f64());
    }

    pub(crate) fn loss(backend: &'static str, name: &LeaseName, reason: &'static str) {
        counter!(
            "lease_losses_total",
            labels(backend, name, Some(("reason", reason)))
        )
        .increment(1);
    }

    pub(crate) fn release(backend: &'static str, name: &LeaseName, outcome: &'static str) {
        counter!(
            "lease_releases_total",
            labels(backend, name, Some(("outcome", outcome)))
        )
        .increment(1);
    }

    pub(crate) fn held(backend: &'static str, name: &LeaseName, delta: f64) {
        gauge!("lease_held", labels(backend, name, None)).increment(delta);
    }

    pub(crate) fn waiters(backend: &'static str, name: &LeaseName, delta: f64) {
        gauge!("lease_waiters", labels(backend, name, None)).increment(delta);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    //! Without the feature: every report compiles to nothing.
    use std::time::Duration;

    use crate::types::LeaseName;

    pub(crate) fn describe() {}
    pub(crate) fn acquire(_: &'static str, _: &LeaseName, _: &'static str, _: Duration) {}
    pub(crate) fn renew_call(_: &'static str, _: usize, _: Duration) {}
    pub(crate) fn renewal(_: &'static str, _: &LeaseName, _: &'static str) {}
    pub(crate) fn renewal_margin(_: &'static str, _: &LeaseName, _: Duration) {}
    pub(crate) fn loss(_: &'static str, _: &LeaseName, _: &'static str) {}
    pub(crate) fn release(_: &'static str, _: &LeaseName, _: &'static str) {}
    pub(crate) fn held(_: &'static str, _: &LeaseName, _: f64) {}
    pub(crate) fn waiters(_: &'static str, _: &LeaseName, _: f64) {}
}

pub(crate) use imp::{acquire, held, loss, release, renew_call, renewal, renewal_margin, waiters};

/// Describes every series (help text and unit) to the installed recorder. The client
/// does so when it is created; call it again after installing a recorder later than
/// that. A no-op without the `metrics` feature.
pub fn describe() {
    imp::describe();
}

/// Adds the label `lease` (the lease name) to every per-lease series, process-wide, when
/// `on`. Off by default: each lease name is a series of its own in the exporter, so turn
/// it on only where the names are few and fixed.
#[cfg(feature = "metrics")]
pub fn set_lease_name_label(on: bool) {
    imp::set_lease_name_label(on);
}

/// Counts a waiter in `lease_waiters` while it lives (a caller waiting for a held lease
/// or permit), so that a cancelled wait is uncounted too.
pub(crate) struct Waiting {
    backend: &'static str,
    name: crate::types::LeaseName,
}

impl Waiting {
    pub(crate) fn new(backend: &'static str, name: &crate::types::LeaseName) -> Self {
        waiters(backend, name, 1.0);
        Waiting {
            backend,
            name: name.clone(),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        waiters(self.backend, &self.name, -1.0);
    }
}

/// The outcome word of a call's result, for metrics and spans.
pub(crate) trait Outcome {
    /// A short stable word for a successful reply.
    fn outcome(&self) -> &'static str;
}

impl<T: Outcome> Outcome for crate::error::Result<T> {
    fn outcome(&self) -> &'static str {
        match self {
            Ok(v) => v.outcome(),
            Err(e) => e.kind(),
        }
    }
}

impl Outcome for crate::types::AcquireOutcome {
    fn outcome(&self) -> &'static str {
        match self {
            crate::types::AcquireOutcome::Acquired { .. } => "acquired",
            crate::types::AcquireOutcome::Held(_) => "held",
        }
    }
}

impl Outcome for crate::types::ReleaseOutcome {
    fn outcome(&self) -> &'static str {
        match self {
            crate::types::ReleaseOutcome::Released => "released",
            crate::types::ReleaseOutcome::NotOwner => "not_owner",
        }
    }
}

impl Outcome for Vec<crate::types::RenewOutcome> {
    fn outcome(&self) -> &'static str {
        if self
            .iter()
            .all(|o| matches!(o, crate::types::RenewOutcome::Renewed))
        {
            "renewed"
        } else {
            "lost"
        }
    }
}

impl Outcome for Option<crate::types::LeaseInfo> {
    fn outcome(&self) -> &'static str {
        if self.is_some() { "held" } else { "free" }
    }
}

impl Outcome for () {
    fn outcome(&self) -> &'static str {
        "ok"
    }
}

impl Outcome for bool {
    fn outcome(&self) -> &'static str {
        if *self { "true" } else { "false" }
    }
}
