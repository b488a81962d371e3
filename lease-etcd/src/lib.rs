#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod connection;
mod error;
mod keys;
mod sessions;
mod state;
mod tls;
mod url;
mod watch;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue,
    LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp,
};
use futures::StreamExt;
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome, Result,
    TlsFiles,
};
use tokio::time::Instant;

use crate::error::{BACKEND, convert, is_lease_not_found, unexpected};
use crate::keys::{Layout, decode_value, encode_value, range_end};
use crate::state::{
    FlightGuard, Held, Orphan, Ours, Pending, Releasing, SESSION_KEY_BYTES, Session, Shared,
    WaiterGuard, key_bytes,
};

/// The `etcd-client` crate this backend is built on, for [`EtcdBackend::from_client`].
pub use etcd_client;

/// How often `renew` looks for keys nobody renewed within their TTL.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// The shortest etcd lease a default etcd server grants: it raises any shorter TTL to
/// `ceil(1.5 × election timeout)`, 2 s with the default election timeout of 1 s (a lease
/// asked for 1 s lives 2 s). The default of [`EtcdConfig::min_ttl`]; the backend reads
/// every granted TTL back and logs when a server grants more.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// Largest renewal batch accepted in one call. A batch costs one keepalive per etcd lease
/// involved (one per TTL for up to some 40,000 keys of 20-byte names: a session lease takes
/// keys until they add up to 2 MiB), whatever its size.
pub const MAX_RENEW_BATCH: usize = 1_000_000;

pub use backend::EtcdBackend;
use backend::*;
pub use config::EtcdConfig;
use connection::*;
use sessions::*;
use tls::*;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(600)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
    }

    #[test]
    fn config_debug_hides_the_password() {
        let c = EtcdConfig {
            user: Some("root".into()),
            password: Some("hunter2".into()),
            ..EtcdConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("root") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn config_validation() {
        assert!(EtcdConfig::default().validate().is_ok());
        let bad = EtcdConfig {
            password: Some("x".into()),
            ..EtcdConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = EtcdConfig {
            request_timeout: Duration::ZERO,
            ..EtcdConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = EtcdConfig {
            key_prefix: String::new(),
            ..EtcdConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn capabilities_match_etcd() {
        let caps = Capabilities::new(BACKEND)
            .with_min_ttl(MIN_TTL)
            .with_ttl_granularity(Duration::from_secs(1));
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(600)),
            Duration::from_secs(2)
        );
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
    }
}
