//! Checks of [`Election`] on the backend under test: one leader at a time, terms that
//! grow, leadership that moves when a leader dies, a leader that learns it was deposed
//! before the next one leads, and an observer that sees every leadership, in order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{Election, Fencing, Leader, LeaseBackend, LeaseOptions};
use tokio::time::Instant;

use super::{EXPIRY_TOLERANCE, base_ttl, client, name, namespace, owner, raw_acquire};
use crate::faulty::{Fault, FaultyBackend, Op};

fn opts(ttl: Duration) -> LeaseOptions {
    LeaseOptions::new(ttl).expect("valid options")
}

/// Five candidates each run a term of work with `run_while_leader`: never two leaders at
/// once, and each term is higher than the one before (where the backend issues tokens).
pub async fn election_one_leader_at_a_time_terms_grow(backend: Arc<dyn LeaseBackend>) {
    let fenced = backend.capabilities().fencing != Fencing::None;
    let ns = namespace();
    let n = name(&ns, "leader");
    let ttl = base_ttl(&*backend) * 5;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..5 {
        let election = Election::new(client(&backend, &format!("c{c}")), &n).expect("election");
        let (inside, max_inside, terms) = (inside.clone(), max_inside.clone(), terms.clone());
        let o = opts(ttl);
        tasks.push(tokio::spawn(async move {
            election
                .run_while_leader(&o, |ctx| {
                    let (inside, max_inside, terms) =
                        (inside.clone(), max_inside.clone(), terms.clone());
                    async move {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        terms.lock().expect("lock").push(ctx.fencing.get());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .await
                .expect("run_while_leader");
        }));
    }
    for t in tasks {
        t.await.expect("candidate");
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two leaders at once");
    let terms = terms.lock().expect("lock").clone();
    assert_eq!(terms.len(), 5, "every candidate led once: {terms:?}");
    assert!(
        !fenced || terms.windows(2).all(|w| w[0] < w[1]),
        "terms did not grow with each leadership: {terms:?}"
    );
}

/// A leader that dies (its lease never renewed again) is replaced within its TTL plus the
/// store's expiry tolerance, with a higher term, and an observer sees the old leader,
/// then the new one (terms where the backend issues tokens; holders where it reports
/// them).
pub async fn election_moves_when_the_leader_dies(backend: Arc<dyn LeaseBackend>) {
    let caps = backend.capabilities();
    if !caps.expires || caps.fencing == Fencing::None {
        // Without terms the observer cannot tell one leadership from the next; the
        // other election checks cover such a backend.
        return;
    }
    let ns = namespace();
    let n = name(&ns, "leader");
    let ttl = base_ttl(&*backend);
    let observer = Election::new(client(&backend, "observer"), &n).expect("election");
    let observed = Observed::start(observer.observe(Duration::from_millis(20)));
    let died_at = Instant::now();
    let dead_term = raw_acquire(&*backend, &n, &owner("dead-leader"), ttl).await;
    // The leaders seen (a vacancy is left out): holder and term.
    let leaders = |seen: Vec<Option<Leader>>| -> Vec<(Option<String>, Option<u64>)> {
        seen.into_iter()
            .flatten()
            .map(|l| (l.holder, l.term.map(|t| t.get())))
            .collect()
    };
    let candidate = Election::new(client(&backend, "next-leader"), &n).expect("election");
    let leadership = candidate.campaign(&opts(ttl)).await.expect("campaign");
    let took = died_at.elapsed();
    assert!(
        took >= ttl,
        "a new leader after {took:?}, before the dead leader's TTL {ttl:?}"
    );
    let bound = ttl + ttl / 3 + EXPIRY_TOLERANCE;
    assert!(
        took <= bound,
        "leadership took {took:?} to move (bound {bound:?})"
    );
    let term = leadership.term();
    assert!(term > dead_term, "term {term} after {dead_term}");
    // The observer catches up with the new leader.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let latest = leaders(observed.snapshot()).last().cloned();
        if latest.as_ref().and_then(|l| l.1) == Some(term.get()) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the observer never saw the new leader: {latest:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = leaders(observed.stop());
    let terms: Vec<u64> = seen.iter().filter_map(|s| s.1).collect();
    if backend.capabilities().holder_info {
        assert_eq!(
            seen.first().and_then(|s| s.0.as_deref()),
            Some("dead-leader"),
            "{seen:?}"
        );
    }
    assert_eq!(terms.first(), Some(&dead_term.get()), "{seen:?}");
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms out of order: {seen:?}"
    );
    leadership.resign().await.expect("resign");
}

/// Six leaderships in a row, handed on by resigning (to a candidate that campaigns
/// after, and to one already waiting): an observer polling every 20 ms sees each of them,
/// once, in the order they led, and nothing else; each lasts 150 ms, longer than the
/// observer's poll plus a read, which is what the observer promises to see.
pub async fn election_observer_sees_every_leadership_in_order(backend: Arc<dyn LeaseBackend>) {
    election_observer_check(backend, Duration::from_millis(20)).await;
}

/// The body of `election_observer_sees_every_leadership_in_order`, with the observer's
/// poll as a parameter (a poll longer than a leadership makes it fail).
#[doc(hidden)]
pub async fn election_observer_check(backend: Arc<dyn LeaseBackend>, poll: Duration) {
    let caps = backend.capabilities();
    if caps.fencing == Fencing::None && !caps.holder_info {
        // Neither terms nor holders: one leadership cannot be told from the next.
        return;
    }
    let ns = namespace();
    let n = name(&ns, "leader");
    let ttl = base_ttl(&*backend) * 5;
    let hold = Duration::from_millis(150);
    let observer = Election::new(client(&backend, "observer"), &n).expect("election");
    let observed = Observed::start(observer.observe(poll));
    // What each leadership looks like to the observer: its holder label where the
    // store reports one, and its term where it issues one.
    let key = |holder: Option<String>, term: Option<u64>| {
        (
            if caps.holder_info { holder } else { None },
            if caps.fencing == Fencing::None {
                None
            } else {
                term
            },
        )
    };
    let mut led = Vec::new();
    let mut waiting: Option<tokio::task::JoinHandle<lease_core::Leadership>> = None;
    for i in 0..6 {
        let label = format!("leader-{i}");
        let leadership = match waiting.take() {
            Some(task) => task.await.expect("waiting candidate"),
            None => Election::new(client(&backend, &label), &n)
                .expect("election")
                .campaign(&opts(ttl))
                .await
                .expect("campaign"),
        };
        led.push(key(Some(label), Some(leadership.term().get())));
        if i % 2 == 0 && i < 5 {
            // The next candidate waits while this one leads: the hand-off is direct.
            let next = Election::new(client(&backend, &format!("leader-{}", i + 1)), &n)
                .expect("election");
            let o = opts(ttl);
            waiting = Some(tokio::spawn(async move {
                next.campaign(&o).await.expect("campaign")
            }));
        }
        tokio::time::sleep(hold).await;
        leadership.resign().await.expect("resign");
    }
    // The observer reads the last resignation within a poll and a read.
    let until = Instant::now() + Duration::from_secs(5);
    while observed.snapshot().last().is_none_or(|l| l.is_some()) {
        assert!(
            Instant::now() < until,
            "the observer never saw the last resignation: {:?}",
            observed.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = observed.stop();
    let mut leaders: Vec<_> = seen
        .iter()
        .flatten()
        .map(|l| key(l.holder.clone(), l.term.map(|t| t.get())))
        .collect();
    leaders.dedup();
    assert_eq!(
        leaders, led,
        "the observer's leaders are not the leaderships in order: seen {seen:?}"
    );
}

/// Every value an observer's receiver is given, in order, collected by a task of its own
/// until [`Observed::stop`].
struct Observed {
    seen: Arc<Mutex<Vec<Option<Leader>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Observed {
    fn start(mut watch: tokio::sync::watch::Receiver<Option<Leader>>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while watch.changed().await.is_ok() {
                    let leader = watch.borrow_and_update().clone();
                    seen.lock().expect("lock").push(leader);
                }
            })
        };
        Observed { seen, task }
    }

    /// What was seen so far.
    fn snapshot(&self) -> Vec<Option<Leader>> {
        self.seen.lock().expect("lock").clone()
    }

    /// Stops collecting; what was seen.
    fn stop(self) -> Vec<Option<Leader>> {
        self.task.abort();
        self.snapshot()
    }
}

/// A leader whose renewals fail (paused, cut off) learns it lost leadership before the
/// next candidate leads. Reported not applicable (see [`crate::not_applicable_reports`])
/// to a backend without lead time or expiry.
pub async fn election_deposed_leader_knows_first(backend: Arc<dyn LeaseBackend>) {
    if !crate::not_applicable::lead_time_applies(&*backend, "election_deposed_leader_knows_first") {
        return;
    }
    let ns = namespace();
    let n = name(&ns, "leader");
    let ttl = base_ttl(&*backend);
    let faulty = Arc::new(FaultyBackend::new(backend.clone()));
    faulty.set(Op::Renew, Fault::Fail);
    let doomed = Election::new(
        client(&(faulty.clone() as Arc<dyn LeaseBackend>), "doomed"),
        &n,
    )
    .expect("election");
    let leadership = doomed.campaign(&opts(ttl)).await.expect("campaign");
    // The deposed leader's guard stays alive and never releases: the next leader can
    // only come after the store lets the lease lapse. Its belief ends at its deadline
    // (read off the guard, not the time a task woke to see it).
    let watching = tokio::spawn(async move {
        leadership.lost().await;
        let deadline = leadership.guard().deadline();
        let believed = leadership.is_leading();
        (leadership, deadline, believed)
    });
    let next = Election::new(client(&backend, "next"), &n).expect("election");
    let taken = tokio::time::timeout(ttl * 2 + EXPIRY_TOLERANCE * 2, next.campaign(&opts(ttl)))
        .await
        .expect("no new leader within 2x TTL")
        .expect("campaign");
    let led_at = Instant::now();
    let (deposed, deadline, believed) = watching.await.expect("watcher");
    assert!(!believed, "is_leading after the lost signal");
    assert!(
        deadline < led_at,
        "a new leader {:?} before the old one's belief ended",
        deadline - led_at
    );
    deposed.into_guard().disarm();
    taken.resign().await.expect("resign");
}
