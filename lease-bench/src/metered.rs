//! The cost of metrics: the same `LeaseClient` cycle with the client's metrics recorded
//! by a Prometheus recorder and without.
//!
//! The benchmark is built with `lease-core`'s `metrics` feature, and installs one global
//! recorder, [`Switch`]: while no metered task runs it hands out no-op handles, so the client's
//! reports cost only building their keys; while on, a Prometheus recorder (its default
//! configuration: summaries for histograms) records them. The metered case's tasks turn it
//! on while they run; every other case runs with it off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{HolderLabel, LeaseBackend, LeaseClient};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use crate::cycles::Case;

/// How many tasks of the metered case run now; recording is on while any does (the
/// cases run one after another, never two at once).
static ON: AtomicUsize = AtomicUsize::new(0);

fn on() -> bool {
    ON.load(Ordering::Relaxed) > 0
}

/// A recorder that forwards to Prometheus while a metered task runs.
struct Switch(PrometheusRecorder);

impl Recorder for Switch {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if on() {
            self.0.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        // Gauges are recorded always: they count up and down, and a count taken with
        // recording off would not come down with it on.
        self.0.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if on() {
            self.0.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// Installs the switch (off) as the global recorder.
pub fn install() {
    let recorder = Switch(PrometheusBuilder::new().build_recorder());
    if metrics::set_global_recorder(recorder).is_err() {
        eprintln!("lease-bench: a metrics recorder was installed already");
    }
    lease_core::metrics::describe();
}

/// [`crate::cycles::client_case`] with recording on.
pub fn client_case(label: &str, backend: Arc<dyn LeaseBackend>) -> Case {
    let client = LeaseClient::with_label(backend, HolderLabel::new("bench").expect("label"));
    Case::new(label, move |prefix, n| {
        let client = client.clone();
        async move {
            ON.fetch_add(1, Ordering::SeqCst);
            crate::cycles::client_cycles(client, prefix, n).await;
            ON.fetch_sub(1, Ordering::SeqCst);
        }
    })
}

/// What the metrics cost per `LeaseClient` acquire + release, without a store's round
/// trip to hide it: cycles on the in-memory backend, in 20 alternating slices of 20,000
/// with recording off and on. Returns the note line.
pub async fn memory_cost() -> String {
    let backend: Arc<dyn LeaseBackend> = Arc::new(lease_core::MemoryBackend::new());
    let client = LeaseClient::with_label(backend, HolderLabel::new("bench").expect("label"));
    let cycle = |client: LeaseClient, n: usize| async move {
        let start = std::time::Instant::now();
        crate::cycles::client_cycles(client, "mem".to_owned(), n).await;
        start.elapsed()
    };
    let n = 20_000;
    cycle(client.clone(), n).await;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        off.push(cycle(client.clone(), n).await);
        ON.fetch_add(1, Ordering::SeqCst);
        on.push(cycle(client.clone(), n).await);
        ON.fetch_sub(1, Ordering::SeqCst);
    }
    let median_ns = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2].as_secs_f64() * 1e9 / n as f64
    };
    let (off, on) = (median_ns(&mut off), median_ns(&mut on));
    format!(
        "Metrics cost without a store to hide it: `LeaseClient` try_acquire + release on the \
         in-memory backend, one task, median of 10 alternating slices of {n} cycles: \
         {off:.0} ns per cycle with recording off, {on:.0} ns with it on (Prometheus): \
         {:.0} ns per cycle for the metrics",
        on - off
    )
}
