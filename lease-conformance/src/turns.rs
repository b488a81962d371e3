//! The checks' turns in their test binary: how many of [`conformance_suite!`]'s checks
//! run at once, and which run alone or with one companion.
//!
//! [`conformance_suite!`]: crate::conformance_suite!

/// The checks that load the store on purpose (many calls at once) rather than time one
/// call: [`crate::suite::cancelled_acquires_leave_nothing_held`] sends 1,000 acquires,
/// 8 at a time, and their clean-up releases.
/// [`conformance_suite!`](crate::conformance_suite!) runs them alone in their test binary.
pub const LOAD_CHECKS: &[&str] = &["cancelled_acquires_leave_nothing_held"];

/// The checks whose assertion is a time within a tight margin (tens to a few hundred
/// milliseconds: a loss signal and a probe within the safety margin, a deadline counted
/// from the send time with replies held back by an eighth of the TTL, a name freed
/// within half a call timeout, a wait that must end within its TTL, a missed firing run
/// within its 300 ms window): [`conformance_suite!`](crate::conformance_suite!) runs each
/// of them beside at most one other check, however many checks the test binary runs at
/// once. Checks with a looser
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

/// How many checks of [`conformance_suite!`](crate::conformance_suite!) run at once in
/// one test binary at most (libtest's `--test-threads` bounds them too). The checks
/// mostly wait for TTLs, but a binary's time is set mostly by its longest checks: with
/// `--test-threads=4` this workspace's 11 conformance binaries took 665 s against 777 s
/// with two.
pub const MAX_CHECKS_AT_ONCE: u32 = 4;

/// What kind of check holds a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Load,
    Timing,
    Other,
}

/// The checks of [`conformance_suite!`](crate::conformance_suite!) running in this test binary.
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

/// Waits for the turn of the check named `check` among the checks of
/// [`conformance_suite!`](crate::conformance_suite!) in this test binary:
/// - a check of [`LOAD_CHECKS`] waits until no other check runs, and keeps the others
///   waiting until it ends;
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
/// [`crate::suite::cancelled_acquires_leave_nothing_held`] held another check's calls for more than
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
