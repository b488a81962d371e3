#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod nodes;
mod records;
mod sessions;
mod sweep;

pub use backend::{MAX_RENEW_BATCH, ZkBackend};
pub use config::ZkConfig;

/// The `zookeeper-client` crate this backend is built on.
pub use zookeeper_client;
