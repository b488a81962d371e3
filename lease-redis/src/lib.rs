#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

mod backend;
mod cluster;
mod config;
mod connection;
mod error;
pub mod fence;
mod keys;
mod reply;
/// The Lua sources of the primitives, for auditing them or loading them ahead
/// (`SCRIPT LOAD`) on servers that restrict scripting; the backend loads them itself
/// after a `NOSCRIPT`. Each constant's docs give its `KEYS`, `ARGV` and reply.
pub mod scripts;
mod sentinel;
mod tls;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use lease_core::{
    AcquireOutcome, Capabilities, Error, Fencing, FencingToken, HeldBy, InvalidInput, LeaseBackend,
    LeaseInfo, LeaseName, MAX_TTL, Owner, OwnerToken, ReleaseOutcome, RenewItem, RenewOutcome,
    Result, TlsFiles,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::error::{BACKEND, convert, unexpected};

/// The `redis` client crate this backend is built on, for
/// [`RedisBackend::from_client`] and [`RedisBackend::from_connection_manager`].
pub use redis;

/// The default of [`RedisConfig::renew_batch`]: the largest renewal batch sent as one
/// script call; the client splits larger batches. One call of this size keeps the server
/// busy for a few milliseconds. On a Redis Cluster the backend takes this many per primary
/// in one `renew` call (its capabilities say `max_renew_batch` = this times the number of
/// primaries at connect). (Elsewhere `MAX_RENEW_BATCH` is the largest batch of one
/// `renew` call; on Redis that is `Capabilities::max_renew_batch`, which depends on the
/// topology, so there is no such constant.)
pub const DEFAULT_RENEW_BATCH: usize = 10_000;

/// The largest [`RedisConfig::renew_batch`] accepted.
pub const RENEW_BATCH_LIMIT: usize = 100_000;

pub use backend::RedisBackend;
use backend::*;
pub use config::{RedisConfig, WaitForReplicas};
use connection::*;
use reply::*;
use tls::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(ttl_millis("ttl", Duration::ZERO).unwrap(), 1);
        assert_eq!(ttl_millis("ttl", Duration::from_nanos(1)).unwrap(), 1);
        assert_eq!(ttl_millis("ttl", Duration::from_micros(1001)).unwrap(), 2);
        assert_eq!(ttl_millis("ttl", Duration::from_secs(3)).unwrap(), 3000);
        assert!(ttl_millis("ttl", MAX_TTL + Duration::from_millis(1)).is_err());
        assert_eq!(keep_millis(Duration::ZERO).unwrap(), 0);
        assert_eq!(keep_millis(Duration::from_micros(1)).unwrap(), 1);
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = RedisConfig::default();
        assert_eq!(c.key_prefix, "lease");
        assert!(c.validate().is_ok());
        let bad = RedisConfig {
            key_prefix: "a{b}".into(),
            ..RedisConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = RedisConfig {
            request_timeout: Duration::ZERO,
            ..RedisConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn parses_config_replies() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"appendonly".to_vec()),
            Value::BulkString(b"yes".to_vec()),
        ]);
        assert_eq!(
            config_pairs(&resp2),
            vec![("appendonly".to_owned(), "yes".to_owned())]
        );
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"appendfsync".to_vec()),
            Value::BulkString(b"always".to_vec()),
        )]);
        assert_eq!(
            config_pairs(&resp3),
            vec![("appendfsync".to_owned(), "always".to_owned())]
        );
    }

    #[tokio::test]
    async fn connect_rejects_bad_urls_without_echoing_passwords() {
        let err = RedisBackend::connect("http://user:hunter2@localhost")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, Error::InvalidInput(InvalidInput::MalformedUrl(_))),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        #[cfg(not(feature = "_tls"))]
        {
            let err = RedisBackend::connect("rediss://:hunter2@localhost")
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("`tls` feature"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let err = RedisBackend::connect("not a url at all :hunter2@")
            .await
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
    }
}
