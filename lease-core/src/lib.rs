#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod backend;
mod client;
mod connection;
mod election;
mod error;
mod guard;
mod heartbeat;
mod memory;
pub mod metrics;
mod schedule;
mod semaphore;
mod shared;
mod types;
mod util;

pub use async_trait::async_trait;
pub use backend::LeaseBackend;
pub use client::{LeaseClient, LeaseContext, RunOutcome, TryAcquire};
pub use connection::{
    TlsFiles, TlsPem, check_url_userinfo, error_chain_text, find_cause, percent_decode, redact_url,
    tls_failure, tls_failure_for, url_password,
};
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, Error, InvalidInput, Result};
pub use guard::LeaseGuard;
pub use memory::MemoryBackend;
pub use schedule::{JobRun, JobStats, ScheduledJob};
pub use semaphore::{MAX_PERMITS, Permit, PermitHolder, Semaphore, TryPermit};
pub use shared::LossReason;
pub use tokio_util::sync::CancellationToken;
pub use types::{
    AcquireOutcome, Capabilities, Fencing, FencingToken, HeldBy, HolderLabel, LeaseInfo, LeaseName,
    LeaseOptions, LeaseOptionsBuilder, MAX_TTL, Owner, OwnerToken, ReleaseOutcome, RenewItem,
    RenewOutcome,
};
