//! Checks that do not apply to a backend: reported as such, not passed in silence.

use std::fmt;
use std::io::Write as _;
use std::sync::Mutex;

use lease_core::LeaseBackend;

/// A check of [`crate::suite`] that did not run because the backend's capabilities say
/// it lacks what the check proves, as the suite reported it. The test of such a check
/// passes (the test harness has no "skipped" outcome); the report says why it proved
/// nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotApplicable {
    /// The check: its function name in [`crate::suite`].
    pub check: &'static str,
    /// The backend, as [`Capabilities::backend`](lease_core::Capabilities::backend) names
    /// it.
    pub backend: &'static str,
    /// Why the check does not apply: the capability the backend lacks.
    pub reason: &'static str,
}

impl fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} not applicable on {}: {}",
            self.check, self.backend, self.reason
        )
    }
}

/// Why a lead-time check does not apply to a backend without lead time.
pub const NO_LEAD_TIME: &str = "no lead time (Capabilities::lost_before_taken is false): the \
     store may free a lease before its holder's guard can know, so the guard is not told \
     first";

/// Why a check of expiry does not apply to a backend whose leases do not expire.
pub const NO_EXPIRY: &str = "leases do not expire (Capabilities::expires is false)";

static REPORTED: Mutex<Vec<NotApplicable>> = Mutex::new(Vec::new());

/// Every check reported not applicable in this process so far, oldest first (each is
/// also written to standard error when reported).
///
/// ```
/// for report in lease_conformance::not_applicable_reports() {
///     println!("{report}");
/// }
/// ```
pub fn not_applicable_reports() -> Vec<NotApplicable> {
    REPORTED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Records `report` and writes it to standard error as one line, past the test harness's
/// output capture so that a plain `cargo test` shows it:
/// `lease conformance: CHECK not applicable on BACKEND: REASON [test NAME]`.
pub(crate) fn report(report: NotApplicable) {
    let test = std::thread::current()
        .name()
        .filter(|n| *n != "main" && !n.starts_with("tokio-"))
        .map(|n| format!(" [test {n}]"))
        .unwrap_or_default();
    let line = format!("lease conformance: {report}{test}\n");
    // One write of the whole line: the runner's "test ... ok" of other threads must not
    // land inside it.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    REPORTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(report);
}

/// Whether a check of the lead time (the holder hears "lost" before anyone else can take
/// the lease) applies to `backend`: it needs leases that expire and a store that frees
/// them no earlier. Otherwise reports `check` as not applicable and answers `false`.
pub(crate) fn lead_time_applies(backend: &dyn LeaseBackend, check: &'static str) -> bool {
    let caps = backend.capabilities();
    let reason = if !caps.lost_before_taken {
        NO_LEAD_TIME
    } else if !caps.expires {
        NO_EXPIRY
    } else {
        return true;
    };
    report(NotApplicable {
        check,
        backend: caps.backend,
        reason,
    });
    false
}

/// Why a check of keep-for does not apply to a backend without it.
pub const NO_KEEP_FOR: &str = "release ignores keep-for (Capabilities::keep_for is false)";

/// Why a check of fencing tokens does not apply to a backend without them.
pub const NO_FENCING: &str = "no fencing tokens (Capabilities::fencing is Fencing::None)";

/// What a check needs of a backend's capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Needs {
    /// Leases that expire by TTL.
    Expiry,
    /// A release that honours keep-for.
    KeepFor,
    /// Fencing tokens.
    Fencing,
}

/// Whether `backend` has what `check` needs; otherwise reports `check` as not applicable
/// (with the capability it lacks) and answers `false`.
pub(crate) fn applies(backend: &dyn LeaseBackend, check: &'static str, needs: Needs) -> bool {
    let caps = backend.capabilities();
    let reason = match needs {
        Needs::Expiry if !caps.expires => NO_EXPIRY,
        Needs::KeepFor if !caps.keep_for => NO_KEEP_FOR,
        Needs::Fencing if caps.fencing == lease_core::Fencing::None => NO_FENCING,
        _ => return true,
    };
    report(NotApplicable {
        check,
        backend: caps.backend,
        reason,
    });
    false
}
