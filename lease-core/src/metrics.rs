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
    use std::collections::HashMap;
    use std::hash::{BuildHasherDefault, Hash, Hasher};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{OnceLock, RwLock};
    use std::time::Duration;

    use metrics::{Key, Label, Level, Metadata};
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

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

    /// The metadata every report carries (what the `metrics` macros would give it).
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    /// A `&'static str` by identity (address and length): the cache's keys are the
    /// literals and the backends' names, each one place in the binary.
    #[derive(Clone, Copy)]
    struct Id(&'static str);

    impl PartialEq for Id {
        fn eq(&self, other: &Self) -> bool {
            std::ptr::eq(self.0, other.0)
        }
    }

    impl Eq for Id {}

    impl Hash for Id {
        fn hash<H: Hasher>(&self, state: &mut H) {
            state.write_usize(self.0.as_ptr() as usize);
            state.write_usize(self.0.len());
        }
    }

    /// Multiply-and-rotate over a few words: the cache's keys are addresses, not input.
    #[derive(Default)]
    struct WordHasher(u64);

    impl Hasher for WordHasher {
        fn finish(&self) -> u64 {
            self.0
        }

        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.write_u64(u64::from(*b));
            }
        }

        fn write_u64(&mut self, word: u64) {
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }

        fn write_usize(&mut self, word: usize) {
            self.write_u64(word as u64);
        }
    }

    type Parts = (Id, Id, Option<(Id, Id)>);
    type Keys = HashMap<Parts, Key, BuildHasherDefault<WordHasher>>;

    /// Keys made at most this many times (each leaks its few labels): far above what a
    /// process makes (series names x backends x outcomes); past it, keys are made per
    /// report as without the cache.
    const MAX_KEYS: usize = 4096;

    /// Set once the cache holds [`MAX_KEYS`]: a key not in it is then made per report,
    /// without taking the write lock.
    static FULL: AtomicBool = AtomicBool::new(false);

    fn keys() -> &'static RwLock<Keys> {
        static KEYS: OnceLock<RwLock<Keys>> = OnceLock::new();
        KEYS.get_or_init(RwLock::default)
    }

    /// The key of a series: made once per series, backend and label and kept, so that a
    /// report makes no allocation and hashes no labels (the key's hash is computed when
    /// it is made). With the `lease` label on, made per report.
    fn key(
        name: &'static str,
        backend: &'static str,
        lease: &LeaseName,
        extra: Option<(&'static str, &'static str)>,
    ) -> Key {
        if NAME_LABEL.load(Ordering::Relaxed) {
            return Key::from_parts(name, labels(backend, lease, extra));
        }
        let parts = (Id(name), Id(backend), extra.map(|(k, v)| (Id(k), Id(v))));
        // A poisoned lock only means a panic elsewhere while it was held; the map is
        // still whole (an insert either happened or did not).
        let cache = keys();
        if let Some(k) = cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&parts)
        {
            return k.clone();
        }
        if FULL.load(Ordering::Relaxed) {
            return Key::from_parts(name, labels(backend, lease, extra));
        }
        let mut map = cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(k) = map.get(&parts) {
            return k.clone();
        }
        if map.len() >= MAX_KEYS {
            FULL.store(true, Ordering::Relaxed);
            return Key::from_parts(name, labels(backend, lease, extra));
        }
        let mut set = vec![Label::from_static_parts("backend", backend)];
        if let Some((k, v)) = extra {
            set.push(Label::from_static_parts(k, v));
        }
        let key = Key::from_static_parts(name, Box::leak(set.into_boxed_slice()));
        map.insert(parts, key.clone());
        key
    }

    /// The keys of the series a client reports on every acquire and release, made once
    /// when the client is made: a report then looks nothing up (the process-wide map
    /// behind [`key`] takes a lock and a hash per report). Outcomes outside these (error
    /// kinds, losses) and every report with the `lease` label on go through [`key`].
    struct ClientKeys {
        backend: &'static str,
        acquired: Key,
        held_elsewhere: Key,
        acquire_duration: Key,
        released: Key,
        not_owner: Key,
        held: Key,
    }

    /// A client's series (cheap to clone: one shared allocation).
    #[derive(Clone)]
    pub(crate) struct Series(std::sync::Arc<ClientKeys>);

    impl std::fmt::Debug for Series {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_tuple("Series").field(&self.0.backend).finish()
        }
    }

    impl Series {
        pub(crate) fn new(backend: &'static str) -> Self {
            let key = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
                let mut set = vec![Label::from_static_parts("backend", backend)];
                if let Some((k, v)) = extra {
                    set.push(Label::from_static_parts(k, v));
                }
                Key::from_parts(name, set)
            };
            Series(std::sync::Arc::new(ClientKeys {
                backend,
                acquired: key(
                    "lease_acquire_attempts_total",
                    Some(("outcome", "acquired")),
                ),
                held_elsewhere: key("lease_acquire_attempts_total", Some(("outcome", "held"))),
                acquire_duration: key("lease_acquire_duration_seconds", None),
                released: key("lease_releases_total", Some(("outcome", "released"))),
                not_owner: key("lease_releases_total", Some(("outcome", "not_owner"))),
                held: key("lease_held", None),
            }))
        }

        /// Whether reports carry the `lease` label, which the made keys lack.
        fn per_lease() -> bool {
            NAME_LABEL.load(Ordering::Relaxed)
        }

        pub(crate) fn acquire(&self, name: &LeaseName, outcome: &'static str, took: Duration) {
            let k = &*self.0;
            let attempts = match outcome {
                _ if Self::per_lease() => None,
                "acquired" => Some(&k.acquired),
                "held" => Some(&k.held_elsewhere),
                _ => None,
            };
            let Some(attempts) = attempts else {
                return acquire(k.backend, name, outcome, took);
            };
            count(attempts, 1);
            record(&k.acquire_duration, took.as_secs_f64());
        }

        pub(crate) fn release(&self, name: &LeaseName, outcome: &'static str) {
            let k = &*self.0;
            match outcome {
                _ if Self::per_lease() => release(k.backend, name, outcome),
                "released" => count(&k.released, 1),
                "not_owner" => count(&k.not_owner, 1),
                _ => release(k.backend, name, outcome),
            }
        }

        pub(crate) fn held(&self, name: &LeaseName, delta: f64) {
            if Self::per_lease() {
                held(self.0.backend, name, delta);
            } else {
                move_gauge(&self.0.held, delta);
            }
        }

        pub(crate) fn loss(&self, name: &LeaseName, reason: &'static str) {
            loss(self.0.backend, name, reason);
        }
    }

    fn count(key: &Key, by: u64) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(by);
    }

    fn record(key: &Key, value: f64) {
        metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(value);
    }

    fn move_gauge(key: &Key, delta: f64) {
        metrics::with_recorder(|r| r.register_gauge(key, &METADATA)).increment(delta);
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
        count(
            &key(
                "lease_acquire_attempts_total",
                backend,
                name,
                Some(("outcome", outcome)),
            ),
            1,
        );
        record(
            &key("lease_acquire_duration_seconds", backend, name, None),
            took.as_secs_f64(),
        );
    }

    pub(crate) fn renew_call(backend: &'static str, leases: usize, took: Duration) {
        let labels = [Label::from_static_parts("backend", backend)];
        metrics::histogram!("lease_renew_duration_seconds", labels.iter())
            .record(took.as_secs_f64());
        // A batch size is a count far below 2^52; the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        metrics::histogram!("lease_renew_batch_size", labels.iter()).record(leases as f64);
    }

    pub(crate) fn renewal(backend: &'static str, name: &LeaseName, outcome: &'static str) {
        count(
            &key(
                "lease_renewals_total",
                backend,
                name,
                Some(("outcome", outcome)),
            ),
            1,
        );
    }

    /// The successful renewals of one renew call, reported together: without the `lease`
    /// label every lease of a batch reports to the same two series, so their handles are
    /// registered once per batch and the counter moved once, instead of two key lookups
    /// and registrations per lease (at a million leases, a measurable part of the
    /// heartbeat's work). With the label, each lease reports as it is renewed.
    pub(crate) struct Renewals {
        backend: &'static str,
        /// The margin histogram, the counter and the count so far, registered at the
        /// first renewal (with the recorder installed then, as every report is).
        batch: Option<(metrics::Histogram, metrics::Counter, u64)>,
    }

    impl Renewals {
        pub(crate) fn new(backend: &'static str) -> Self {
            Renewals {
                backend,
                batch: None,
            }
        }

        /// One lease renewed with `margin` left before its safety deadline.
        pub(crate) fn renewed(&mut self, name: &LeaseName, margin: Duration) {
            if Series::per_lease() {
                renewal(self.backend, name, "renewed");
                renewal_margin(self.backend, name, margin);
                return;
            }
            let backend = self.backend;
            let (margins, _, n) = self.batch.get_or_insert_with(|| {
                let margins = key("lease_renewal_margin_seconds", backend, name, None);
                let renewed = key(
                    "lease_renewals_total",
                    backend,
                    name,
                    Some(("outcome", "renewed")),
                );
                metrics::with_recorder(|r| {
                    (
                        r.register_histogram(&margins, &METADATA),
                        r.register_counter(&renewed, &METADATA),
                        0,
                    )
                })
            });
            margins.record(margin.as_secs_f64());
            *n += 1;
        }

        /// Moves the counter of renewals by the batch's count.
        pub(crate) fn finish(self) {
            if let Some((_, counter, n)) = self.batch {
                counter.increment(n);
            }
        }
    }

    pub(crate) fn renewal_margin(backend: &'static str, name: &LeaseName, margin: Duration) {
        record(
            &key("lease_renewal_margin_seconds", backend, name, None),
            margin.as_secs_f64(),
        );
    }

    pub(crate) fn loss(backend: &'static str, name: &LeaseName, reason: &'static str) {
        count(
            &key(
                "lease_losses_total",
                backend,
                name,
                Some(("reason", reason)),
            ),
            1,
        );
    }

    pub(crate) fn release(backend: &'static str, name: &LeaseName, outcome: &'static str) {
        count(
            &key(
                "lease_releases_total",
                backend,
                name,
                Some(("outcome", outcome)),
            ),
            1,
        );
    }

    pub(crate) fn held(backend: &'static str, name: &LeaseName, delta: f64) {
        move_gauge(&key("lease_held", backend, name, None), delta);
    }

    pub(crate) fn waiters(backend: &'static str, name: &LeaseName, delta: f64) {
        move_gauge(&key("lease_waiters", backend, name, None), delta);
    }

    #[cfg(test)]
    mod tests {
        #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        use metrics_util::{CompositeKey, MetricKind};

        use super::*;

        fn labels_of(key: &CompositeKey) -> Vec<(String, String)> {
            key.key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect()
        }

        /// A client's made keys report the same series as the per-report keys: the
        /// same names, labels and counts, for the outcomes they hold and (through the
        /// process-wide keys) for the others; so do a renew call's renewals reported
        /// together ([`Renewals`]).
        #[test]
        fn a_clients_keys_report_the_same_series() {
            let snapshot = |report: &dyn Fn()| {
                let recorder = DebuggingRecorder::new();
                let snapshotter = recorder.snapshotter();
                metrics::with_local_recorder(&recorder, report);
                let mut seen: Vec<String> = snapshotter
                    .snapshot()
                    .into_vec()
                    .into_iter()
                    .map(|(key, _, _, value)| {
                        let value = match value {
                            DebugValue::Counter(n) => format!("{n}"),
                            DebugValue::Gauge(g) => format!("{}", g.into_inner()),
                            DebugValue::Histogram(h) => format!("{} samples", h.len()),
                        };
                        format!("{} {:?} {value}", key.key().name(), labels_of(&key))
                    })
                    .collect();
                seen.sort();
                seen
            };
            let name = LeaseName::new("series").unwrap();
            let took = Duration::from_millis(3);
            let series = Series::new("series-test");
            let outcomes = ["acquired", "held", "acquired", "unavailable"];
            let releases = ["released", "not_owner", "timeout"];
            let through_series = || {
                for o in outcomes {
                    series.acquire(&name, o, took);
                }
                for o in releases {
                    series.release(&name, o);
                }
                series.held(&name, 1.0);
                series.held(&name, 1.0);
                series.held(&name, -1.0);
                series.loss(&name, "deadline_passed");
            };
            let per_report = || {
                for o in outcomes {
                    acquire("series-test", &name, o, took);
                }
                for o in releases {
                    release("series-test", &name, o);
                }
                held("series-test", &name, 1.0);
                held("series-test", &name, 1.0);
                held("series-test", &name, -1.0);
                loss("series-test", &name, "deadline_passed");
            };
            let made = snapshot(&through_series);
            assert_eq!(made, snapshot(&per_report));
            assert_eq!(made.len(), 9, "{made:#?}");
            let batch = || {
                let mut renewals = Renewals::new("series-test");
                for ms in [5, 7, 9] {
                    renewals.renewed(&name, Duration::from_millis(ms));
                }
                renewals.finish();
                renewal("series-test", &name, "error");
            };
            let each = || {
                for ms in [5, 7, 9] {
                    renewal("series-test", &name, "renewed");
                    renewal_margin("series-test", &name, Duration::from_millis(ms));
                }
                renewal("series-test", &name, "error");
            };
            let renewed = snapshot(&batch);
            assert_eq!(renewed, snapshot(&each));
            assert_eq!(
                renewed,
                [
                    r#"lease_renewal_margin_seconds [("backend", "series-test")] 3 samples"#,
                    r#"lease_renewals_total [("backend", "series-test"), ("outcome", "error")] 1"#,
                    r#"lease_renewals_total [("backend", "series-test"), ("outcome", "renewed")] 3"#,
                ]
            );
            // A batch with no renewal reports nothing.
            assert!(snapshot(&|| Renewals::new("series-test").finish()).is_empty());

            // With the `lease` label on (process-wide, so not switched here: the other
            // tests of this binary run at the same time), reports take the per-report
            // keys; lease-lab's `metrics` tests read them back from real stores.
        }

        /// The cached keys carry the same labels as keys made per report, reports
        /// through one cached key add up in one series, and a key cached while no
        /// recorder was installed reports to the one installed later.
        #[test]
        fn cached_keys_carry_the_backend_and_outcome_labels() {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            let name = LeaseName::new("cached-keys").unwrap();
            // No recorder yet: the key is made and cached, the report goes nowhere.
            acquire("cache-test", &name, "acquired", Duration::from_millis(2));
            let cached = |outcome: &'static str| {
                keys().read().unwrap().iter().any(|((n, b, extra), _)| {
                    n.0 == "lease_acquire_attempts_total"
                        && b.0 == "cache-test"
                        && extra.is_some_and(|(_, v)| v.0 == outcome)
                })
            };
            assert!(cached("acquired"), "the key was not cached");
            metrics::with_local_recorder(&recorder, || {
                for _ in 0..3 {
                    acquire("cache-test", &name, "acquired", Duration::from_millis(2));
                }
                acquire("cache-test", &name, "held", Duration::from_millis(1));
                held("cache-test", &name, 1.0);
                held("cache-test", &name, 1.0);
                held("cache-test", &name, -1.0);
                release("cache-test", &name, "released");
                loss("cache-test", &name, "not_owner");
            });
            let mut seen = Vec::new();
            for (key, _, _, value) in snapshotter.snapshot().into_vec() {
                let name = key.key().name().to_owned();
                let labels = labels_of(&key);
                let kind = key.kind();
                let value = match (kind, value) {
                    (MetricKind::Counter, DebugValue::Counter(n)) => format!("{n}"),
                    (MetricKind::Gauge, DebugValue::Gauge(g)) => format!("{}", g.into_inner()),
                    (MetricKind::Histogram, DebugValue::Histogram(h)) => {
                        format!("{} samples", h.len())
                    }
                    other => panic!("{name}: {other:?}"),
                };
                seen.push(format!("{name} {labels:?} {value}"));
            }
            seen.sort();
            let backend = ("backend".to_owned(), "cache-test".to_owned());
            let with = |k: &str, v: &str| vec![backend.clone(), (k.to_owned(), v.to_owned())];
            let mut want = vec![
                format!(
                    "lease_acquire_attempts_total {:?} 3",
                    with("outcome", "acquired")
                ),
                format!(
                    "lease_acquire_attempts_total {:?} 1",
                    with("outcome", "held")
                ),
                format!(
                    "lease_acquire_duration_seconds {:?} 4 samples",
                    vec![backend.clone()]
                ),
                format!("lease_held {:?} 1", vec![backend.clone()]),
                format!("lease_losses_total {:?} 1", with("reason", "not_owner")),
                format!("lease_releases_total {:?} 1", with("outcome", "released")),
            ];
            want.sort();
            assert_eq!(seen, want);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    //! Without the feature: every report compiles to nothing.
    use std::time::Duration;

    use crate::types::LeaseName;

    /// Without the feature: nothing to keep.
    #[derive(Clone, Debug)]
    pub(crate) struct Series;

    impl Series {
        pub(crate) fn new(_: &'static str) -> Self {
            Series
        }
        pub(crate) fn acquire(&self, _: &LeaseName, _: &'static str, _: Duration) {}
        pub(crate) fn release(&self, _: &LeaseName, _: &'static str) {}
        pub(crate) fn held(&self, _: &LeaseName, _: f64) {}
        pub(crate) fn loss(&self, _: &LeaseName, _: &'static str) {}
    }

    pub(crate) fn describe() {}
    pub(crate) fn renew_call(_: &'static str, _: usize, _: Duration) {}
    pub(crate) fn renewal(_: &'static str, _: &LeaseName, _: &'static str) {}

    /// Without the feature: nothing to report.
    pub(crate) struct Renewals;

    impl Renewals {
        pub(crate) fn new(_: &'static str) -> Self {
            Renewals
        }
        pub(crate) fn renewed(&mut self, _: &LeaseName, _: Duration) {}
        pub(crate) fn finish(self) {}
    }
    pub(crate) fn waiters(_: &'static str, _: &LeaseName, _: f64) {}
}

pub(crate) use imp::{Renewals, Series, renew_call, renewal, waiters};

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
