//! Handoff (a waiting acquirer gets the lease how long after the holder releases) and
//! takeover (how long after the holder is killed).

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease_core::{
    AcquireOutcome, Capabilities, HolderLabel, LeaseBackend, LeaseClient, LeaseInfo, LeaseName,
    LeaseOptions, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result, TryAcquire,
};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The backend without its release notification: the client then polls with its
/// backoff, as it does on a store that cannot notify.
#[derive(Debug)]
struct Polling(Arc<dyn LeaseBackend>);

#[async_trait]
impl LeaseBackend for Polling {
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.0.capabilities();
        caps.release_notification = false;
        caps
    }
    async fn acquire(
        &self,
        name: &LeaseName,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<AcquireOutcome> {
        self.0.acquire(name, owner, ttl).await
    }
    async fn renew(&self, leases: &[RenewItem], ttl: Duration) -> Result<Vec<RenewOutcome>> {
        self.0.renew(leases, ttl).await
    }
    async fn release(
        &self,
        name: &LeaseName,
        token: &OwnerToken,
        keep_for: Duration,
    ) -> Result<ReleaseOutcome> {
        self.0.release(name, token, keep_for).await
    }
    async fn inspect(&self, name: &LeaseName) -> Result<Option<LeaseInfo>> {
        self.0.inspect(name).await
    }
}

/// Percentiles of a latency sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 99th percentile (the maximum when there are fewer than 100 samples).
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
    /// Samples.
    pub n: usize,
}

impl Latency {
    fn of(mut v: Vec<Duration>) -> Latency {
        v.sort();
        let n = v.len();
        if n == 0 {
            return Latency::default();
        }
        let p99 = ((n * 99).div_ceil(100)).clamp(1, n) - 1;
        Latency {
            p50: v[n / 2],
            p99: v[p99],
            max: v[n - 1],
            n,
        }
    }
}

/// The holder takes a lease and keeps it 20 to 120 ms (uniformly, so that a polling
/// waiter is caught at every phase of its backoff); the waiter, already waiting in
/// `LeaseClient::acquire` with the default backoff, is timed from the holder's
/// `release()` call to holding the lease.
pub async fn handoff(backend: Arc<dyn LeaseBackend>, polling: bool, rounds: usize) -> Latency {
    let holder =
        LeaseClient::with_label(backend.clone(), HolderLabel::new("holder").expect("label"));
    let waiter_backend: Arc<dyn LeaseBackend> = if polling {
        Arc::new(Polling(backend))
    } else {
        backend
    };
    let waiter =
        LeaseClient::with_label(waiter_backend, HolderLabel::new("waiter").expect("label"));
    let opts = LeaseOptions::builder(Duration::from_secs(10))
        .wait(Duration::from_secs(10))
        .build()
        .expect("options");
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let name = format!("handoff-{tag}-{round}");
        let guard = match holder
            .try_acquire(&name, &opts)
            .await
            .expect("holder acquire")
        {
            TryAcquire::Acquired(g) => g,
            TryAcquire::Held(by) => panic!("{name} held by {by}"),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        };
        let w = spawn_waiter(&waiter, &opts, &name);
        tokio::time::sleep(Duration::from_millis(20 + fastrand::u64(0..100))).await;
        let released = Instant::now();
        guard.release().await.expect("holder release");
        let got = w.await.expect("waiter task");
        samples.push(got.saturating_duration_since(released));
    }
    Latency::of(samples)
}

/// A waiter task: waits for `name` in `LeaseClient::acquire`, notes when it got it,
/// releases it, and returns that instant.
fn spawn_waiter(
    waiter: &LeaseClient,
    opts: &LeaseOptions,
    name: &str,
) -> tokio::task::JoinHandle<Instant> {
    let (waiter, opts, name) = (waiter.clone(), opts.clone(), name.to_owned());
    tokio::spawn(async move {
        let g = waiter.acquire(&name, &opts).await.expect("waiter acquire");
        let at = Instant::now();
        g.release().await.expect("waiter release");
        at
    })
}

/// One takeover measurement series.
#[derive(Clone, Debug)]
pub struct Takeover {
    /// TTL asked for.
    pub ttl: Duration,
    /// TTL the store applies.
    pub effective_ttl: Duration,
    /// Times from SIGKILL of the holder process to the waiter holding the lease.
    pub latency: Latency,
}

/// The holder is a child process (this binary's `hold` mode) renewing every TTL/3; it is
/// SIGKILLed while a waiter in this process waits in `LeaseClient::acquire`. Timed from
/// the kill to the waiter holding the lease; expected between 2/3 TTL and TTL (what was
/// left of the holder's last renewal) plus the waiter's wake-up.
pub async fn takeover(
    backend: Arc<dyn LeaseBackend>,
    url: &str,
    ttl: Duration,
    rounds: usize,
) -> Takeover {
    let effective_ttl = backend.capabilities().effective_ttl(ttl);
    let waiter = LeaseClient::with_label(backend, HolderLabel::new("waiter").expect("label"));
    let opts = LeaseOptions::builder(ttl)
        .wait(ttl * 3 + Duration::from_secs(10))
        .build()
        .expect("options");
    let exe = std::env::current_exe().expect("current exe");
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let name = format!("takeover-{tag}-{round}");
        let mut child = tokio::process::Command::new(&exe)
            .arg("hold")
            .arg(url)
            .arg(&name)
            .arg(ttl.as_millis().to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the holder process");
        let stdout = child.stdout.take().expect("holder stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("holder did not report within 30 s")
            .expect("holder stdout");
        assert!(
            line.as_deref().is_some_and(|l| l.starts_with("held")),
            "holder said {line:?}"
        );
        let w = spawn_waiter(&waiter, &opts, &name);
        // Let the waiter find the lease held and start waiting; kill at a random point of
        // the holder's renewal period.
        let period = ttl / 3;
        let jitter = fastrand::u64(0..u64::try_from(period.as_millis()).unwrap_or(1).max(1));
        tokio::time::sleep(Duration::from_millis(100 + jitter)).await;
        let pid = child.id().expect("holder pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL the holder");
        let killed = Instant::now();
        let _ = child.wait().await;
        let got = w.await.expect("waiter task");
        samples.push(got.saturating_duration_since(killed));
    }
    Takeover {
        ttl,
        effective_ttl,
        latency: Latency::of(samples),
    }
}

/// The `hold` mode: takes `name` through the library, says `held FENCING`, renews until
/// killed.
pub async fn hold(url: &str, name: &str, ttl: Duration) {
    let backend = leasehold::connect(url).await.expect("connect");
    let client = LeaseClient::with_label(backend, HolderLabel::new("bench-holder").expect("label"));
    let opts = LeaseOptions::builder(ttl)
        .wait(Duration::from_secs(20))
        .build()
        .expect("options");
    let guard = client.acquire(name, &opts).await.expect("acquire");
    println!("held {}", guard.fencing().get());
    let _ = guard.lost().await;
    eprintln!("lease-bench hold: lease {name} lost");
    std::process::exit(1);
}
