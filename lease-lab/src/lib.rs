//! The comparison lab (not published): the comparison scenarios and alternatives,
//! the fault matrix (holder killed, paused, cut off; store down, restarted; the same at
//! the container level) and the soak,
//! run on real stores, and the `lease-report` binary that writes `docs/comparison.md`.
//!
//! `lease-holder` is the holder process the fault matrix starts, kills and pauses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a lab: failures are assertions

pub mod container_faults;
pub mod fenced;
pub mod firings;
pub mod lost_reply;
pub mod matrix;
pub mod mysql_alternatives;
pub mod scenarios;
