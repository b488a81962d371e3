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

use std::sync::Arc;

/// Opens a backend from a URL.
///
/// | scheme | store | feature |
/// |---|---|---|
/// | `memory://` | in this process (for trying things out) | always |
/// | `redis://`, `rediss://`, `redis+sentinel://` | Redis | `redis` |
/// | `postgres://`, `postgresql://` | PostgreSQL | `postgres` |
/// | `etcd://` | etcd | `etcd` |
///
/// A URL whose store was not compiled in gives [`Error::NotCompiledIn`]; a malformed URL
/// gives [`InvalidInput::MalformedUrl`]. Error messages never contain credentials.
///
/// Cancel safety: cancel-safe: dropping it takes no lease and leaves nothing the caller
/// must clean up.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lease::Error> {
/// let backend = lease::connect("memory://").await?;
/// let client = lease::LeaseClient::new(backend);
/// # let _ = client; Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    let Some((scheme, _rest)) = url.split_once("://") else {
        return Err(InvalidInput::MalformedUrl(
            "expected SCHEME://..., e.g. redis://127.0.0.1:6379".into(),
        )
        .into());
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => Ok(Arc::new(MemoryBackend::new())),
        "redis" | "rediss" | "redis+sentinel" => connect_redis(url).await,
        "postgres" | "postgresql" => connect_postgres(url).await,
        "etcd" => connect_etcd(url).await,
        other => Err(InvalidInput::MalformedUrl(format!(
            "unknown scheme {other:?}: expected memory, redis, rediss, redis+sentinel, postgres, postgresql or etcd"
        ))
        .into()),
    }
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("redis");
    not_compiled(scheme, "redis")
}

#[cfg(feature = "redis")]
async fn connect_redis(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    Ok(Arc::new(lease_redis::RedisBackend::connect(url).await?))
}

#[cfg(feature = "postgres")]
async fn connect_postgres(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    Ok(Arc::new(
        lease_postgres::PostgresBackend::connect(url).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("postgres");
    not_compiled(scheme, "postgres")
}

#[cfg(feature = "etcd")]
async fn connect_etcd(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    Ok(Arc::new(lease_etcd::EtcdBackend::from_url(url).await?))
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(url: &str) -> Result<Arc<dyn LeaseBackend>> {
    let scheme = url.split("://").next().unwrap_or("etcd");
    not_compiled(scheme, "etcd")
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
