//! Log volume of the shared layer: an outage of 1,000 leases costs a line per failed
//! renewal batch, not one per lease. A binary of its own, because it installs a global
//! subscriber to count what every task logs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{Fault, FaultyBackend, Op};
use lease_core::{HolderLabel, LeaseClient, LeaseOptions, MemoryBackend, TryAcquire};

/// Counts WARN events by message.
#[derive(Clone, Default)]
struct WarnCounter(Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarnCounter {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        *self.0.lock().unwrap().entry(m.0).or_default() += 1;
    }
}

/// An outage costs one log line per failed renewal batch and one for the leases lost
/// together, not one per lease: 1,000 leases, the store down until they are lost.
#[tokio::test(start_paused = true)]
async fn an_outage_logs_per_batch_not_per_lease() {
    use tracing_subscriber::layer::SubscriberExt;
    let counter = WarnCounter::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(counter.clone()))
        .unwrap();
    let faulty = Arc::new(FaultyBackend::new(Arc::new(MemoryBackend::new())));
    let client = LeaseClient::with_label(faulty.clone(), HolderLabel::new("outage").unwrap());
    let opts = LeaseOptions::new(Duration::from_secs(30)).unwrap();
    let mut guards = Vec::new();
    for i in 0..1000 {
        match client
            .try_acquire(format!("lease-{i}"), &opts)
            .await
            .unwrap()
        {
            TryAcquire::Acquired(g) => guards.push(g),
            TryAcquire::Held(by) => panic!("held by {by}"),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
    }
    faulty.set(Op::Renew, Fault::Fail);
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert!(guards.iter().all(|g| !g.is_held()));
    let renew_calls = faulty.renew_log().len();
    let counts = counter.0.lock().unwrap().clone();
    let failed = counts
        .get("renewal failed; retrying until the safety deadline")
        .copied()
        .unwrap_or(0);
    let lost = counts.get("leases lost").copied().unwrap_or(0);
    assert!(renew_calls >= 5, "{renew_calls} renew calls");
    assert_eq!(
        failed, renew_calls,
        "one warning per failed batch: {counts:?}"
    );
    assert_eq!(
        lost, 1,
        "one warning for the 1,000 leases lost together: {counts:?}"
    );
    assert_eq!(counts.values().sum::<usize>(), failed + lost, "{counts:?}");
}
