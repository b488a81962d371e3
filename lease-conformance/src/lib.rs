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

pub use faulty::{AcquireCall, Fault, FaultyBackend, Op, RenewCall};
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

static TURNS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A check's turn in its test binary, held while the check runs (fixture included).
#[derive(Debug)]
pub enum Turn {
    /// Alongside the other checks.
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    /// Alone: a check of [`LOAD_CHECKS`].
    Alone(tokio::sync::RwLockWriteGuard<'static, ()>),
}

/// Waits for the turn of the check named `check`: a check of [`LOAD_CHECKS`] waits until
/// no other check of [`conformance_suite!`] runs in this test binary and keeps the others
/// waiting until it ends; every other check runs alongside the rest.
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
    if LOAD_CHECKS.contains(&check) {
        Turn::Alone(TURNS.write().await)
    } else {
        Turn::Shared(TURNS.read().await)
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
