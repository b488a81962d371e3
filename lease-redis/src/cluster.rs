//! Redis Cluster: `redis+cluster://` URLs, the slot map the renewal batches are grouped
//! by, and the persistence probe of every primary.
//!
//! Each lease's keys share a hash tag (`{...}`), so acquire, release, inspect and force
//! release are single-slot calls that redis-rs's cluster connection sends to the slot's
//! primary, following `MOVED` and `ASK` redirections. A renewal batch spans many slots:
//! it is split by the primary that serves each lease's slot (as of the slot map, read
//! with `CLUSTER SLOTS` and refreshed every second or after a failed group), and each
//! group is one script call with the `allow-cross-slot-keys` flag (Redis 7+), which lets
//! one script touch keys of several slots served by the node it runs on. A group that
//! fails (a slot moved since the map was read) is renewed again lease by lease, each
//! call sent to its slot's node.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lease_core::{Error, InvalidInput, Result};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, Value};

use crate::error::convert;

const SCHEMES: [&str; 2] = ["redis+cluster://", "rediss+cluster://"];

/// Whether `url` asks for Redis Cluster.
pub(crate) fn is_cluster_url(url: &str) -> bool {
    SCHEMES.iter().any(|scheme| {
        url.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    })
}

fn malformed(why: impl std::fmt::Display) -> Error {
    Error::InvalidInput(InvalidInput::MalformedUrl(format!(
        "redis+cluster URL: {why} (expected \
         redis+cluster://[user][:password@]host[:port][,host[:port]...])"
    )))
}

/// A parsed `redis+cluster://[user][:password@]host[:port][,host[:port]...]`: the seed
/// nodes as `redis://` URLs (the credentials on each), and a description without the
/// credentials.
pub(crate) struct ClusterUrl {
    pub(crate) nodes: Vec<String>,
    /// `rediss+cluster://`: every node over TLS.
    pub(crate) tls: bool,
    pub(crate) described: String,
    /// `redis://[user:pass@]` (or `rediss://`): the scheme and credentials of a node URL,
    /// for the dedicated pub/sub connection of a waiter (see [`ClusterUrl::node_url`]).
    node_prefix: String,
}

impl ClusterUrl {
    /// Parses `url`. Errors never show the password.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let Some(scheme) = SCHEMES.iter().find(|scheme| {
            url.get(..scheme.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
        }) else {
            return Err(malformed("not a redis+cluster:// URL"));
        };
        let tls = scheme.starts_with("rediss");
        let rest = &url[scheme.len()..];
        if rest.contains(['?', '#']) {
            return Err(malformed(
                "query parameters and fragments are not supported",
            ));
        }
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('/') {
            return Err(malformed(
                "a cluster has one database: no /db path is allowed",
            ));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let node_prefix = format!("{}://{auth}", if tls { "rediss" } else { "redis" });
        let mut nodes = Vec::new();
        let mut shown = Vec::new();
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(malformed("an empty host"));
            }
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port)) if !name.ends_with(']') || host.starts_with('[') => {
                    let port: u16 = port
                        .parse()
                        .map_err(|_| malformed(format!("bad port in {host:?}")))?;
                    (name, port)
                }
                _ => (host, 6379),
            };
            if name.is_empty() {
                return Err(malformed(format!("no host name in {host:?}")));
            }
            nodes.push(format!("{node_prefix}{name}:{port}"));
            shown.push(format!("{name}:{port}"));
        }
        Ok(ClusterUrl {
            nodes,
            described: format!("cluster {}", shown.join(",")),
            tls,
            node_prefix,
        })
    }

    /// The URL of one node, with the cluster URL's scheme and credentials.
    pub(crate) fn node_url(&self, node: &Node) -> String {
        let (host, port) = node;
        if host.contains(':') && !host.starts_with('[') {
            format!("{}[{host}]:{port}", self.node_prefix)
        } else {
            format!("{}{host}:{port}", self.node_prefix)
        }
    }
}

/// The CA and client certificate of a `rediss+cluster://` connection.
#[cfg(feature = "_tls")]
pub(crate) type Certs = redis::TlsCertificates;
/// Without the `tls` feature there are none.
#[cfg(not(feature = "_tls"))]
pub(crate) type Certs = std::convert::Infallible;

/// Opens a cluster connection to the seed nodes of `url`, bounded by `connect_timeout`.
pub(crate) async fn open(
    url: &ClusterUrl,
    connect_timeout: Duration,
    request_timeout: Duration,
    certs: Option<Certs>,
) -> Result<ClusterConnection> {
    #[cfg_attr(not(feature = "_tls"), allow(unused_mut))]
    let mut builder = ClusterClient::builder(url.nodes.clone())
        .connection_timeout(connect_timeout)
        .response_timeout(request_timeout)
        .retries(2)
        .write_backpressure_boundary(crate::config::WRITE_BATCH_BYTES);
    if let Some(certs) = certs {
        #[cfg(feature = "_tls")]
        {
            builder = builder.certs(certs);
        }
        #[cfg(not(feature = "_tls"))]
        match certs {}
    }
    let client = builder
        .build()
        .map_err(|e| convert("connect", request_timeout, e))?;
    match tokio::time::timeout(connect_timeout, client.get_async_connection()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(convert("connect", request_timeout, e)),
        Err(_) => Err(Error::Timeout {
            operation: "connect",
            after: connect_timeout,
        }),
    }
}

/// The CRC16 (XMODEM) of `data`: Redis Cluster's key hash.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`: of its hash tag (the part between the first `{` and the
/// next `}`, when not empty), else of the whole key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

/// A primary's address.
pub(crate) type Node = (String, u16);

/// Which primary serves which slots, as one `CLUSTER SLOTS` said, and when.
struct SlotMap {
    /// `(first slot, last slot, primary)`, sorted.
    ranges: Vec<(u16, u16, Node)>,
    read_at: Instant,
}

/// The slot map, read again when older than a second or after a group failed.
pub(crate) struct Slots {
    map: Mutex<Option<SlotMap>>,
}

/// How long a slot map is used before it is read again.
const SLOT_MAP_AGE: Duration = Duration::from_secs(1);

impl Slots {
    pub(crate) fn new() -> Self {
        Slots {
            map: Mutex::new(None),
        }
    }

    /// Forgets the map (after a group failed: a slot may have moved).
    pub(crate) fn invalidate(&self) {
        *self.map.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The primary of each slot in `slots`, from a map at most a second old (read now if
    /// needed). `None` for a slot no primary serves in the map.
    pub(crate) async fn nodes_of(
        &self,
        conn: &mut ClusterConnection,
        slots: &[u16],
        reply_timeout: Duration,
    ) -> std::result::Result<Vec<Option<Node>>, RedisError> {
        {
            let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(m) = map.as_ref().filter(|m| m.read_at.elapsed() < SLOT_MAP_AGE) {
                return Ok(slots.iter().map(|s| lookup(&m.ranges, *s)).collect());
            }
        }
        let ranges = read_slot_map(conn, reply_timeout).await?;
        let out = slots.iter().map(|s| lookup(&ranges, *s)).collect();
        *self.map.lock().unwrap_or_else(|p| p.into_inner()) = Some(SlotMap {
            ranges,
            read_at: Instant::now(),
        });
        Ok(out)
    }

    /// Every primary in a fresh slot map.
    pub(crate) async fn primaries(
        &self,
        conn: &mut ClusterConnection,
        reply_timeout: Duration,
    ) -> std::result::Result<Vec<Node>, RedisError> {
        let ranges = read_slot_map(conn, reply_timeout).await?;
        let mut nodes: Vec<Node> = ranges.iter().map(|(_, _, n)| n.clone()).collect();
        nodes.sort();
        nodes.dedup();
        *self.map.lock().unwrap_or_else(|p| p.into_inner()) = Some(SlotMap {
            ranges,
            read_at: Instant::now(),
        });
        Ok(nodes)
    }
}

fn lookup(ranges: &[(u16, u16, Node)], slot: u16) -> Option<Node> {
    ranges
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&slot))
        .map(|(_, _, n)| n.clone())
}

/// `CLUSTER SLOTS` from any node: `[[first, last, [host, port, id, ...], replicas...]]`.
async fn read_slot_map(
    conn: &mut ClusterConnection,
    reply_timeout: Duration,
) -> std::result::Result<Vec<(u16, u16, Node)>, RedisError> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let reply = tokio::time::timeout(
        reply_timeout,
        conn.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)),
    )
    .await
    .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    let mut ranges = Vec::new();
    if let Value::Array(entries) = reply {
        for entry in entries {
            let Value::Array(parts) = entry else { continue };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(primary))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            let host = match primary.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => continue,
            };
            let Some(Value::Int(port)) = primary.get(1) else {
                continue;
            };
            let (Ok(first), Ok(last), Ok(port)) = (
                u16::try_from(*first),
                u16::try_from(*last),
                u16::try_from(*port),
            ) else {
                continue;
            };
            ranges.push((first, last, (host, port)));
        }
    }
    ranges.sort();
    Ok(ranges)
}

/// Sends `cmd` to the node at `node`, bounded by `reply_timeout`.
pub(crate) async fn on_node(
    conn: &mut ClusterConnection,
    node: &Node,
    cmd: redis::Cmd,
    reply_timeout: Duration,
) -> std::result::Result<Value, RedisError> {
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: node.0.clone(),
        port: node.1,
    });
    tokio::time::timeout(reply_timeout, conn.route_command(cmd, routing))
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot(b"{}x"), crc16(b"{}x") % 16384);
        // The CRC16-XMODEM check value, below 16384 already.
        assert_eq!(slot(b"123456789"), 0x31C3);
    }

    #[test]
    fn urls_parse_and_hide_the_password() {
        let u = ClusterUrl::parse("redis+cluster://u:s3cret@10.0.0.1:7000,10.0.0.2").unwrap();
        assert_eq!(
            u.nodes,
            vec![
                "redis://u:s3cret@10.0.0.1:7000".to_owned(),
                "redis://u:s3cret@10.0.0.2:6379".to_owned()
            ]
        );
        assert_eq!(u.described, "cluster 10.0.0.1:7000,10.0.0.2:6379");
        assert_eq!(
            u.node_url(&("10.0.0.3".to_owned(), 7001)),
            "redis://u:s3cret@10.0.0.3:7001"
        );
        assert_eq!(
            u.node_url(&("::1".to_owned(), 7001)),
            "redis://u:s3cret@[::1]:7001"
        );
        for bad in [
            "redis+cluster://",
            "redis+cluster://a:b@h:notaport",
            "redis+cluster://h:1/0",
            "redis+cluster://h:1?x=1",
            "redis+cluster://h:1,,h:2",
        ] {
            let e = ClusterUrl::parse(bad).err().unwrap().to_string();
            assert!(!e.contains("s3cret") && !e.contains(":b@"), "{e}");
        }
        assert!(is_cluster_url("REDIS+CLUSTER://h"));
        assert!(!is_cluster_url("redis://h"));
    }
}
