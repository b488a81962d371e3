//! The conformance suite for `lease` backends, and decorators that inject faults into a
//! backend ([`FaultyBackend`]) or time its calls ([`TimedBackend`]): what the author of a
//! backend for another store needs to prove it. It depends on `lease-core` and small
//! crates only.
//!
//! A backend proves itself by running every check in [`suite`] against a real store, from
//! its crate's `tests/conformance.rs` (with `tokio` as a dev-dependency):
//!
//! ```
//! use std::sync::Arc;
//! use lease_conformance::Fixture;
//!
//! async fn backend() -> Fixture {
//!     // Reach or start your store, connect, and keep the server handle alive:
//!     // Fixture::new(Arc::new(MyBackend::connect(url).await?)).keep(server)
//!     Fixture::new(Arc::new(lease_core::MemoryBackend::new()))
//! }
//!
//! lease_conformance::conformance_suite!(backend);
//! # fn main() {}
//! ```
//!
//! `docs/writing-a-backend.md` in the repository is the whole guide: the trait's
//! contract, a complete minimal backend, [`FaultyBackend`] against your own store, and
//! what each check means when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test suite: failures are assertions

use std::any::Any;
use std::sync::Arc;

use lease_core::LeaseBackend;

/// The guide `docs/writing-a-backend.md`, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../docs/writing-a-backend.md")]
pub struct WritingABackendGuide;

pub mod expect;
mod faulty;
mod not_applicable;
pub mod outage;
pub mod startup;
pub mod suite;
mod timed;

pub use faulty::{Fault, FaultyBackend, Op, RenewCall};
pub use not_applicable::{
    NO_EXPIRY, NO_FENCING, NO_KEEP_FOR, NO_LEAD_TIME, NotApplicable, not_applicable_reports,
};
pub use timed::{Overrun, TimedBackend};

/// A backend under test, plus whatever must live as long as the test (a server handle).
pub struct Fixture {
    /// The backend under test.
    pub backend: Arc<dyn LeaseBackend>,
    keep: Vec<Box<dyn Any + Send>>,
}

impl Fixture {
    /// A fixture for `backend`.
    pub fn new(backend: Arc<dyn LeaseBackend>) -> Self {
        Fixture {
            backend,
            keep: Vec::new(),
        }
    }

    /// Keeps `value` (e.g. a server handle) alive until the test ends.
    pub fn keep(mut self, value: impl Any + Send) -> Self {
        self.keep.push(Box::new(value));
        self
    }
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("backend", &self.backend)
            .field("kept", &self.keep.len())
            .finish()
    }
}

/// Upper bound for one check; a check that runs longer fails instead of hanging.
pub const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs one check with a fixture, failing the test if it exceeds [`CHECK_TIMEOUT`].
pub async fn run_check<F, Fut>(fixture: Fixture, check: F)
where
    F: FnOnce(Arc<dyn LeaseBackend>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let backend = fixture.backend.clone();
    if tokio::time::timeout(CHECK_TIMEOUT, check(backend))
        .await
        .is_err()
    {
        panic!("check did not finish within {CHECK_TIMEOUT:?}");
    }
    drop(fixture);
}

/// The checks that load the store on purpose (many calls at once) rather than time one
/// call: [`suite::cancelled_acquires_leave_nothing_held`] sends 1,000 acquires, 8 at a
/// time, and their clean-up releases. [`conformance_suite!`] runs them alone in their
/// test binary.
pub const LOAD_CHECKS: &[&str] = &["cancelled_acquires_leave_nothing_held"];

/// The checks whose assertion is a time within a tight margin (tens to a few hundred
/// milliseconds: a loss signal and a probe within the safety margin, a deadline counted
/// from the send time with replies held back by an eighth of the TTL, a name freed
/// within half a call timeout, a wait that must end within its TTL, a missed firing run
/// within its 300 ms window): [`conformance_suite!`] runs each of them beside at most one
/// other check, however many checks the test binary runs at once. Checks with a looser
/// time bound (a second or more, or a fraction of a TTL of several seconds) are not
/// listed.
pub const TIMING_CHECKS: &[&str] = &[
    "acquire_wait_times_out",
    "store_down_typed_errors",
    "election_moves_when_the_leader_dies",
    "lost_signal_before_store_expiry",
    "lost_acquire_reply_frees_the_name",
    "deadline_counts_from_send_time",
    "stalled_heartbeat_bounds_lost_and_release",
    "missed_firing_runs_once_on_recovery",
];

/// How many checks of [`conformance_suite!`] run at once in one test binary at most
/// (libtest's `--test-threads` bounds them too): the checks mostly wait for TTLs, so a
/// binary run with `--test-threads=4` takes about half the time it takes with two.
pub const MAX_CHECKS_AT_ONCE: u32 = 4;

/// What kind of check holds a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Load,
    Timing,
    Other,
}

/// The checks of [`conformance_suite!`] running in this test binary.
struct Running {
    checks: u32,
    timing: u32,
    load: bool,
    /// Load checks waiting for their turn: no other check starts meanwhile.
    load_waiting: u32,
}

impl Running {
    /// Whether a check of `kind` may start beside the checks running now.
    fn admits(&self, kind: Kind) -> bool {
        if self.load || (kind != Kind::Load && self.load_waiting > 0) {
            return false;
        }
        match kind {
            Kind::Load => self.checks == 0,
            // At most one companion, of any kind.
            Kind::Timing => self.checks <= 1,
            // Beside a timing check, only as its one companion.
            Kind::Other if self.timing > 0 => self.checks <= 1,
            Kind::Other => self.checks < MAX_CHECKS_AT_ONCE,
        }
    }
}

static RUNNING: std::sync::Mutex<Running> = std::sync::Mutex::new(Running {
    checks: 0,
    timing: 0,
    load: false,
    load_waiting: 0,
});
/// Notified whenever a turn ends.
static TURN_ENDED: tokio::sync::Notify = tokio::sync::Notify::const_new();

fn running() -> std::sync::MutexGuard<'static, Running> {
    RUNNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A check's turn in its test binary, held while the check runs (fixture included); the
/// turn ends when this is dropped.
#[derive(Debug)]
pub struct Turn {
    kind: Kind,
}

impl Drop for Turn {
    fn drop(&mut self) {
        {
            let mut r = running();
            r.checks -= 1;
            match self.kind {
                Kind::Load => r.load = false,
                Kind::Timing => r.timing -= 1,
                Kind::Other => {}
            }
        }
        TURN_ENDED.notify_waiters();
    }
}

/// Waits for the turn of the check named `check`:
/// - a check of [`LOAD_CHECKS`] waits until no other check of [`conformance_suite!`] runs
///   in this test binary, and keeps the others waiting until it ends;
/// - a check of [`TIMING_CHECKS`] runs beside at most one other check;
/// - every other check runs beside up to [`MAX_CHECKS_AT_ONCE`] - 1 others, or beside one
///   timing check alone.
///
/// So a timing check has at most the one companion it had when test binaries ran two
/// tests at a time, while the other checks, which mostly wait for TTLs, run four at a
/// time. A waiting load check holds up the checks after it (so that it is not left until
/// every other check has run); a waiting timing check does not.
///
/// Why: a check whose assertion is a time (a call's deadline counted from its send time
/// with replies held back by an eighth of a 600 ms TTL, a loss signal before the store's
/// expiry) must not share a saturated store and two cores with a check that saturates
/// them. On a 3-member ZooKeeper ensemble on two cores, the 1,000 abandoned acquires of
/// [`suite::cancelled_acquires_leave_nothing_held`] held another check's calls for more than
/// 200 ms, and `deadline_counts_from_send_time` beside it failed in most runs.
///
/// Cancel safety: cancel-safe (a dropped wait holds no turn).
pub async fn turn(check: &str) -> Turn {
    let kind = if LOAD_CHECKS.contains(&check) {
        Kind::Load
    } else if TIMING_CHECKS.contains(&check) {
        Kind::Timing
    } else {
        Kind::Other
    };
    // Counted as waiting while this future lives and the check has no turn.
    let mut waiting = LoadWaiting(kind == Kind::Load);
    if waiting.0 {
        running().load_waiting += 1;
    }
    loop {
        // Registered before the check of the count, so that a turn ending in between
        // still wakes this wait.
        let ended = TURN_ENDED.notified();
        let mut ended = std::pin::pin!(ended);
        ended.as_mut().enable();
        {
            let mut r = running();
            if r.admits(kind) {
                if waiting.0 {
                    waiting.0 = false;
                    r.load_waiting -= 1;
                }
                r.checks += 1;
                match kind {
                    Kind::Load => r.load = true,
                    Kind::Timing => r.timing += 1,
                    Kind::Other => {}
                }
                return Turn { kind };
            }
        }
        ended.await;
    }
}

/// While `.0`: a load check's wait for its turn, counted in `Running::load_waiting`;
/// dropped (the wait cancelled), it is counted no more and the others may start.
struct LoadWaiting(bool);

impl Drop for LoadWaiting {
    fn drop(&mut self) {
        if self.0 {
            running().load_waiting -= 1;
            TURN_ENDED.notify_waiters();
        }
    }
}

/// Turns every check of [`suite`] into a `#[tokio::test]`.
///
/// `$factory` is an `async fn() -> Fixture` (or a path to one). The calling crate needs
/// `tokio` (with the `macros` and `rt-multi-thread` features) as a dev-dependency.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:path) => {
        $crate::conformance_suite!(@checks $factory;
            acquire_then_held,
            fencing_increases_across_release,
            fencing_increases_across_expiry,
            fencing_unique_under_contention,
            mutual_exclusion_64_contenders,
            only_owner_renews,
            only_owner_releases,
            stale_release_is_noop,
            stale_renew_is_lost,
            renew_batch_mixed,
            renew_empty_batch,
            renew_extends_ttl,
            unrenewed_lease_expires,
            release_frees_immediately,
            keep_for_holds_after_release,
            keep_for_elapsed_frees,
            inspect_reports_holder,
            names_do_not_collide,
            invalid_names_rejected,
            invalid_options_rejected,
            watchdog_long_work_not_run_twice,
            run_exclusive_runs_long_work,
            run_exclusive_skips_when_held,
            lost_signal_before_store_expiry,
            lost_signal_when_store_hangs,
            run_exclusive_cancelled_on_loss,
            no_renewal_after_release,
            drop_releases,
            acquire_waits_for_release,
            acquire_wait_times_out,
            scheduled_job_once_per_period,
            store_down_typed_errors,
            heartbeat_batches_renewals,
            force_release_frees_and_holder_learns,
            cancelled_acquires_leave_nothing_held,
            lost_acquire_reply_frees_the_name,
            deadline_counts_from_send_time,
            renew_panic_is_a_failed_renewal,
            heartbeat_runtime_dropped,
            stalled_heartbeat_bounds_lost_and_release,
            lost_token_fires_when_the_run_ends,
            scheduled_job_defaults_once_per_period,
            scheduled_job_validates_keep_for,
            firings_run_once_across_skewed_instances,
            firing_after_a_dropped_run_runs_elsewhere,
            missed_firing_runs_once_on_recovery,
            semaphore_never_more_than_n,
            semaphore_fencing_grows_per_permit,
            semaphore_crashed_permit_expires,
            semaphore_lost_before_permit_taken_over,
            election_one_leader_at_a_time_terms_grow,
            election_moves_when_the_leader_dies,
            election_observer_sees_every_leadership_in_order,
            election_deposed_leader_knows_first
        );
    };
    (@checks $factory:path; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let _turn = $crate::turn(stringify!($check)).await;
                let fixture = $factory().await;
                $crate::run_check(fixture, $crate::suite::$check).await;
            }
        )*
    };
}

#[cfg(test)]
mod turn_tests {
    use super::*;

    fn state(checks: u32, timing: u32, load: bool) -> Running {
        Running {
            checks,
            timing,
            load,
            load_waiting: 0,
        }
    }

    #[test]
    fn a_timing_check_has_at_most_one_companion() {
        assert!(state(0, 0, false).admits(Kind::Timing));
        assert!(state(1, 0, false).admits(Kind::Timing));
        assert!(state(1, 1, false).admits(Kind::Timing));
        assert!(!state(2, 0, false).admits(Kind::Timing));
        // Beside a running timing check, one other check at most.
        assert!(state(1, 1, false).admits(Kind::Other));
        assert!(!state(2, 1, false).admits(Kind::Other));
    }

    #[test]
    fn other_checks_run_up_to_the_limit_and_a_load_check_alone() {
        assert!(state(MAX_CHECKS_AT_ONCE - 1, 0, false).admits(Kind::Other));
        assert!(!state(MAX_CHECKS_AT_ONCE, 0, false).admits(Kind::Other));
        assert!(state(0, 0, false).admits(Kind::Load));
        assert!(!state(1, 0, false).admits(Kind::Load));
        for kind in [Kind::Load, Kind::Timing, Kind::Other] {
            assert!(
                !state(1, 0, true).admits(kind),
                "{kind:?} beside a load check"
            );
        }
        let mut waiting = state(1, 0, false);
        waiting.load_waiting = 1;
        assert!(
            !waiting.admits(Kind::Other),
            "a check before a waiting load check"
        );
        assert!(
            !waiting.admits(Kind::Timing),
            "a check before a waiting load check"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_check_starts_when_a_turn_ends() {
        // The only test of this binary that takes turns.
        let first = turn("deadline_counts_from_send_time").await;
        let second = turn("acquire_then_held").await;
        let mut third = tokio::spawn(async { turn("acquire_wait_times_out").await });
        // A negative, so a bounded look: 200 ms is far more than a task takes to start.
        let early = tokio::time::timeout(std::time::Duration::from_millis(200), &mut third).await;
        assert!(early.is_err(), "a timing check started as a third check");
        drop(second);
        let third = tokio::time::timeout(std::time::Duration::from_secs(10), third)
            .await
            .expect("the waiting check did not start when a turn ended")
            .expect("the task panicked");
        drop((first, third));
        let r = running();
        assert_eq!(
            (r.checks, r.timing, r.load, r.load_waiting),
            (0, 0, false, 0)
        );
    }
}
