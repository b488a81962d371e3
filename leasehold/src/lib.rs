#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc = include_str!("../README.md")]

pub use lease_core::*;

/// The Redis backend (feature `redis`).
#[cfg(feature = "redis")]
pub use lease_redis as redis;

/// The PostgreSQL backends (feature `postgres`).
#[cfg(feature = "postgres")]
pub use lease_postgres as postgres;

/// The etcd backend (feature `etcd`).
#[cfg(feature = "etcd")]
pub use lease_etcd as etcd;
/// The ZooKeeper backend (feature `zookeeper`).
#[cfg(feature = "zookeeper")]
pub use lease_zookeeper as zookeeper;

/// The MySQL and MariaDB backend (feature `mysql`).
#[cfg(feature = "mysql")]
pub use lease_mysql as mysql;

use std::sync::Arc;

/// Opens a backend from a URL.
///
/// | scheme | store | feature |
/// |---|---|---|
/// | `memory://` | in this process (for trying things out) | always |
/// | `redis://`, `redis+sentinel://`, `redis+cluster://` | Redis, Redis Sentinel, Redis Cluster | `redis` |
/// | `rediss://`, `rediss+cluster://` | Redis, Redis Cluster over TLS | `redis` and `tls` |
/// | `postgres://`, `postgresql://` | PostgreSQL (TLS with libpq's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`: feature `tls`) | `postgres` |
/// | `etcd://` | etcd | `etcd` |
/// | `etcds://` | etcd over TLS | `etcd` and `tls` |
/// | `mysql://`, `mariadb://` | MySQL 8, MariaDB 10.6+ (TLS with the driver's `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`: feature `tls`) | `mysql` |
/// | `zk://host:2181,host2:2181/prefix` | ZooKeeper 3.5+ (`digest` credentials as `zk://user:password@...`) | `zookeeper` |
/// | `zks://host:2281/prefix?tls_ca=FILE` | ZooKeeper's secure client port (`tls_cert`, `tls_key` for mutual TLS) | `zookeeper` and `tls` |
///
/// Credentials go in the URL (`redis://user:password@host`, `postgres://user:password@host/db`,
/// `etcd://user:password@host/prefix`); PostgreSQL also reads `PGPASSWORD` and `~/.pgpass`
/// as libpq does. TLS files go in the URL too (`tls_ca`, `tls_cert`, `tls_key` for Redis
/// and etcd; libpq's names for PostgreSQL), or in [`ConnectOptions`] with [`connect_with`].
///
/// Errors: a URL whose store was not compiled in gives [`Error::NotCompiledIn`]; a
/// malformed URL gives [`InvalidInput::MalformedUrl`]; a TLS or certificate problem gives
/// [`Error::Tls`], and wrong credentials give [`Error::Auth`] (neither retryable). Error
/// messages never contain credentials.
///
/// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
/// must clean up.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), leasehold::Error> {
/// let backend = leasehold::connect("memory://").await?;
/// let client = leasehold::LeaseClient::new(backend);
/// # let _ = client; Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    connect_with(url, &ConnectOptions::default()).await
}

/// Settings for [`connect_with`] that apply to every store.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// TLS files: a CA bundle, and a client certificate with its key (mutual TLS). They
    /// add to the files the URL names; one file given two different ways is an error.
    /// Redis needs `rediss://` and etcd `etcds://` for them; on PostgreSQL, a URL without
    /// `sslmode` then means `sslmode=verify-full`.
    pub tls: TlsFiles,
}

impl ConnectOptions {
    /// With `tls` as the TLS files.
    pub fn with_tls(mut self, tls: TlsFiles) -> Self {
        self.tls = tls;
        self
    }
}

/// [`connect`], with settings that apply to every store (TLS files).
///
/// ```no_run
/// # async fn demo() -> Result<(), leasehold::Error> {
/// let tls = leasehold::TlsFiles::default()
///     .with_ca("/etc/lease/ca.pem")
///     .with_client("/etc/lease/client.pem", "/etc/lease/client.key");
/// let backend = leasehold::connect_with(
///     "etcds://lease:secret@etcd-1:2379,etcd-2:2379/billing",
///     &leasehold::ConnectOptions::default().with_tls(tls),
/// )
/// .await?;
/// # let _ = backend; Ok(()) }
/// ```
///
/// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
/// must clean up.
pub async fn connect_with(url: &str, options: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let Some((scheme, _rest)) = url.split_once("://") else {
        return Err(InvalidInput::MalformedUrl(
            "expected SCHEME://..., e.g. redis://127.0.0.1:6379".into(),
        )
        .into());
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => {
            if !options.tls.is_empty() {
                return Err(InvalidInput::Other(
                    "TLS files were given for memory://, which has no connection".into(),
                )
                .into());
            }
            Ok(Arc::new(MemoryBackend::new()))
        }
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" | "rediss+cluster" => {
            connect_redis(url, options).await
        }
        "postgres" | "postgresql" => connect_postgres(url, options).await,
        "etcd" | "etcds" => connect_etcd(url, options).await,
        "mysql" | "mariadb" => connect_mysql(url, options).await,
        "zk" | "zks" => connect_zookeeper(url, options).await,
        other => Err(InvalidInput::MalformedUrl(format!(
            "unknown scheme {other:?}: expected memory, redis, rediss, redis+sentinel, redis+cluster, rediss+cluster, postgres, postgresql, etcd, etcds, mysql, mariadb, zk or zks"
        ))
        .into()),
    }
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(url: &str, _: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("redis");
    not_compiled(scheme, "redis")
}

#[cfg(feature = "redis")]
async fn connect_redis(url: &str, options: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let config = lease_redis::RedisConfig::default().with_tls(options.tls.clone());
    Ok(Arc::new(
        lease_redis::RedisBackend::connect_with(url, config).await?,
    ))
}

#[cfg(feature = "postgres")]
async fn connect_postgres(url: &str, options: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let config = lease_postgres::PostgresConfig::default().with_tls(options.tls.clone());
    Ok(Arc::new(
        lease_postgres::PostgresBackend::connect_with(url, config).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(url: &str, _: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("postgres");
    not_compiled(scheme, "postgres")
}

#[cfg(feature = "etcd")]
async fn connect_etcd(url: &str, options: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let (endpoints, mut config) = lease_etcd::EtcdConfig::from_url(url)?;
    if let Some(files) = &config.tls {
        config.tls = Some(files.merged(&options.tls)?);
    } else if !options.tls.is_empty() {
        return Err(InvalidInput::MalformedUrl(format!(
            "{}: TLS files are given, but the URL is not etcds://",
            redact_url(url)
        ))
        .into());
    }
    Ok(Arc::new(
        lease_etcd::EtcdBackend::connect_endpoints(&endpoints, config).await?,
    ))
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(url: &str, _: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("etcd");
    not_compiled(scheme, "etcd")
}

#[cfg(feature = "mysql")]
async fn connect_mysql(url: &str, options: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let config = lease_mysql::MysqlConfig::default().with_tls(options.tls.clone());
    Ok(Arc::new(
        lease_mysql::MysqlBackend::connect_with(url, config).await?,
    ))
}

#[cfg(not(feature = "mysql"))]
async fn connect_mysql(url: &str, _: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("mysql");
    not_compiled(scheme, "mysql")
}

#[cfg(feature = "zookeeper")]
async fn connect_zookeeper(url: &str, options: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    let mut config = lease_zookeeper::ZkConfig::default();
    if !options.tls.is_empty() {
        config.tls = Some(options.tls.clone());
    }
    Ok(Arc::new(
        lease_zookeeper::ZkBackend::connect_url_with(url, config).await?,
    ))
}

#[cfg(not(feature = "zookeeper"))]
async fn connect_zookeeper(_: &str, _: &ConnectOptions) -> Result<Arc<dyn LeaseBackend>> {
    not_compiled("zk", "zookeeper")
}

#[allow(dead_code)]
fn not_compiled(scheme: &str, feature: &'static str) -> Result<Arc<dyn LeaseBackend>> {
    Err(Error::NotCompiledIn {
        scheme: scheme.to_owned(),
        feature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error every `connect_*` returns for a store whose feature is off (the workspace
    /// build compiles all stores in, so this checks the error itself).
    #[test]
    fn not_compiled_in_is_one_line_naming_the_feature() {
        let Err(e) = not_compiled("etcd", "etcd") else {
            panic!("expected an error");
        };
        assert!(matches!(
            e,
            Error::NotCompiledIn {
                feature: "etcd",
                ..
            }
        ));
        let msg = e.to_string();
        assert!(msg.contains("`etcd` feature"), "{msg}");
        assert_eq!(msg.lines().count(), 1);
        assert!(!e.is_retryable());
    }
}

/// The repository's README, whose Rust code blocks are compiled as doc tests (they are
/// what a reader sees first, on the repository's front page). Its store examples need
/// every store compiled in, as the workspace's test build has them.
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "mysql"
))]
#[doc = include_str!("../../README.md")]
pub struct RepositoryReadme;
