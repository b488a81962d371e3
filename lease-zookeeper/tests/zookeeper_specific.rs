//! What only ZooKeeper does: sessions bounded by the server, a session that outlives a
//! server restart keeping its leases, sessions closed with the backend, digest ACLs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, HolderLabel, InvalidInput, LeaseBackend, LeaseClient, LeaseName,
    LeaseOptions, Owner, RenewItem, RenewOutcome,
};
use lease_test_servers::ZooKeeperServer;
use lease_test_servers::proxy::{FaultProxy, ProxyFault};
use lease_zookeeper::{ZkBackend, ZkConfig};
use tokio::time::Instant;

fn config() -> ZkConfig {
    let ns = lease_conformance::suite::namespace();
    ZkConfig::default()
        .with_prefix(format!("/{}", ns.trim_end_matches('/')))
        .with_request_timeout(Duration::from_secs(2))
}

/// A ZooKeeper server of the test's own (a local process: it is killed, frozen and
/// restarted) and a backend connected to it with `config`.
async fn local(config: ZkConfig) -> (ZooKeeperServer, ZkBackend) {
    let server = ZooKeeperServer::start_local().await.unwrap();
    let b = ZkBackend::connect_with(&server.address(), config)
        .await
        .unwrap();
    (server, b)
}

/// A backend connected to the shared server through a fault proxy (passing everything
/// until told otherwise).
async fn behind_proxy() -> (FaultProxy, ZkBackend) {
    let servers = ZooKeeperServer::shared().await.unwrap();
    let proxy = FaultProxy::start(servers.parse().unwrap()).await.unwrap();
    let b = ZkBackend::connect_with(&proxy.addr().to_string(), config())
        .await
        .unwrap();
    (proxy, b)
}

/// One renewal try, cut after 300 ms (a call on a disconnected session waits for the
/// connection, up to the request timeout): Ok(true) renewed, Ok(false) no answer yet or a
/// retryable error, Err lost or a final error.
async fn renew_once(b: &ZkBackend, item: &[RenewItem], ttl: Duration) -> Result<bool, String> {
    match tokio::time::timeout(Duration::from_millis(300), b.renew(item, ttl)).await {
        Ok(Ok(v)) if v == [RenewOutcome::Renewed] => Ok(true),
        Ok(Ok(v)) => Err(format!("lost: {v:?}")),
        Ok(Err(e)) if e.is_retryable() => Ok(false),
        Ok(Err(e)) => Err(format!("{e:?}")),
        Err(_) => Ok(false),
    }
}

fn owner(label: &str) -> Owner {
    Owner::new(HolderLabel::new(label).unwrap())
}

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

/// The minimum TTL is the server's shortest session (2 ticks of 200 ms on the test
/// server), asked of it at connect; a configured minimum below it is raised to it.
#[tokio::test]
async fn the_minimum_ttl_is_the_servers_shortest_session() {
    let servers = ZooKeeperServer::shared().await.unwrap();
    let b = ZkBackend::connect_with(&servers, config()).await.unwrap();
    assert_eq!(b.capabilities().min_ttl, Duration::from_millis(400));
    let low = config().with_min_ttl(Duration::from_millis(100));
    let b = ZkBackend::connect_with(&servers, low).await.unwrap();
    assert_eq!(b.capabilities().min_ttl, Duration::from_millis(400));
    let high = config().with_min_ttl(Duration::from_secs(3));
    let b = ZkBackend::connect_with(&servers, high).await.unwrap();
    assert_eq!(b.capabilities().min_ttl, Duration::from_secs(3));
}

/// A TTL above the server's `maxSessionTimeout` (600 s on the test server) is refused with
/// a typed error before anything is created: a session shorter than the TTL could drop
/// the lease before its holder's deadline.
#[tokio::test]
async fn a_ttl_above_the_servers_session_maximum_is_refused() {
    let servers = ZooKeeperServer::shared().await.unwrap();
    let b = ZkBackend::connect_with(&servers, config()).await.unwrap();
    let e = b
        .acquire(&name("long"), &owner("a"), Duration::from_secs(700))
        .await
        .unwrap_err();
    match &e {
        Error::InvalidInput(InvalidInput::TooLarge { max, .. }) => {
            assert_eq!(*max, Duration::from_secs(600), "{e}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(!e.is_retryable());
    assert!(b.inspect(&name("long")).await.unwrap().is_none());
}

/// Curator's rule: a connection lost (SUSPENDED) is not a session lost. The server is
/// killed and started again within the TTL: the client's session reconnects, the lease
/// is still held by the same token, and its guard never reported a loss.
#[tokio::test]
async fn a_server_restart_within_the_ttl_keeps_the_lease() {
    let mut server = ZooKeeperServer::start_local().await.unwrap();
    let b: Arc<dyn LeaseBackend> = Arc::new(
        ZkBackend::connect_with(&server.address(), config())
            .await
            .unwrap(),
    );
    let ttl = Duration::from_secs(8);
    let client = LeaseClient::new(b.clone());
    let opts = LeaseOptions::new(ttl).unwrap();
    let lease_core::TryAcquire::Acquired(g) = client.try_acquire("kept", &opts).await.unwrap()
    else {
        panic!("held")
    };
    let token = g.fencing();
    server.kill().unwrap();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.start_again().await.unwrap();
    let outage = down.elapsed();
    eprintln!("zookeeper down for {outage:?} (ttl {ttl:?})");
    assert!(
        outage < ttl / 2,
        "the restart took {outage:?}: too long for this test"
    );
    // Two renewal periods after the restart: renewed on the old session.
    tokio::time::sleep(ttl * 2 / 3).await;
    assert!(g.is_held(), "lost: {:?}", g.loss_reason());
    let info = b.inspect(&name("kept")).await.unwrap().expect("held");
    assert_eq!(info.fencing, Some(token));
    let other = owner("other");
    assert!(matches!(
        b.acquire(&name("kept"), &other, ttl).await.unwrap(),
        AcquireOutcome::Held(_)
    ));
    g.release().await.unwrap();
}

/// The client library waits twice as long before each round of reconnection attempts
/// (100 ms, 200 ms, 400 ms, ... with no cap but the session's end): after an outage of a
/// few seconds its next attempt can come seconds after the server is back, and where
/// that is past 7/5 of the session timeout it declares the session expired although the
/// server kept it. The backend resumes a session that has been disconnected for a second
/// on a new connection of its own, tried every 250 ms: the lease is renewed within a
/// moment of the restart. The outage's length is the subject, so it is a sleep (7 s: the
/// client library's attempts come 6.3 s and then 12.7 s after the cut, so its own next
/// try comes about 5.7 s minus the restart's time after the server is back).
///
/// Past the client library's own next attempt, its connection (retired when the session
/// was resumed) reconnects once and ends; the lease is still held, by the same token.
#[tokio::test]
async fn a_session_is_resumed_promptly_after_a_long_outage() {
    let (mut server, b) = local(config()).await;
    let ttl = Duration::from_secs(20);
    let n = name("outage");
    let a = owner("a");
    let AcquireOutcome::Acquired { fencing, .. } = b.acquire(&n, &a, ttl).await.unwrap() else {
        panic!("held")
    };
    let item = [RenewItem {
        name: n.clone(),
        token: a.token,
    }];
    server.kill().unwrap();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(7)).await;
    server.start_again().await.unwrap();
    let back = Instant::now();
    eprintln!(
        "zookeeper down {:?}, restarted in {:?}",
        back - down,
        back - down - Duration::from_secs(7)
    );
    while !renew_once(&b, &item, ttl).await.unwrap() {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "not renewed {:?} after the server was back",
            back.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = back.elapsed();
    eprintln!("renewed {took:?} after the server was back");
    assert!(
        took < Duration::from_secs(2),
        "renewed {took:?} after the server was back: the session waited for the client library's next attempt"
    );
    // Past the client library's own next attempt (12.7 s after the cut, with jitter).
    while down.elapsed() < Duration::from_secs(15) {
        renew_once(&b, &item, ttl).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let start = Instant::now();
    while !renew_once(&b, &item, ttl).await.unwrap() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "no renewal after the old connection ended"
        );
    }
    let info = b.inspect(&n).await.unwrap().expect("held");
    assert_eq!(info.fencing, Some(fencing));
    assert_eq!(
        b.release(&n, &a.token, Duration::ZERO).await.unwrap(),
        lease_core::ReleaseOutcome::Released
    );
}

/// A server that accepts a connection while it starts and never answers on it (ZooKeeper
/// 3.8 does so with the first connection made in the moment it starts listening in 7 of
/// 10 restarts, `scripts/zookeeper-restart-probe.py`, while it answers the next at once)
/// must not hold up the session's resumption: an attempt unanswered for a second no
/// longer keeps the next one from starting. Here the proxy refuses every connection past
/// the client library's attempt about 6.3 s after the cut, swallows the connections made
/// in the next 500 ms for good, then passes new ones: the lease must be renewed within
/// 3 s of that, long before the client library's own next attempt (12.7 s after the
/// cut). Before, the swallowed attempt held the session's resumption for its whole bound
/// (8 s for this 20 s session): 3.2 s and failing, in 2 of 2 runs. The client library's
/// schedule is the subject: sleeps.
#[tokio::test]
async fn a_resume_attempt_the_server_never_answers_does_not_hold_up_the_next() {
    let (proxy, b) = behind_proxy().await;
    let ttl = Duration::from_secs(20);
    let n = name("swallowed");
    let a = owner("a");
    assert!(matches!(
        b.acquire(&n, &a, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let item = [RenewItem {
        name: n.clone(),
        token: a.token,
    }];
    proxy.set(ProxyFault::Reset);
    let cut = Instant::now();
    tokio::time::sleep_until(cut + Duration::from_millis(7000)).await;
    let before = proxy.connections();
    proxy.set(ProxyFault::SwallowNew);
    tokio::time::sleep_until(cut + Duration::from_millis(7500)).await;
    let swallowed = proxy.connections() - before;
    proxy.set(ProxyFault::Pass);
    let open = Instant::now();
    assert!(
        swallowed > 0,
        "no connection was made while new ones were swallowed"
    );
    while !renew_once(&b, &item, ttl).await.unwrap() {
        assert!(
            open.elapsed() < Duration::from_secs(3),
            "not renewed {:?} after new connections were passed again ({swallowed} swallowed)",
            open.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "renewed {:?} after new connections were passed again ({swallowed} swallowed)",
        open.elapsed()
    );
    assert_eq!(
        b.release(&n, &a.token, Duration::ZERO).await.unwrap(),
        lease_core::ReleaseOutcome::Released
    );
}

/// A connection the backend replaced (the session resumed on a new one) declares the
/// session expired on its own once it has not reached a server for 7/5 of the session
/// timeout; a request still queued on it then fails `SessionExpired`. That must not end
/// the session the new connection keeps. Timed, as the subject is the client library's
/// schedule: an 8 s session, the server killed for 6.9 s (its attempts at 6.3 s and then
/// 12.7 s after the cut, past the old connection's end at 11.2 s at the latest); a
/// renewal sent at 6.9 s waits on the old connection (request timeout 5 s) and fails
/// `SessionExpired` when it ends. A lease taken on the resumed session after the restart
/// (before the old connection ends) must still renew after that.
#[tokio::test]
async fn a_replaced_connection_declaring_the_session_expired_does_not_end_it() {
    let (mut server, b) = local(config().with_request_timeout(Duration::from_secs(5))).await;
    let ttl = Duration::from_secs(8);
    let a = owner("a");
    let (first, second) = (name("first"), name("second"));
    assert!(matches!(
        b.acquire(&first, &a, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let item = |n: &LeaseName| {
        [RenewItem {
            name: n.clone(),
            token: a.token,
        }]
    };
    server.kill().unwrap();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_millis(6900)).await;
    let queued = {
        let (b, items) = (b.clone(), item(&first));
        tokio::spawn(async move { (b.renew(&items, ttl).await, down.elapsed()) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.start_again().await.unwrap();
    // The second lease, once the session is on its new connection: tries cut at 300 ms
    // (one queued on the old connection is never sent: that connection ends before it
    // reconnects; its record is the sweep's, and the try that answers replaces it).
    loop {
        if let Ok(Ok(AcquireOutcome::Acquired { .. })) =
            tokio::time::timeout(Duration::from_millis(300), b.acquire(&second, &a, ttl)).await
        {
            break;
        }
        assert!(down.elapsed() < Duration::from_secs(10), "no connection");
    }
    let (renewed, at) = queued.await.unwrap();
    eprintln!("the renewal queued on the old connection: {renewed:?} after {at:?}");
    // It failed when the old connection ended (before the request timeout ran out): not
    // "lost" (the session lives on), retryable.
    let e = renewed.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(at < Duration::from_millis(11_800), "{at:?}");
    let after = b.renew(&item(&second), ttl).await.unwrap();
    assert_eq!(
        after,
        [RenewOutcome::Renewed],
        "the resumed session was ended"
    );
}

/// A lease nobody renews is deleted by the sweep at its TTL; when that delete gets no
/// answer (here every byte to the server is swallowed from just before the TTL until
/// after the request timeout, shorter than the session timeout, so the session lives
/// on), the sweep tries again while the session lives. Before, it forgot the lease after
/// the one failed try, and the holder node stayed for as long as the backend kept the
/// session, blocking every other owner. The TTL's expiry is the subject: sleeps, with the
/// black hole held 3 s around the sweep's try at 6 s.
#[tokio::test]
async fn an_unrenewed_lease_whose_delete_got_no_answer_is_deleted_later() {
    let (proxy, b) = behind_proxy().await;
    let ttl = Duration::from_secs(6);
    b.prepare(ttl).await.unwrap();
    let n = name("unanswered-sweep");
    let sent = Instant::now();
    assert!(matches!(
        b.acquire(&n, &owner("a"), ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    tokio::time::sleep_until(sent + Duration::from_millis(5500)).await;
    proxy.set(ProxyFault::Blackhole);
    tokio::time::sleep_until(sent + Duration::from_millis(8500)).await;
    proxy.set(ProxyFault::Pass);
    let other = owner("b");
    loop {
        match b.acquire(&n, &other, ttl).await {
            Ok(AcquireOutcome::Acquired { .. }) => break,
            Ok(AcquireOutcome::Held(by)) => assert!(
                sent.elapsed() < Duration::from_secs(13),
                "still held by {by:?} {:?} after the acquire (ttl {ttl:?})",
                sent.elapsed()
            ),
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("free {:?} after the acquire (ttl {ttl:?})", sent.elapsed());
}

/// A backend that is dropped closes its sessions: its ephemeral nodes go at once, not at
/// the session timeout.
#[tokio::test]
async fn dropping_the_backend_frees_its_leases_at_once() {
    let servers = ZooKeeperServer::shared().await.unwrap();
    let cfg = config();
    let a = ZkBackend::connect_with(&servers, cfg.clone())
        .await
        .unwrap();
    let ttl = Duration::from_secs(20);
    assert!(matches!(
        a.acquire(&name("dropped"), &owner("a"), ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    drop(a);
    let b = ZkBackend::connect_with(&servers, cfg).await.unwrap();
    let start = Instant::now();
    taken_by_within(
        &b,
        &name("dropped"),
        ttl,
        start + Duration::from_secs(5),
        "the holder's backend was dropped",
    )
    .await;
    eprintln!(
        "free {:?} after the holder's backend was dropped",
        start.elapsed()
    );
}

/// Tries `n` with `b` every 20 ms until it is acquired; fails the test if it is still
/// held at `limit` (`after` says since what).
async fn taken_by_within(b: &ZkBackend, n: &LeaseName, ttl: Duration, limit: Instant, after: &str) {
    loop {
        match b.acquire(n, &owner("b"), ttl).await.unwrap() {
            AcquireOutcome::Acquired { .. } => return,
            AcquireOutcome::Held(_) => {
                assert!(
                    Instant::now() < limit,
                    "{n} still held at the limit after {after} (ttl {ttl:?})"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// With digest credentials the backend's nodes are its user's only (`auth` ACL): a
/// backend without credentials, or with a wrong password, is refused when it connects
/// with a typed, non-retryable error.
#[tokio::test]
async fn digest_credentials_keep_other_users_out() {
    let servers = ZooKeeperServer::shared().await.unwrap();
    let cfg = config();
    let owner_cfg = cfg.clone().with_credentials("app", "s3cret");
    let a = ZkBackend::connect_with(&servers, owner_cfg).await.unwrap();
    let ttl = Duration::from_secs(5);
    assert!(matches!(
        a.acquire(&name("private"), &owner("a"), ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    for (who, c) in [
        ("no credentials", cfg.clone()),
        (
            "a wrong password",
            cfg.clone().with_credentials("app", "wrong"),
        ),
    ] {
        // Refused at connect: the prefix's nodes are not this user's to write.
        let e = ZkBackend::connect_with(&servers, c).await.expect_err(who);
        assert!(matches!(e, Error::Rejected { .. }), "{who}: {e:?}");
        assert!(!e.is_retryable(), "{who}");
        assert!(!format!("{e} {e:?}").contains("s3cret"));
    }
    assert!(a.inspect(&name("private")).await.unwrap().is_some());
}

/// The first acquire with a TTL opens that TTL's session; when the caller gives up on it
/// (its call timeout), the opening still finishes and the session is kept. Every chunk
/// between client and server is delayed 100 ms (a proxy), so opening a session takes
/// several hundred ms, and every call below is cut after 20 ms: had each cut opening been
/// thrown away, no call could ever find a session ready.
#[tokio::test]
async fn a_session_whose_opening_the_caller_gave_up_on_is_kept() {
    let (proxy, b) = behind_proxy().await;
    proxy.set(ProxyFault::Delay(Duration::from_millis(100)));
    let ttl = Duration::from_millis(1700);
    let cut = Duration::from_millis(20);
    let first = tokio::time::timeout(cut, b.acquire(&name("cut-short"), &owner("a"), ttl)).await;
    assert!(
        first.is_err(),
        "the first acquire with a new TTL answered within {cut:?}"
    );
    let start = Instant::now();
    loop {
        if let Ok(done) = tokio::time::timeout(cut, b.prepare(ttl)).await {
            done.unwrap();
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no call found the session ready: the cut openings were not kept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the session was ready {:?} after the first acquire was cut",
        start.elapsed()
    );
}

/// A call whose connection the client library gives up on (no answer within 2/5 of the
/// session timeout: the server is frozen) fails retryably, as after a lost connection;
/// it was a non-retryable backend error ("no response from connection in 400ms"). The
/// acquire is sent again on the session until the request timeout (2 s), its fourth try,
/// or the session's end: with the server frozen throughout, it fails `unavailable` (the
/// client library's "no response from connection" on the fourth try), or with the
/// session expired (the client library declares it so after 7/5 of its 1 s timeout
/// without contact, which comes before the request timeout), whichever comes first; both
/// retryable. Once the server runs again the name is
/// free (or freed by the sweep at the TTL, where the server applied the acquire: its
/// record stays, the outcome being unknown) and taken by another owner.
#[tokio::test]
async fn a_call_on_a_connection_given_up_fails_retryably_and_leaves_nothing_held() {
    let (mut server, b) = local(config()).await;
    let ttl = Duration::from_secs(1);
    b.prepare(ttl).await.unwrap();
    let n = name("frozen");
    server.pause().unwrap();
    let sent = Instant::now();
    let e = b.acquire(&n, &owner("a"), ttl).await.unwrap_err();
    let failed = sent.elapsed();
    server.resume().unwrap();
    eprintln!("acquire on a frozen server: {e} after {failed:?}");
    // The client library's "no response from connection", or the session it declared
    // expired; never past this backend's request timeout of 2 s.
    let session_expired = matches!(
        &e,
        Error::Backend { source, .. } if source.to_string().contains("session expired")
    );
    assert!(e.kind() == "unavailable" || session_expired, "{e:?}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(failed < Duration::from_millis(2500), "{failed:?}");
    // Whatever the server applied once it ran again: free within the TTL and the sweep's
    // period after the call was sent (allowing 3 s for the session to reconnect).
    loop {
        let answer = b.inspect(&n).await;
        if let Ok(None) = answer {
            break;
        }
        assert!(
            sent.elapsed() < ttl + Duration::from_secs(3),
            "still held or unreadable: {answer:?}"
        );
        if let Err(e) = &answer {
            assert!(e.is_retryable(), "{e:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = b.acquire(&n, &owner("b"), ttl).await;
    assert!(
        matches!(again, Ok(AcquireOutcome::Acquired { .. })),
        "{again:?}"
    );
}

/// An acquire whose connection the client library gives up on while the server is frozen
/// for less than the request timeout is sent again on the same session once the server
/// answers, and takes the lease: a stall longer than 2/5 of the session timeout (800 ms
/// for a 2 s TTL) answers late instead of failing. The freeze (1.2 s) is held by a sleep
/// because a stall's length is what the test is about; it stays below the session
/// timeout, so the session and its nodes survive. Before, this acquire failed
/// `unavailable` ("no response from connection in 800ms").
#[tokio::test]
async fn an_acquire_whose_connection_is_given_up_is_sent_again_within_the_request_timeout() {
    let (mut server, b) = local(config().with_request_timeout(Duration::from_secs(5))).await;
    let ttl = Duration::from_secs(2);
    b.prepare(ttl).await.unwrap();
    let n = name("stalled");
    let a = owner("a");
    server.pause().unwrap();
    let sent = Instant::now();
    let acquire = {
        let (b, n, a) = (b.clone(), n.clone(), a.clone());
        tokio::spawn(async move { b.acquire(&n, &a, ttl).await })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    server.resume().unwrap();
    let got = acquire.await.unwrap();
    eprintln!(
        "acquire across a 1.2 s freeze: {got:?} after {:?}",
        sent.elapsed()
    );
    let fencing = match got {
        Ok(AcquireOutcome::Acquired { fencing, .. }) => fencing,
        other => panic!("the acquire across the freeze: {other:?}"),
    };
    let info = b.inspect(&n).await.unwrap().expect("held");
    assert_eq!(info.holder.as_deref(), Some("a"));
    assert_eq!(info.fencing, Some(fencing));
    assert_eq!(
        b.release(&n, &a.token, Duration::ZERO).await.unwrap(),
        lease_core::ReleaseOutcome::Released
    );
}

/// With `ZkConfig::with_runtime` the sessions live on the given runtime: the backend
/// works while that runtime runs; once it has shut down, a call fails at once with a
/// typed, non-retryable error that says why (no wait for the request timeout), and the
/// leases it held are freed by the server within their TTL.
#[tokio::test]
async fn sessions_on_a_given_runtime_end_with_it() {
    let servers = ZooKeeperServer::shared().await.unwrap();
    let side = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a = ZkBackend::connect_with(&servers, config().with_runtime(side.handle().clone()))
        .await
        .unwrap();
    let ttl = Duration::from_secs(3);
    let held = name("given-runtime");
    let o = owner("a");
    assert!(matches!(
        a.acquire(&held, &o, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let item = [RenewItem {
        name: held.clone(),
        token: o.token,
    }];
    assert_eq!(a.renew(&item, ttl).await.unwrap(), [RenewOutcome::Renewed]);
    // Shut down, its worker thread joined (every task on it dropped).
    tokio::task::spawn_blocking(move || side.shutdown_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
    let start = Instant::now();
    let e = a
        .acquire(&name("after-shutdown"), &owner("a"), ttl)
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "the call waited {:?}",
        start.elapsed()
    );
    let says = |e: &Error| {
        assert!(!e.is_retryable(), "{e:?}");
        assert!(
            e.to_string().contains("ZkConfig::runtime has shut down"),
            "{e}"
        );
    };
    says(&e);
    says(&a.renew(&item, ttl).await.unwrap_err());
    says(
        &a.release(&held, &o.token, Duration::ZERO)
            .await
            .unwrap_err(),
    );
    // Another backend gets the name once the session's timeout has passed on the server
    // (tolerance: the server checks sessions every tick, 200 ms, and a few polls).
    let b = ZkBackend::connect_with(&servers, config()).await.unwrap();
    taken_by_within(
        &b,
        &held,
        ttl,
        start + ttl + Duration::from_secs(2),
        "the runtime ended",
    )
    .await;
    eprintln!("free {:?} after the runtime ended", start.elapsed());
}

/// Releases every name of `names` (taken as `taken` says) with `keep_for`, all at once.
async fn release_all(
    b: &ZkBackend,
    names: &[LeaseName],
    taken: &[(lease_core::OwnerToken, Instant)],
    keep_for: Duration,
) {
    let released = futures::future::join_all(
        names
            .iter()
            .zip(taken)
            .map(|(n, (token, _))| b.release(n, token, keep_for)),
    )
    .await;
    for r in released {
        assert_eq!(r.unwrap(), lease_core::ReleaseOutcome::Released);
    }
}

/// Keep-for holds although the server's reaper of TTL and container nodes listed the
/// name's holder path before. The reaper (ZooKeeper's container manager) lists the
/// lapsed TTL nodes, then deletes them one at a time (6 ms apart at its default of 10,000
/// per minute), by path: the server checks at the delete that the node there has no
/// children and is a TTL or container node, not that its TTL has passed. A keep-for
/// kept in a TTL node at the holder's path was deleted that way when the name was taken
/// and released again while the pass was under way, and the name was free long before
/// its keep-for ended.
///
/// Here 200 names get a keep-for of 300 ms at once, so that one pass lists them all and
/// takes 1.2 s to delete them; 200 ms after they lapsed (the reaper looks every 100 ms on
/// the test servers) each is taken over and released with a keep-for of 30 s; once the
/// pass is over (2 s on), none may be free.
#[tokio::test]
async fn keep_for_outlives_a_reaper_pass_that_listed_the_name_before() {
    const NAMES: usize = 200;
    let server = ZooKeeperServer::start().await.unwrap();
    let b = ZkBackend::connect_with(&server.address(), config())
        .await
        .unwrap();
    let ttl = Duration::from_secs(5);
    let names: Vec<LeaseName> = (0..NAMES).map(|i| name(&format!("reaped-{i}"))).collect();
    let take = |n: &LeaseName, label: &str| {
        let (b, n, o) = (b.clone(), n.clone(), owner(label));
        async move {
            match b.acquire(&n, &o, ttl).await.unwrap() {
                AcquireOutcome::Acquired { .. } => (o.token, Instant::now()),
                other => panic!("{n} not free: {other:?}"),
            }
        }
    };
    let first = futures::future::join_all(names.iter().map(|n| take(n, "first"))).await;
    let lapse = first.iter().map(|(_, at)| *at).max().unwrap() + Duration::from_millis(300);
    release_all(&b, &names, &first, Duration::from_millis(300)).await;
    tokio::time::sleep_until(lapse + Duration::from_millis(200)).await;
    let second = futures::future::join_all(names.iter().map(|n| take(n, "second"))).await;
    release_all(&b, &names, &second, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let third = owner("third");
    let mut free = Vec::new();
    for n in &names {
        if let AcquireOutcome::Acquired { .. } = b.acquire(n, &third, ttl).await.unwrap() {
            free.push(n.to_string());
        }
    }
    assert!(
        free.is_empty(),
        "{} of {NAMES} names free within their keep-for of 30 s: {free:?}",
        free.len()
    );
}
