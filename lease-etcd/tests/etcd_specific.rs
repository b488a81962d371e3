//! etcd-specific behaviour against real etcd processes: leader failover, quorum loss, a
//! paused client whose etcd lease expires, an operator's force release seen by another
//! process, fencing across a restart, and the cost of renewing many keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lease_conformance::{Fault, FaultyBackend, Op};
use lease_core::{
    AcquireOutcome, Error, HolderLabel, LeaseBackend, LeaseClient, LeaseGuard, LeaseName,
    LeaseOptions, LossReason, Owner, ReleaseOutcome, RenewItem, RenewOutcome, TryAcquire,
};
use lease_etcd::{EtcdBackend, EtcdConfig};
use lease_test_servers::etcd::{EtcdCluster, EtcdServer};
use tokio::time::Instant;

/// Logs to the test output with `RUST_LOG=lease_etcd=debug` and friends.
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn config() -> EtcdConfig {
    EtcdConfig::default()
        .with_key_prefix(
            lease_conformance::suite::namespace()
                .trim_end_matches('/')
                .to_owned(),
        )
        .with_request_timeout(Duration::from_secs(1))
        .with_connect_timeout(Duration::from_secs(1))
}

async fn backend(endpoints: &[String], config: &EtcdConfig) -> Arc<EtcdBackend> {
    Arc::new(
        EtcdBackend::connect_endpoints(endpoints, config.clone())
            .await
            .expect("connect"),
    )
}

fn client(backend: Arc<dyn LeaseBackend>, label: &str) -> LeaseClient {
    LeaseClient::with_label(backend, HolderLabel::new(label).unwrap())
}

async fn take(c: &LeaseClient, name: &str, opts: &LeaseOptions) -> LeaseGuard {
    match c.try_acquire(name, opts).await.expect("acquire") {
        TryAcquire::Acquired(g) => g,
        TryAcquire::Held(by) => panic!("{name} held by {by}"),
        _ => unreachable!("an outcome added to the enum after this code was written"),
    }
}

/// Retries `try_acquire` until it succeeds or `within` runs out (the store recovering).
async fn take_eventually(
    c: &LeaseClient,
    name: &str,
    opts: &LeaseOptions,
    within: Duration,
) -> LeaseGuard {
    let start = Instant::now();
    loop {
        match c.try_acquire(name, opts).await {
            Ok(TryAcquire::Acquired(g)) => return g,
            Ok(TryAcquire::Held(by)) => {
                assert!(start.elapsed() < within, "{name} still held by {by}")
            }
            Err(e) => assert!(
                e.is_retryable() && start.elapsed() < within,
                "no recovery after {:?}: {e}",
                start.elapsed()
            ),
            _ => unreachable!("an outcome added to the enum after this code was written"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held() {
    let mut cluster = EtcdCluster::start(3).await.expect("cluster");
    let cfg = config();
    let b = backend(&cluster.endpoints(), &cfg).await;
    let c = client(b.clone(), "survivor");
    let opts = LeaseOptions::new(Duration::from_secs(3)).unwrap();
    let guard = take(&c, "job", &opts).await;
    let leader = cluster
        .wait_leader(Duration::from_secs(5))
        .await
        .expect("leader");
    cluster.member(leader).kill().expect("kill leader");
    let killed_at = Instant::now();
    // A new leader is elected within a few election timeouts; the guard must ride it out.
    let new_leader = loop {
        if let Some(i) = cluster.leader_index().filter(|i| *i != leader) {
            break i;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "no new leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "leader n{leader} killed; n{new_leader} elected after {:?}",
        killed_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(6)).await; // two TTLs of renewals
    assert!(
        guard.is_held(),
        "the guard was lost across the election: {:?}",
        guard.loss_reason()
    );
    let other = take_eventually(&c, "after-election", &opts, Duration::from_secs(5)).await;
    assert!(
        other.fencing() > guard.fencing(),
        "token {} after the election is not above {}",
        other.fencing(),
        guard.fencing()
    );
    let info = c.inspect("job").await.expect("inspect").expect("held");
    assert_eq!(info.holder.as_deref(), Some("survivor"));
    assert_eq!(info.fencing, Some(guard.fencing()));
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(other.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_gives_typed_errors_then_recovers() {
    let mut cluster = EtcdCluster::start(3).await.expect("cluster");
    let cfg = config();
    let b = backend(&cluster.endpoints(), &cfg).await;
    let c = client(b.clone(), "quorum");
    let ttl = Duration::from_secs(2);
    let opts = LeaseOptions::new(ttl).unwrap();
    let guard = take(&c, "held-through-outage", &opts).await;
    let first = guard.fencing();

    // Stop two of three members, one at a time: the last one has no quorum.
    let lost_quorum_at = Instant::now();
    cluster.member(1).stop().await.expect("stop n1");
    cluster.member(2).stop().await.expect("stop n2");
    eprintln!("quorum lost after {:?}", lost_quorum_at.elapsed());

    // New acquisitions fail fast with a typed, retryable error.
    for i in 0..3 {
        let started = Instant::now();
        match c.try_acquire(format!("during-outage-{i}"), &opts).await {
            Err(e @ (Error::Unavailable { .. } | Error::Timeout { .. })) => {
                assert!(e.is_retryable(), "{e}");
                eprintln!("acquire without quorum: {e} after {:?}", started.elapsed());
            }
            other => panic!("expected Unavailable or Timeout, got {other:?}"),
        }
        assert!(
            started.elapsed() < opts.call_timeout() + Duration::from_millis(500),
            "acquire took {:?}",
            started.elapsed()
        );
    }
    // The holder cannot renew: it is told at its safety deadline.
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("no lost signal without quorum");
    assert_eq!(reason, LossReason::DeadlinePassed);

    // Quorum back: work resumes, with greater fencing tokens.
    cluster.member(1).start_again().await.expect("restart n1");
    cluster.member(2).start_again().await.expect("restart n2");
    cluster
        .wait_healthy(Duration::from_secs(10))
        .await
        .expect("healthy again");
    let after = take_eventually(&c, "after-outage", &opts, Duration::from_secs(10)).await;
    assert!(after.fencing() > first);
    assert_eq!(after.release().await.unwrap(), ReleaseOutcome::Released);
    // The lost guard's key goes away (released on drop, or its etcd lease runs out).
    drop(guard);
    let again = take_eventually(
        &c,
        "held-through-outage",
        &opts,
        ttl * 3 + Duration::from_secs(2),
    )
    .await;
    assert!(again.fencing() > first);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_client_loses_its_lease_to_another() {
    let server = EtcdServer::start().await.expect("etcd");
    let cfg = config();
    let a_backend = backend(&server.endpoints(), &cfg).await;
    let faulty = Arc::new(FaultyBackend::new(a_backend.clone()));
    let a = client(faulty.clone(), "paused");
    let ttl = Duration::from_secs(1);
    let opts = LeaseOptions::new(ttl).unwrap();
    let guard = take(&a, "job", &opts).await;
    let first = guard.fencing();
    // A second key of the same instance, taken through the backend directly.
    let raw_name = LeaseName::new("raw").unwrap();
    let raw_owner = Owner::new(HolderLabel::new("paused").unwrap());
    assert!(matches!(
        a_backend.acquire(&raw_name, &raw_owner, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));

    // The holder stops talking to etcd (a GC pause, a frozen VM): nothing renews its lease.
    faulty.set(Op::Renew, Fault::Hang);
    let paused_at = Instant::now();
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("no lost signal while paused");
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert!(
        paused_at.elapsed() < ttl,
        "lost only after {:?}",
        paused_at.elapsed()
    );

    // Another process takes over once etcd expires the lease.
    let b_backend = backend(&server.endpoints(), &cfg).await;
    let b = client(b_backend.clone(), "successor");
    let next = take_eventually(&b, "job", &opts, ttl + Duration::from_millis(2500)).await;
    let took = paused_at.elapsed();
    assert!(
        took + Duration::from_millis(50) >= ttl,
        "taken after {took:?}"
    );
    assert!(next.fencing() > first);
    let info = b.inspect("job").await.unwrap().expect("held");
    assert_eq!(info.holder.as_deref(), Some("successor"));

    // The paused holder wakes up: its renewal says lost, its release changes nothing.
    faulty.set(Op::Renew, Fault::Pass);
    let r = a_backend
        .renew(
            &[RenewItem {
                name: raw_name.clone(),
                token: raw_owner.token,
            }],
            ttl,
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        vec![RenewOutcome::Lost],
        "a renewal after the etcd lease expired"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotOwner);
    assert!(next.is_held());
    // The woken instance works again: a fresh session lease.
    let fresh = take(&a, "another", &opts).await;
    fresh.release().await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_from_another_process_is_seen_by_the_holder() {
    let server = EtcdServer::start().await.expect("etcd");
    let cfg = config();
    let holder_backend = backend(&server.endpoints(), &cfg).await;
    let operator = backend(&server.endpoints(), &cfg).await;
    let c = client(holder_backend.clone(), "victim");
    let ttl = Duration::from_secs(2);
    let guard = take(&c, "job", &LeaseOptions::new(ttl).unwrap()).await;
    let name = LeaseName::new("job").unwrap();
    assert!(operator.force_release(&name).await.unwrap());
    assert!(!operator.force_release(&name).await.unwrap());
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("holder never learnt of the force release");
    assert_eq!(reason, LossReason::NotOwner);
    let o = Owner::new(HolderLabel::new("next").unwrap());
    match operator.acquire(&name, &o, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fencing, .. } => assert!(fencing > guard.fencing()),
        AcquireOutcome::Held(by) => panic!("still held by {by}"),
    }
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotOwner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_survives_a_restart() {
    let mut server = EtcdServer::start_local().await.expect("etcd");
    let url = format!(
        "etcd://{}/{}",
        server.endpoints()[0].trim_start_matches("http://"),
        config().key_prefix
    );
    let b = Arc::new(EtcdBackend::connect(&url).await.expect("from_url"));
    let c = client(b.clone(), "durable");
    let opts = LeaseOptions::new(Duration::from_secs(2)).unwrap();
    let g = take(&c, "job", &opts).await;
    let first = g.fencing();
    g.release().await.unwrap();
    server.stop().await.expect("stop");
    server.start_again().await.expect("start again");
    let g = take_eventually(&c, "job", &opts, Duration::from_secs(10)).await;
    assert!(
        g.fencing() > first,
        "token {} after restart not above {first}",
        g.fencing()
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_ten_thousand_keys_is_one_keepalive() {
    const KEYS: usize = 10_000;
    init_tracing();
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(&server.endpoints(), &config()).await;
    // Long enough to acquire them all on one etcd lease (a lease nobody renews takes new
    // keys only while at least half its TTL is left).
    let ttl = Duration::from_secs(30);
    let owner = Owner::new(HolderLabel::new("many").unwrap());
    let names: Vec<LeaseName> = (0..KEYS)
        .map(|i| LeaseName::new(format!("key-{i}")).unwrap())
        .collect();
    let started = Instant::now();
    let acquired = futures::stream::iter(names.iter())
        .map(|n| {
            let (b, owner) = (b.clone(), owner.clone());
            async move { b.acquire(n, &owner, ttl).await.expect("acquire") }
        })
        .buffer_unordered(32)
        .filter(|o| std::future::ready(matches!(o, AcquireOutcome::Acquired { .. })))
        .count()
        .await;
    assert_eq!(acquired, KEYS);
    eprintln!("{KEYS} leases acquired in {:?}", started.elapsed());
    assert_eq!(b.etcd_leases_in_use(), 1, "all keys share one etcd lease");

    let items: Vec<RenewItem> = names
        .iter()
        .map(|n| RenewItem {
            name: n.clone(),
            token: owner.token,
        })
        .collect();
    let before = b.keepalives_sent();
    for round in 0..4 {
        if round > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let started = Instant::now();
        let r = b.renew(&items, ttl).await.expect("renew");
        eprintln!("renewed {KEYS} leases in {:?}", started.elapsed());
        assert!(r.iter().all(|o| *o == RenewOutcome::Renewed));
    }
    assert_eq!(b.keepalives_sent() - before, 4, "one keepalive per renewal");
    let probe = Owner::new(HolderLabel::new("probe").unwrap());
    for n in [&names[0], &names[KEYS / 2], &names[KEYS - 1]] {
        assert!(matches!(
            b.acquire(n, &probe, ttl).await.unwrap(),
            AcquireOutcome::Held(_)
        ));
    }
    let released = futures::stream::iter(names.iter())
        .map(|n| {
            let b = b.clone();
            async move {
                b.release(n, &owner.token, Duration::ZERO)
                    .await
                    .expect("release")
            }
        })
        .buffer_unordered(32)
        .filter(|r| std::future::ready(*r == ReleaseOutcome::Released))
        .count()
        .await;
    assert_eq!(released, KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_renews_many_guards_with_one_keepalive_per_tick() {
    const GUARDS: usize = 2_000;
    init_tracing();
    let server = EtcdServer::start().await.expect("etcd");
    let b = backend(&server.endpoints(), &config()).await;
    let c = client(b.clone(), "many");
    let opts = LeaseOptions::new(Duration::from_secs(3)).unwrap();
    let started = Instant::now();
    let guards: Vec<LeaseGuard> = futures::stream::iter(0..GUARDS)
        .map(|i| {
            let (c, opts) = (c.clone(), opts.clone());
            async move { take(&c, &format!("guard-{i}"), &opts).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    eprintln!("{GUARDS} guards acquired in {:?}", started.elapsed());
    assert_eq!(b.etcd_leases_in_use(), 1, "all keys share one etcd lease");

    // Let the renewals fall into step, then count keepalives over five renewal periods.
    tokio::time::sleep(opts.renew_every() * 3).await;
    let before = b.keepalives_sent();
    tokio::time::sleep(opts.renew_every() * 5).await;
    let sent = b.keepalives_sent() - before;
    eprintln!("{sent} keepalives in 5 renewal periods for {GUARDS} guards");
    assert!(
        (4..=7).contains(&sent),
        "{sent} keepalives in 5 ticks for {GUARDS} guards"
    );
    assert!(guards.iter().all(LeaseGuard::is_held));
    let released = futures::stream::iter(guards)
        .map(|g| async move { g.release().await.expect("release") })
        .buffer_unordered(32)
        .filter(|r| std::future::ready(*r == ReleaseOutcome::Released))
        .count()
        .await;
    assert_eq!(released, GUARDS);
}

/// The server's minimum lease TTL, measured: a lease asked for 1 s is granted 2 s by an
/// etcd with the default raft timing (1.5 × its 1 s election timeout), 1 s by the tests'
/// fast single node (100 ms). The capabilities say what the config says (2 s by default),
/// and a scheduled job's keep-for leaves room for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ttl_is_what_the_server_grants() {
    async fn measured(endpoints: Vec<String>) -> Duration {
        let mut raw = lease_etcd::etcd_client::Client::connect(endpoints, None)
            .await
            .unwrap();
        let granted = raw.lease_grant(1, None).await.unwrap();
        raw.lease_revoke(granted.id()).await.unwrap();
        Duration::from_secs(u64::try_from(granted.ttl()).unwrap())
    }
    let default_timing = EtcdServer::start_local_with(&[
        "--heartbeat-interval",
        "100",
        "--election-timeout",
        "1000",
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let on_default = measured(default_timing.endpoints()).await;
    eprintln!("etcd with default raft timing granted {on_default:?} for a lease asked for 1 s");
    assert_eq!(on_default, lease_etcd::MIN_TTL);
    let b = backend(&default_timing.endpoints(), &config()).await;
    let caps = b.capabilities();
    assert_eq!(caps.min_ttl, on_default, "capabilities' min_ttl");
    assert_eq!(caps.effective_ttl(Duration::from_secs(1)), on_default);
    // An acquire asked for 1 s reports what the store applies.
    let owner = Owner::new(HolderLabel::new("min-ttl").unwrap());
    let name = LeaseName::new(format!("min-ttl-{}", uuid::Uuid::new_v4().simple())).unwrap();
    match b
        .acquire(&name, &owner, Duration::from_secs(1))
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired { ttl, .. } => {
            assert!(ttl > Duration::from_secs(1) && ttl <= on_default, "{ttl:?}")
        }
        other => panic!("{other:?}"),
    }
    b.release(&name, &owner.token, Duration::ZERO)
        .await
        .unwrap();

    // The tests' fast node grants 1 s, and a config may say so.
    let fast = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let on_fast = measured(fast.endpoints()).await;
    eprintln!("etcd with the tests' raft timing granted {on_fast:?}");
    let fast_config = config().with_min_ttl(on_fast);
    assert_eq!(
        backend(&fast.endpoints(), &fast_config)
            .await
            .capabilities()
            .min_ttl,
        on_fast
    );
    let bad = config().with_min_ttl(Duration::from_millis(1500));
    assert!(
        EtcdBackend::connect_endpoints(&fast.endpoints(), bad)
            .await
            .is_err()
    );

    // ScheduledJob: a derived keep-for leaves the minimum TTL before the next tick, and an
    // explicit one that does not is refused.
    let client = client(b.clone(), "job");
    let opts = LeaseOptions::new(Duration::from_secs(10)).unwrap();
    let job =
        lease_core::ScheduledJob::new(client.clone(), "job", Duration::from_secs(10), opts.clone())
            .unwrap();
    assert!(
        job.keep_for() + on_default < Duration::from_secs(10),
        "{:?}",
        job.keep_for()
    );
    let err = lease_core::ScheduledJob::new(
        client.clone(),
        "job",
        Duration::from_secs(4),
        LeaseOptions::builder(Duration::from_secs(10))
            .keep_for(Duration::from_secs(3))
            .build()
            .unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(lease_core::InvalidInput::KeepForTooLongForStore { .. })
        ),
        "{err}"
    );
    let err =
        lease_core::ScheduledJob::new(client, "job", Duration::from_secs(2), opts).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(lease_core::InvalidInput::PeriodTooShort { .. })
        ),
        "{err}"
    );
}

/// A key nobody renewed is deleted by the sweep that runs in a renewal keeping its etcd
/// lease alive (the etcd lease is shared by every lease of that TTL). When that delete
/// fails (here the backend's user may only read the prefix for a moment: the store
/// refuses it), later renewals send it again. Before, one failed delete left the key on
/// the etcd lease the other leases' renewals keep alive: held for as long as they are
/// renewed. The TTL's expiry is the subject, so the steps are timed: renewals of the kept
/// lease every second, the abandoned one's deadline at 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_key_whose_delete_failed_is_deleted_by_a_later_renewal() {
    use lease_etcd::etcd_client::{Client, ConnectOptions, Permission};
    let server = EtcdServer::start_local()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let prefix = lease_conformance::suite::namespace()
        .trim_end_matches('/')
        .to_owned();
    let mut raw = Client::connect(server.endpoints(), None).await.unwrap();
    raw.user_add("root", "root-pw", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.role_add("lease-rw").await.unwrap();
    let read_write = || Permission::read_write(format!("{prefix}/")).with_prefix();
    raw.role_grant_permission("lease-rw", read_write())
        .await
        .unwrap();
    raw.user_add("leaser", "user-pw", None).await.unwrap();
    raw.user_grant_role("leaser", "lease-rw").await.unwrap();
    raw.auth_enable().await.unwrap();
    let mut root = Client::connect(
        server.endpoints(),
        Some(ConnectOptions::new().with_user("root", "root-pw")),
    )
    .await
    .unwrap();
    let cfg = config()
        .with_key_prefix(prefix.clone())
        .with_user(Some("leaser".into()))
        .with_password(Some("user-pw".into()));
    let b = backend(&server.endpoints(), &cfg).await;
    let ttl = Duration::from_secs(3);
    let kept = LeaseName::new("kept").unwrap();
    let abandoned = LeaseName::new("abandoned").unwrap();
    let (a, other) = (
        Owner::new(HolderLabel::new("a").unwrap()),
        Owner::new(HolderLabel::new("b").unwrap()),
    );
    let start = Instant::now();
    for n in [&kept, &abandoned] {
        assert!(matches!(
            b.acquire(n, &a, ttl).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
    }
    let item = [RenewItem {
        name: kept.clone(),
        token: a.token,
    }];
    let renew_kept = async |at: Duration| {
        tokio::time::sleep_until(start + at).await;
        let r = b.renew(&item, ttl).await;
        assert!(
            matches!(r.as_deref(), Ok([RenewOutcome::Renewed])),
            "renewal at {at:?}: {r:?}"
        );
    };
    renew_kept(Duration::from_secs(1)).await;
    renew_kept(Duration::from_secs(2)).await;
    // Read only, from before the abandoned lease's deadline until after the sweep's try.
    root.role_grant_permission(
        "lease-rw",
        Permission::read(format!("{prefix}/")).with_prefix(),
    )
    .await
    .unwrap();
    renew_kept(Duration::from_millis(3300)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    root.role_grant_permission("lease-rw", read_write())
        .await
        .unwrap();
    let mut at = Duration::from_secs(4);
    loop {
        match b.acquire(&abandoned, &other, ttl).await.unwrap() {
            AcquireOutcome::Acquired { .. } => break,
            AcquireOutcome::Held(by) => assert!(
                at < Duration::from_secs(9),
                "the abandoned lease is still held by {by:?} {:?} after its acquire (ttl {ttl:?})",
                start.elapsed()
            ),
        }
        at += Duration::from_secs(1);
        renew_kept(at).await;
    }
    eprintln!(
        "the abandoned lease was free {:?} after its acquire (ttl {ttl:?})",
        start.elapsed()
    );
}

/// An acquisition stores its record at the name's key followed by the id of its etcd
/// lease (16 hex digits), reused by the next acquisition of the name through that lease,
/// so etcd's index holds a key per session, not one per acquisition. Its release is a
/// plain delete of that key. While this instance still has a record of the name (here:
/// a holder whose key an operator deleted, not released yet), a new acquisition takes a
/// key of its own, which the old holder's plain delete cannot reach. Another owner's
/// release touches nothing; a record of the earlier layout (at the name's key itself) is
/// a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_records_key_is_its_sessions_and_a_stale_release_cannot_reach_a_new_one() {
    let server = EtcdServer::start().await.expect("etcd");
    let cfg = config();
    let b = backend(&server.endpoints(), &cfg).await;
    let mut raw = etcd_client::Client::connect(server.endpoints(), None)
        .await
        .unwrap();
    let name = LeaseName::new("report:eu").unwrap();
    let name_key = format!("{}/l/report:eu#", cfg.key_prefix);
    let ttl = Duration::from_secs(5);
    let records = |raw: &etcd_client::Client| {
        let mut raw = raw.clone();
        let key = name_key.clone();
        async move {
            let found = raw
                .get(key, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap();
            found
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8(kv.key().to_vec()).unwrap(),
                        String::from_utf8(kv.value().to_vec()).unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let acquired = |outcome: AcquireOutcome| match outcome {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        AcquireOutcome::Held(by) => panic!("held by {by}"),
    };

    // The record: the name's key and 16 hex digits; the value names the owner.
    let first = Owner::new(HolderLabel::new("first").unwrap());
    acquired(b.acquire(&name, &first, ttl).await.unwrap());
    let found = records(&raw).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let session_key = found[0].0.clone();
    let suffix = session_key.strip_prefix(&name_key).unwrap();
    assert!(
        suffix.len() == 16 && suffix.bytes().all(|c| c.is_ascii_hexdigit()),
        "{session_key}"
    );
    // The owner token in its 32 hex digits (every version reads the hyphenated form too:
    // the stale record below is written in it).
    assert_eq!(
        found[0].1,
        format!("lease1\nheld\n{}\nfirst", first.token.as_uuid().simple())
    );

    // Held: a second owner's acquire puts nothing and names the holder; its release
    // touches nothing; the holder's removes the record.
    let second = Owner::new(HolderLabel::new("second").unwrap());
    match b.acquire(&name, &second, ttl).await.unwrap() {
        AcquireOutcome::Held(by) => assert_eq!(by.holder.as_deref(), Some("first")),
        AcquireOutcome::Acquired { .. } => panic!("acquired while held"),
    }
    assert_eq!(
        b.release(&name, &second.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::NotOwner
    );
    assert_eq!(records(&raw).await.len(), 1);
    assert_eq!(
        b.release(&name, &first.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
    assert!(records(&raw).await.is_empty());

    // The next acquisition through the same session reuses the key.
    let third = Owner::new(HolderLabel::new("third").unwrap());
    acquired(b.acquire(&name, &third, ttl).await.unwrap());
    assert_eq!(records(&raw).await[0].0, session_key);

    // An operator deletes the record; the holder has not released it yet. A new
    // acquisition through this instance takes a key of its own, and the old holder's
    // release (a plain delete of the session's key) leaves it in place.
    raw.delete(session_key.clone(), None).await.unwrap();
    let fourth = Owner::new(HolderLabel::new("fourth").unwrap());
    let fencing = acquired(b.acquire(&name, &fourth, ttl).await.unwrap());
    let found = records(&raw).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].0,
        format!(
            "{session_key}.{}",
            fourth.token.to_string().replace('-', "")
        )
    );
    assert_eq!(
        b.release(&name, &third.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::NotOwner
    );
    let info = b
        .inspect(&name)
        .await
        .unwrap()
        .expect("the new record is there");
    assert_eq!(info.holder.as_deref(), Some("fourth"));
    assert_eq!(info.fencing, Some(fencing));
    assert_eq!(
        b.release(&name, &fourth.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
    assert!(records(&raw).await.is_empty());

    // A record of the earlier layout holds the name; a force release clears every key of
    // the name.
    let old_owner = lease_core::OwnerToken::random();
    raw.put(
        name_key.clone(),
        format!("lease1\nheld\n{old_owner}\nold-host:7"),
        None,
    )
    .await
    .unwrap();
    match b.acquire(&name, &second, ttl).await.unwrap() {
        AcquireOutcome::Held(by) => assert_eq!(by.holder.as_deref(), Some("old-host:7")),
        AcquireOutcome::Acquired { .. } => panic!("acquired over a record of the earlier layout"),
    }
    assert!(b.force_release(&name).await.unwrap());
    assert!(records(&raw).await.is_empty());
    acquired(b.acquire(&name, &second, ttl).await.unwrap());
    assert_eq!(
        b.release(&name, &second.token, Duration::ZERO)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
}
