//! The metrics the client reports (feature `metrics`), read back through a debugging
//! recorder, on real stores: acquires (acquired, held), a waiter, renewals and their
//! margins, a lease an operator frees by force (lost: not owner), a release, and on a
//! paused Redis renewals that fail until the safety deadline (lost: deadline passed).
//!
//! One recorder serves the whole test binary, with the `lease` label on, so that each
//! test reads only the series of its own lease names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use leasehold::{LeaseBackend, LeaseClient, LeaseOptions, LossReason, TryAcquire};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::Instant;

/// Everything the recorder has seen. A snapshot drains the recorder (counters and
/// gauges are swapped to 0, histograms emptied), and the tests of this binary take
/// snapshots at the same time, so every snapshot is added here: counters and the
/// gauges' increments summed, histogram values kept.
struct Recorded {
    snapshotter: Snapshotter,
    totals: Mutex<HashMap<CompositeKey, Total>>,
}

#[derive(Clone, Debug)]
enum Total {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        leasehold::metrics::set_lease_name_label(true);
        Recorded {
            snapshotter,
            totals: Mutex::new(HashMap::new()),
        }
    })
}

/// One reading of every series whose labels include all of the labels asked for, named
/// `name{k=v,...}` without them and without `backend` (each test reads one backend).
#[derive(Debug, Default)]
struct Reading {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    histograms: HashMap<String, Vec<f64>>,
}

fn series(key: &CompositeKey, skip: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = key
        .key()
        .labels()
        .filter(|l| l.key() != "backend")
        .filter(|l| !skip.iter().any(|(k, v)| l.key() == *k && l.value() == *v))
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    if labels.is_empty() {
        key.key().name().to_string()
    } else {
        format!("{}{{{}}}", key.key().name(), labels.join(","))
    }
}

fn read(labels: &[(&str, &str)]) -> Reading {
    let rec = recorded();
    let mut totals = rec.totals.lock().unwrap();
    for (key, _, _, value) in rec.snapshotter.snapshot().into_vec() {
        let total = totals.entry(key).or_insert_with(|| match value {
            DebugValue::Counter(_) => Total::Counter(0),
            DebugValue::Gauge(_) => Total::Gauge(0.0),
            DebugValue::Histogram(_) => Total::Histogram(Vec::new()),
        });
        match (total, value) {
            (Total::Counter(t), DebugValue::Counter(n)) => *t += n,
            (Total::Gauge(t), DebugValue::Gauge(g)) => *t += g.into_inner(),
            (Total::Histogram(t), DebugValue::Histogram(v)) => {
                t.extend(v.iter().map(|x| x.into_inner()));
            }
            (t, v) => panic!("a series changed kind: {t:?} then {v:?}"),
        }
    }
    let mut reading = Reading::default();
    for (key, total) in totals.iter() {
        let matches = labels
            .iter()
            .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v));
        if !matches {
            continue;
        }
        let name = series(key, labels);
        match total {
            Total::Counter(n) => {
                reading.counters.insert(name, *n);
            }
            Total::Gauge(g) => {
                reading.gauges.insert(name, *g);
            }
            Total::Histogram(v) => {
                reading.histograms.insert(name, v.clone());
            }
        }
    }
    reading
}

fn counter(r: &Reading, s: &str) -> u64 {
    r.counters.get(s).copied().unwrap_or(0)
}

fn gauge(r: &Reading, s: &str) -> f64 {
    r.gauges.get(s).copied().unwrap_or(0.0)
}

/// Waits (up to 10 s) until `ok` holds for the series of `lease`.
async fn until(lease: &str, what: &str, ok: impl Fn(&Reading) -> bool) -> Reading {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let r = read(&[("lease", lease)]);
        if ok(&r) {
            return r;
        }
        assert!(Instant::now() < give_up, "{lease}: never {what}: {r:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Holds two leases, keeps a waiter on one, loses the other to a forced release,
/// releases the first, and checks every series on the way.
async fn lifecycle(store: &str, backend: Arc<dyn LeaseBackend>) {
    let _ = recorded();
    let backend_label = backend.capabilities().backend;
    let ns = uuid::Uuid::new_v4().simple().to_string();
    let kept = format!("metrics/{store}/{ns}/kept");
    let doomed = format!("metrics/{store}/{ns}/doomed");
    let client = LeaseClient::new(backend.clone());
    let ttl = Duration::from_secs(2);
    let opts = LeaseOptions::builder(ttl)
        .renew_every(Duration::from_millis(200))
        .build()
        .unwrap();
    let kept_guard = client.acquire(&kept, &opts).await.expect("acquire");
    let doomed_guard = client.acquire(&doomed, &opts).await.expect("acquire");

    // Another client is refused, then waits.
    let other = LeaseClient::new(backend.clone());
    assert!(matches!(
        other.try_acquire(&kept, &opts).await.expect("try"),
        TryAcquire::Held(_)
    ));
    let waiting = {
        let opts = LeaseOptions::builder(ttl)
            .wait(Duration::from_secs(60))
            .build()
            .unwrap();
        let (other, kept) = (other.clone(), kept.clone());
        tokio::spawn(async move { other.acquire(&kept, &opts).await })
    };
    let r = until(&kept, "counted the waiter", |r| {
        gauge(r, "lease_waiters") == 1.0
    })
    .await;
    assert_eq!(
        counter(&r, "lease_acquire_attempts_total{outcome=acquired}"),
        1
    );
    assert!(
        counter(&r, "lease_acquire_attempts_total{outcome=held}") >= 2,
        "{r:#?}"
    );
    assert_eq!(gauge(&r, "lease_held"), 1.0);
    let acquire_times = &r.histograms["lease_acquire_duration_seconds"];
    assert!(acquire_times.len() >= 3, "{r:#?}");
    assert!(acquire_times.iter().all(|t| *t > 0.0 && *t < 5.0), "{r:#?}");
    waiting.abort();
    let _ = waiting.await;
    until(&kept, "uncounted the cancelled waiter", |r| {
        gauge(r, "lease_waiters") == 0.0
    })
    .await;

    // An operator frees `doomed`: its next renewal hears that it is no longer ours.
    assert!(
        backend
            .force_release(&leasehold::LeaseName::new(&doomed).unwrap())
            .await
            .unwrap()
    );
    assert_eq!(doomed_guard.lost().await, LossReason::NotOwner);
    let r = until(&doomed, "counted the loss", |r| {
        counter(r, "lease_losses_total{reason=not_owner}") == 1
    })
    .await;
    assert_eq!(
        counter(&r, "lease_renewals_total{outcome=lost}"),
        1,
        "{r:#?}"
    );
    assert_eq!(gauge(&r, "lease_held"), 0.0, "{r:#?}");
    drop(doomed_guard);

    // `kept` renews: each renewal counted, with the margin it had left (between 0 and
    // the TTL less the safety margin).
    let r = until(&kept, "renewed three times", |r| {
        counter(r, "lease_renewals_total{outcome=renewed}") >= 3
    })
    .await;
    let margins = &r.histograms["lease_renewal_margin_seconds"];
    assert!(margins.len() >= 3, "{r:#?}");
    assert!(
        margins.iter().all(|m| *m > 0.0 && *m < ttl.as_secs_f64()),
        "{margins:?}"
    );
    assert_eq!(
        counter(&r, "lease_renewals_total{outcome=error}"),
        0,
        "{r:#?}"
    );
    assert_eq!(
        counter(&r, "lease_losses_total{reason=not_owner}"),
        0,
        "{r:#?}"
    );

    kept_guard.release().await.expect("release");
    let r = read(&[("lease", &kept)]);
    assert_eq!(
        counter(&r, "lease_releases_total{outcome=released}"),
        1,
        "{r:#?}"
    );
    assert_eq!(gauge(&r, "lease_held"), 0.0, "{r:#?}");

    // The renew calls, per backend: their time and batch sizes.
    let r = read(&[("backend", backend_label)]);
    let sizes = r
        .histograms
        .get("lease_renew_batch_size")
        .unwrap_or_else(|| panic!("no batch sizes: {r:#?}"));
    assert!(sizes.iter().all(|s| *s >= 1.0), "{sizes:?}");
    assert!(r.histograms.contains_key("lease_renew_duration_seconds"));
    eprintln!("{store}: metrics as expected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_metrics() {
    lifecycle("memory", Arc::new(leasehold::MemoryBackend::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_metrics() {
    let server = lease_test_servers::RedisServer::start().await.unwrap();
    lifecycle("redis", leasehold::connect(&server.url()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_metrics() {
    let db = lease_test_servers::PostgresServer::shared().await.unwrap();
    lifecycle("postgres", leasehold::connect(&db.url()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_metrics() {
    let server = lease_test_servers::EtcdServer::start().await.unwrap();
    lifecycle("etcd", leasehold::connect(&server.url()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_metrics() {
    let db = lease_test_servers::MariaDbServer::shared().await.unwrap();
    lifecycle("mysql", leasehold::connect(&db.url()).await.unwrap()).await;
}

/// A paused Redis: the renewals time out (counted as errors, by kind in the spans) until
/// the safety deadline passes, and the loss is counted with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_renewals_fail_until_the_deadline() {
    let _ = recorded();
    let server = lease_test_servers::RedisServer::start_owned()
        .await
        .unwrap();
    let backend = leasehold::connect(&server.url()).await.unwrap();
    let client = LeaseClient::new(backend);
    let name = format!("metrics/paused/{}", uuid::Uuid::new_v4().simple());
    let opts = LeaseOptions::builder(Duration::from_secs(1))
        .renew_every(Duration::from_millis(200))
        .call_timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let guard = client.acquire(&name, &opts).await.expect("acquire");
    until(&name, "renewed", |r| {
        counter(r, "lease_renewals_total{outcome=renewed}") >= 1
    })
    .await;
    server.pause().unwrap();
    let reason = guard.lost().await;
    server.resume().unwrap();
    assert_eq!(reason, LossReason::DeadlinePassed);
    let r = until(&name, "counted the loss", |r| {
        counter(r, "lease_losses_total{reason=deadline_passed}") == 1
    })
    .await;
    assert!(
        counter(&r, "lease_renewals_total{outcome=error}") >= 1,
        "{r:#?}"
    );
    assert_eq!(gauge(&r, "lease_held"), 0.0, "{r:#?}");
    drop(guard);
}
