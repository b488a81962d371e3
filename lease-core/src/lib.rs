#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod backend;
mod client;
mod election;
mod error;
pub mod fence;
mod guard;
mod health;
mod heartbeat;
mod memory;
pub mod metrics;
pub mod raw;
mod schedule;
mod semaphore;
mod shared;
pub mod startup;
mod timetable;
mod types;
mod util;

pub use async_trait::async_trait;
pub use backend::LeaseBackend;
pub use client::{LeaseClient, LeaseContext, RunOutcome, TryAcquire};
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, Error, InvalidInput, Result};
pub use guard::LeaseGuard;
pub use health::{HEALTH_PROBE_NAME, Health, HeartbeatState};
pub use memory::MemoryBackend;
pub use raw::tls::TlsFiles;
pub use raw::url::redact_url;
pub use schedule::{JobRun, JobStats, MissedFirings, ScheduledJob};
pub use semaphore::{MAX_PERMITS, Permit, PermitHolder, Semaphore, TryPermit};
pub use shared::LossReason;
pub use startup::connect_when_ready;
#[cfg(feature = "cron")]
pub use timetable::CronSchedule;
pub use timetable::Schedule;
pub use tokio_util::sync::CancellationToken;
pub use types::{
    AcquireOutcome, Capabilities, Fencing, FencingToken, HeldBy, HolderLabel, LeaseInfo, LeaseName,
    LeaseOptions, LeaseOptionsBuilder, MAX_TTL, Owner, OwnerToken, ReleaseOutcome, RenewItem,
    RenewOutcome,
};
