//! The fault matrix: real holder processes (`lease-holder`) writing to a fenced resource
//! while a test kills, pauses or restarts them or the store. Each case asserts what the
//! library guarantees and returns what it measured.
//!
//! Tolerances: takeover after a kill is bounded by TTL + renewal period + 700 ms; the
//! extra covers the store's own expiry granularity (Redis expires keys in a 10 Hz cycle,
//! etcd checks leases on its own schedule), the waiter's poll or notification delay, and
//! process scheduling on a loaded 2-core machine.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lease_test_servers::docker::{self, Attach, DockerContainer, DockerNetwork, RunSpec};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::fenced::{FencedResource, Report, ResourceFence};
use lease_core::redact_url;

fn verbose() -> bool {
    std::env::var_os("LEASE_MATRIX_VERBOSE").is_some()
}

/// Where the holder binary is, and where its processes run.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// Path of the `lease-holder` binary.
    pub holder: PathBuf,
    /// TTL of the holders' leases (renewed every TTL/3).
    pub ttl: Duration,
    /// Where the holders run.
    pub place: Place,
}

/// Where the holders of a case run.
#[derive(Clone, Debug, Default)]
pub enum Place {
    /// Processes on this machine.
    #[default]
    Host,
    /// Each in its own container (see [`ContainerPlace`]).
    Containers(Arc<ContainerPlace>),
}

/// Holders in containers: each joins a network of its own kind, where it reaches the
/// fenced resource (on that network's gateway, this machine), and the store's private
/// network; a case can cut the second without the first.
#[derive(Debug)]
pub struct ContainerPlace {
    /// The image that runs the holder binary (mounted read-only).
    pub image: String,
    /// The private network of the store.
    pub network: Arc<DockerNetwork>,
    /// The network where the holders reach the fenced resource.
    pub resource_network: DockerNetwork,
}

impl ContainerPlace {
    /// Holders of `holder` in containers on `network`.
    pub async fn new(
        holder: &Path,
        network: Arc<DockerNetwork>,
    ) -> Result<ContainerPlace, lease_test_servers::HarnessError> {
        Ok(ContainerPlace {
            image: docker::runtime_image_for(holder).await?,
            network,
            resource_network: DockerNetwork::create().await?,
        })
    }

    /// This machine's address on the resource network (its gateway).
    pub fn resource_ip(&self) -> std::net::Ipv4Addr {
        self.resource_network.address(1)
    }
}

impl Matrix {
    /// The fenced resource, where the holders reach it. With the holders on this
    /// machine, its writes are decided by the public fence of the store at `url` (the
    /// one they lease from: PostgreSQL, MySQL, Redis; the in-memory fence for etcd); with
    /// holders in containers, whose store URL is on a private network, by the in-memory
    /// fence.
    async fn resource(&self, url: &str) -> FencedResource {
        match &self.place {
            Place::Host => {
                let fence = ResourceFence::for_store(url)
                    .await
                    .unwrap_or_else(|e| panic!("the fence on {}: {e}", redact_url(url)));
                FencedResource::start_with([127, 0, 0, 1].into(), fence)
                    .await
                    .unwrap()
            }
            Place::Containers(c) => FencedResource::start_on(c.resource_ip().into())
                .await
                .unwrap(),
        }
    }

    /// This matrix with its holders on this machine.
    fn on_host(&self) -> Matrix {
        Matrix {
            place: Place::Host,
            ..self.clone()
        }
    }
}

impl Matrix {
    /// The `lease-holder` next to the running executable (for binaries of this crate), or
    /// the given path.
    pub fn beside_current_exe() -> Option<Self> {
        let exe = std::env::current_exe().ok()?;
        let dir = exe.parent()?;
        for candidate in [dir.join("lease-holder"), dir.join("../lease-holder")] {
            if candidate.exists() {
                return Some(Matrix {
                    holder: candidate,
                    ttl: TTL,
                    place: Place::Host,
                });
            }
        }
        None
    }
}

/// Default TTL of the holders.
pub const TTL: Duration = Duration::from_millis(1000);
/// Their renewal period (TTL/3).
pub const RENEW: Duration = Duration::from_millis(333);
/// Tolerance on takeover times (see the module docs).
pub const TOLERANCE: Duration = Duration::from_millis(700);

struct Holder {
    id: String,
    run: Run,
}

enum Run {
    Process(Child),
    Container(DockerContainer),
}

impl Holder {
    /// Starts holder `id` where `m` says, on lease `name`, writing to `resource`.
    async fn spawn(
        m: &Matrix,
        url: &str,
        name: &str,
        id: &str,
        resource: &FencedResource,
    ) -> Holder {
        Self::spawn_with(m, url, name, id, resource, &[]).await
    }

    /// [`Holder::spawn`] with more `lease-holder` flags.
    async fn spawn_with(
        m: &Matrix,
        url: &str,
        name: &str,
        id: &str,
        resource: &FencedResource,
        extra: &[&str],
    ) -> Holder {
        let mut args: Vec<String> = [
            "--backend",
            url,
            "--name",
            name,
            "--writer",
            id,
            "--resource",
            &resource.addr().to_string(),
            "--ttl-ms",
            &m.ttl.as_millis().to_string(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        // LEASE_MATRIX_VERBOSE=1 shows what the holders do and log.
        let log = if verbose() { "info" } else { "error" };
        let run = match &m.place {
            Place::Host => Run::Process(
                Command::new(&m.holder)
                    .args(&args)
                    .env("LEASE_LOG", log)
                    .stdout(if verbose() {
                        Stdio::inherit()
                    } else {
                        Stdio::null()
                    })
                    .stdin(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap(),
            ),
            Place::Containers(c) => Run::Container(
                DockerContainer::run(RunSpec {
                    image: c.image.clone(),
                    entrypoint: Some("/lease-holder".into()),
                    cmd: args,
                    env: vec![("LEASE_LOG".into(), log.into())],
                    mounts: vec![(m.holder.clone(), "/lease-holder".into())],
                    networks: vec![
                        Attach {
                            network: c.resource_network.name().to_owned(),
                            ip: Some(c.resource_network.allocate().unwrap()),
                        },
                        Attach {
                            network: c.network.name().to_owned(),
                            ip: Some(c.network.allocate().unwrap()),
                        },
                    ],
                    ..RunSpec::default()
                })
                .await
                .unwrap(),
            ),
        };
        Holder {
            id: id.to_owned(),
            run,
        }
    }

    fn signal(child: &Child, sig: Signal) {
        let pid = child.id().expect("running") as i32;
        kill(Pid::from_raw(pid), sig).unwrap();
    }

    /// SIGKILL (a process) or `docker kill` (a container), and wait until it is gone.
    async fn kill(&mut self) {
        match &mut self.run {
            Run::Process(child) => {
                Self::signal(child, Signal::SIGKILL);
                let _ = child.wait().await;
            }
            Run::Container(c) => {
                c.kill().await.unwrap();
                c.wait_exit().await.unwrap();
            }
        }
    }

    /// SIGSTOP (a process) or `docker pause` (a container: a cgroup freeze).
    async fn pause(&self) {
        match &self.run {
            Run::Process(child) => Self::signal(child, Signal::SIGSTOP),
            Run::Container(c) => c.pause().await.unwrap(),
        }
    }

    /// SIGCONT or `docker unpause`.
    async fn resume(&self) {
        match &self.run {
            Run::Process(child) => Self::signal(child, Signal::SIGCONT),
            Run::Container(c) => c.unpause().await.unwrap(),
        }
    }

    /// The holder's container.
    fn container(&self) -> &DockerContainer {
        match &self.run {
            Run::Container(c) => c,
            Run::Process(_) => panic!("holder {} is not in a container", self.id),
        }
    }
}

/// Starts holders `{prefix}0..{prefix}{n-1}`.
async fn spawn_holders(
    m: &Matrix,
    url: &str,
    name: &str,
    prefix: &str,
    n: usize,
    resource: &FencedResource,
) -> Vec<Holder> {
    let mut holders = Vec::with_capacity(n);
    for i in 0..n {
        holders.push(Holder::spawn(m, url, name, &format!("{prefix}{i}"), resource).await);
    }
    holders
}

/// Waits until some writer other than `not` starts believing it holds the lease.
async fn wait_for_new_holder(
    resource: &FencedResource,
    since: Duration,
    not: Option<&str>,
    within: Duration,
) -> (String, Duration) {
    let until = Instant::now() + within;
    loop {
        if let Some(b) = resource
            .beliefs()
            .into_iter()
            .find(|b| b.start >= since && Some(b.writer.as_str()) != not)
        {
            return (b.writer, b.start);
        }
        assert!(Instant::now() < until, "no new holder within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn first_holder(resource: &FencedResource) -> String {
    let (writer, _) =
        wait_for_new_holder(resource, Duration::ZERO, None, Duration::from_secs(10)).await;
    assert!(
        resource
            .wait_for_writes(&writer, 3, Duration::from_secs(5))
            .await
    );
    writer
}

fn check(report: &Report) {
    tracing::info!("checker: {report}");
    assert_eq!(report.accepted_out_of_order, 0);
    assert!(
        report.overruns.is_empty(),
        "calls past their timeout: {:?}",
        report.overruns
    );
}

/// SIGKILL the active holder: another takes over within TTL + renewal period.
pub async fn holder_killed(m: &Matrix, url: &str) -> (Duration, Report) {
    let resource = m.resource(url).await;
    let name = format!("matrix-kill-{}", uuid::Uuid::new_v4().simple());
    let mut holders = spawn_holders(m, url, &name, "h", 3, &resource).await;
    let active = first_holder(&resource).await;
    let victim = holders.iter_mut().find(|h| h.id == active).unwrap();
    // Measured from the moment the kill is sent (a container's takes a CLI round trip).
    let killed_at = resource.now();
    victim.kill().await;
    resource.end_beliefs_of(&active);
    let (next, started) =
        wait_for_new_holder(&resource, killed_at, Some(&active), Duration::from_secs(10)).await;
    let takeover = started - killed_at;
    assert!(
        takeover <= m.ttl + m.ttl / 3 + TOLERANCE,
        "takeover by {next} took {takeover:?}"
    );
    assert!(
        resource
            .wait_for_writes(&next, 3, Duration::from_secs(5))
            .await
    );
    let report = resource.report();
    check(&report);
    assert!(report.double_beliefs.is_empty(), "{report}");
    (takeover, report)
}

/// SIGSTOP the active holder for 2x TTL: another takes over; on SIGCONT the old holder's
/// lost signal fires before it writes again where it checks, and any write that slips
/// through is rejected by its token.
pub async fn holder_paused(m: &Matrix, url: &str) -> Report {
    let resource = m.resource(url).await;
    let name = format!("matrix-pause-{}", uuid::Uuid::new_v4().simple());
    // Careless writers: each writes once more with its token after losing its lease, so
    // that the resumed holder's late write reaches the fence.
    let mut holders = Vec::new();
    for i in 0..2 {
        holders.push(
            Holder::spawn_with(
                m,
                url,
                &name,
                &format!("p{i}"),
                &resource,
                &["--write-after-loss", "1"],
            )
            .await,
        );
    }
    let active = first_holder(&resource).await;
    let victim = holders.iter().find(|h| h.id == active).unwrap();
    victim.pause().await;
    let paused_at = resource.now();
    let (next, next_start) =
        wait_for_new_holder(&resource, paused_at, Some(&active), m.ttl * 3).await;
    assert!(
        resource
            .wait_for_writes(&next, 3, Duration::from_secs(5))
            .await
    );
    let since_pause = resource.now() - paused_at;
    if let Some(rest) = (m.ttl * 2).checked_sub(since_pause) {
        tokio::time::sleep(rest).await;
    }
    // Taken before the resume: a container's takes a CLI round trip, during which the
    // holder may already run again and make its late write.
    let resumed_at = resource.now();
    victim.resume().await;
    // The old holder reports the end of its belief quickly after resuming.
    let until = Instant::now() + m.ttl;
    loop {
        let ended = resource
            .beliefs()
            .iter()
            .any(|b| b.writer == active && b.end.is_some());
        if ended {
            break;
        }
        assert!(
            Instant::now() < until,
            "{active} still believes after resuming"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(m.ttl / 2).await;
    let writes = resource.writes();
    let old_token = resource
        .beliefs()
        .iter()
        .find(|b| b.writer == active)
        .unwrap()
        .token;
    let late_accepted = writes
        .iter()
        .filter(|w| w.writer == active && w.token == old_token && w.accepted && w.at > next_start)
        .count();
    assert_eq!(
        late_accepted, 0,
        "a stale write of the paused holder was accepted"
    );
    let late_attempts = writes
        .iter()
        .filter(|w| w.writer == active && w.token == old_token && w.at >= resumed_at)
        .count();
    assert!(
        late_attempts >= 1,
        "the resumed holder made no late write (it writes once after its loss)"
    );
    let mut report = resource.report();
    // A frozen process's calls in flight look long; they are not the library's.
    report.overruns.retain(|(w, _, _)| *w != active);
    tracing::info!(
        fence = resource.fence_kind(),
        "paused holder: {late_attempts} write(s) with the old token after resuming (all rejected)"
    );
    report.stale_after_resume = late_attempts as u64;
    check(&report);
    report
}

/// The store down for 2x TTL: holders lose their lease, get typed errors, and work resumes
/// when the store returns.
pub async fn store_down(
    m: &Matrix,
    url: &str,
    stop: impl AsyncFnOnce(),
    start: impl AsyncFnOnce(),
) -> (Duration, Report) {
    let resource = m.resource(url).await;
    let name = format!("matrix-down-{}", uuid::Uuid::new_v4().simple());
    let _holders = spawn_holders(m, url, &name, "d", 2, &resource).await;
    let active = first_holder(&resource).await;
    // Measured from the moment the stop is asked for (a container's takes a CLI round
    // trip, during which the fault may already be in effect).
    let stopped_at = resource.now();
    stop().await;
    // The holder stops believing by its safety deadline (within the TTL of the stop).
    let until = Instant::now() + m.ttl + Duration::from_millis(300);
    loop {
        if resource.beliefs().iter().all(|b| b.end.is_some()) {
            break;
        }
        assert!(
            Instant::now() < until,
            "{active} still believes with the store down"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lost_after = resource.now() - stopped_at;
    tokio::time::sleep((m.ttl * 2).saturating_sub(resource.now() - stopped_at)).await;
    start().await;
    // A belief that starts after the stop can only start once the store is back; the
    // holders may get in before start() has finished its own readiness check.
    let (next, _) = wait_for_new_holder(&resource, stopped_at, None, Duration::from_secs(10)).await;
    assert!(
        resource
            .wait_for_writes(&next, 3, Duration::from_secs(5))
            .await
    );
    eprintln!(
        "store down: belief ended {lost_after:?} after the stop; work resumed after the restart"
    );
    let report = resource.report();
    check(&report);
    (lost_after, report)
}

/// What a store restart did to fencing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartResult {
    /// What the backend claims.
    pub claim: lease_core::Fencing,
    /// The last token before the restart.
    pub before: u64,
    /// The first token after it.
    pub after: u64,
}

impl RestartResult {
    /// Whether the claim held: a durable claim needs `after > before`; a volatile claim
    /// allows anything.
    pub fn claim_held(&self) -> bool {
        match self.claim {
            lease_core::Fencing::Durable => self.after > self.before,
            _ => true,
        }
    }
}

/// Takes and releases a lease a few times, restarts the store, takes it again. Panics if a
/// durable claim does not hold.
pub async fn store_restarted(url: &str, restart: impl AsyncFnOnce()) -> RestartResult {
    use lease_core::{AcquireOutcome, HolderLabel, LeaseName, Owner};
    let backend = leasehold::connect(url).await.expect("connect");
    let claim = backend.capabilities().fencing;
    let name =
        LeaseName::new(format!("matrix-restart-{}", uuid::Uuid::new_v4().simple())).expect("name");
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(30));
    let take = async |backend: &dyn lease_core::LeaseBackend| {
        let owner = Owner::new(HolderLabel::new("restart").expect("label"));
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match backend.acquire(&name, &owner, ttl).await {
                Ok(AcquireOutcome::Acquired { fencing, .. }) => {
                    let _ = backend.release(&name, &owner.token, Duration::ZERO).await;
                    return fencing.get();
                }
                Ok(AcquireOutcome::Held(by)) => panic!("held by {by}"),
                Err(e) => {
                    assert!(
                        e.is_retryable() && Instant::now() < until,
                        "store did not come back: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    let mut before = 0;
    for _ in 0..3 {
        before = take(&*backend).await;
    }
    restart().await;
    let after = take(&*backend).await;
    let r = RestartResult {
        claim,
        before,
        after,
    };
    assert!(r.claim_held(), "fencing claim {claim:?} broken: {r:?}");
    r
}

/// What the network cut did.
#[derive(Clone, Debug)]
pub struct CutResult {
    /// From the cut to the cut-off holder's lost signal.
    pub lost_after: Duration,
    /// From the cut to the other holder's acquisition.
    pub takeover_after: Duration,
    /// The checker's report.
    pub report: Report,
}

/// Cuts the network between one holder (in its own network namespace) and the store while
/// another holder waits: the cut-off holder signals lost at its deadline, before the other
/// gets the lease; after the cut heals it does not believe it holds the lease.
///
/// `store` is the store's address on this machine; `url_via(addr)` is the store URL with
/// its host and port replaced by `addr`. Returns `Err` with the reason when a namespace
/// cannot be made here (not root, no `ip`).
pub async fn network_cut(
    m: &Matrix,
    direct_url: &str,
    store: std::net::SocketAddr,
    url_via: impl Fn(std::net::SocketAddr) -> String,
) -> Result<CutResult, String> {
    let mut ns = lease_test_servers::netns::TestNetns::create()?;
    let port = ns.relay(store).await.map_err(|e| e.to_string())?;
    let ns_url = url_via(std::net::SocketAddr::new(ns.store_ip(), port));
    let resource = FencedResource::start_on(ns.resource_ip())
        .await
        .map_err(|e| e.to_string())?;
    let name = format!("matrix-cut-{}", uuid::Uuid::new_v4().simple());
    let ttl_ms = m.ttl.as_millis().to_string();
    let resource_addr = resource.addr().to_string();
    let holder = m.holder.to_string_lossy().into_owned();
    let mut cutoff = Command::new("ip");
    cutoff
        .args(["netns", "exec", ns.name(), &holder])
        .args(["--backend", &ns_url, "--name", &name, "--writer", "cutoff"])
        .args(["--resource", &resource_addr, "--ttl-ms", &ttl_ms])
        .env("LEASE_LOG", if verbose() { "info" } else { "error" })
        .stdout(if verbose() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let _cutoff = cutoff.spawn().map_err(|e| e.to_string())?;
    let (first, _) =
        wait_for_new_holder(&resource, Duration::ZERO, None, Duration::from_secs(10)).await;
    assert_eq!(first, "cutoff");
    assert!(
        resource
            .wait_for_writes("cutoff", 3, Duration::from_secs(5))
            .await
    );
    let _other = Holder::spawn(&m.on_host(), direct_url, &name, "other", &resource).await;
    let ns = std::sync::Mutex::new(&mut ns);
    cut_and_heal(
        m,
        &resource,
        async || ns.lock().unwrap().cut(),
        async || ns.lock().unwrap().heal(),
    )
    .await
}

/// Disconnects a holder's container from the store's private network while another
/// holder (a process on this machine, through the store's published port) waits: the
/// cut-off holder signals lost at its deadline, before the other gets the lease; after
/// it is reconnected it does not believe it holds the lease. It still reaches the fenced
/// resource (over the bridge network), so its lost signal and any late write are seen.
///
/// `m.place` must be [`Place::Containers`] on the store's network; `host_url` is the
/// store's URL from this machine, `network_url` from the private network.
pub async fn holder_disconnected(m: &Matrix, host_url: &str, network_url: &str) -> CutResult {
    let Place::Containers(place) = &m.place else {
        panic!("holder_disconnected needs holders in containers");
    };
    let net = place.network.name().to_owned();
    let resource = m.resource(network_url).await;
    let name = format!("matrix-disconnect-{}", uuid::Uuid::new_v4().simple());
    let cutoff = Holder::spawn(m, network_url, &name, "cutoff", &resource).await;
    let (first, _) =
        wait_for_new_holder(&resource, Duration::ZERO, None, Duration::from_secs(20)).await;
    assert_eq!(first, "cutoff");
    assert!(
        resource
            .wait_for_writes("cutoff", 3, Duration::from_secs(5))
            .await
    );
    let _other = Holder::spawn(&m.on_host(), host_url, &name, "other", &resource).await;
    cut_and_heal(
        m,
        &resource,
        async || {
            cutoff
                .container()
                .disconnect(&net)
                .await
                .map_err(|e| e.to_string())
        },
        async || {
            cutoff
                .container()
                .reconnect(&net)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The common part of the network cuts: `cutoff` holds the lease and `other` waits;
/// `cut`, observe, `heal`, observe.
async fn cut_and_heal(
    m: &Matrix,
    resource: &FencedResource,
    cut: impl AsyncFnOnce() -> Result<(), String>,
    heal: impl AsyncFnOnce() -> Result<(), String>,
) -> Result<CutResult, String> {
    tokio::time::sleep(m.ttl / 2).await;
    // Measured from the moment the cut is asked for.
    let cut_at = resource.now();
    cut().await?;
    // The cut-off holder still reaches the resource, so it reports its lost signal.
    let until = Instant::now() + m.ttl * 2;
    let lost_at = loop {
        let ended = resource
            .beliefs()
            .iter()
            .find(|b| b.writer == "cutoff" && b.end.is_some())
            .and_then(|b| b.end);
        if let Some(end) = ended {
            break end;
        }
        assert!(
            Instant::now() < until,
            "the cut-off holder never signalled lost"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (next, taken_at) = wait_for_new_holder(resource, cut_at, Some("cutoff"), m.ttl * 4).await;
    assert_eq!(next, "other");
    assert!(
        lost_at <= taken_at,
        "the other holder got the lease at {taken_at:?}, before the cut-off holder's lost \
         signal at {lost_at:?}"
    );
    heal().await?;
    tokio::time::sleep(m.ttl * 2).await;
    let believes = resource
        .beliefs()
        .iter()
        .any(|b| b.writer == "cutoff" && b.end.is_none());
    assert!(
        !believes,
        "after the cut healed, the cut-off holder believes it holds the lease"
    );
    let report = resource.report();
    check(&report);
    assert!(report.double_beliefs.is_empty(), "{report}");
    Ok(CutResult {
        lost_after: lost_at - cut_at,
        takeover_after: taken_at - cut_at,
        report,
    })
}

/// The `host:port` of a store URL (`redis://`, `postgres://`, `etcd://`; the first host of
/// a list).
pub fn store_addr(url: &str) -> Option<std::net::SocketAddr> {
    let rest = url.split("://").nth(1)?;
    let rest = rest.rsplit('@').next()?;
    let hp = rest.split(['/', ',', '?']).next()?;
    hp.parse().ok()
}

/// `url` with its `host:port` replaced by `to`.
pub fn with_store_addr(url: &str, to: std::net::SocketAddr) -> String {
    match store_addr(url) {
        Some(from) => url.replacen(&from.to_string(), &to.to_string(), 1),
        None => url.to_owned(),
    }
}
