//! The conformance suite: one `pub async fn` per check, each taking the backend under
//! test. [`crate::conformance_suite!`] turns all of them into `#[tokio::test]`s.
//!
//! Every check isolates itself under a random name prefix and cleans up what it took.
//! Timings follow the backend's capabilities: the base TTL is 600 ms rounded up to the
//! store's minimum and granularity. Where a check waits for a TTL to run out on the store,
//! it polls with a stated tolerance ([`EXPIRY_TOLERANCE`]) because the store's clock and
//! this process's scheduler are not in lock-step; everything else waits on events.

mod acquire;
mod client;
mod election;
mod expiry;
mod failure;
mod firings;
mod release;
mod renew;
mod semaphore;
mod support;
pub use acquire::*;
pub use client::*;
pub use election::*;
pub use expiry::*;
pub use failure::*;
pub use firings::*;
pub use release::*;
pub use renew::*;
pub use semaphore::*;
pub use support::*;
