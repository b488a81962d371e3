//! Redis test servers.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::process::{ChildProcess, DirWatcher};
use super::{HarnessError, Source, env_nonempty, find_binary, free_port};

/// Environment variable with the URL of a Redis server to use instead of starting one.
pub const URL_VAR: &str = "LEASE_TEST_REDIS_URL";

const INSTALL_HINT: &str = "install the Debian package `redis-server` \
    (apt-get install redis-server) or set LEASE_TEST_REDIS_URL=redis://host:port";

/// How long a spawned server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Attempts at a free port (another process may grab it between probing and binding).
const PORT_ATTEMPTS: usize = 5;

/// A Redis server for tests. See the [module docs](super) for where it comes from.
///
/// A spawned server listens on 127.0.0.1 on a free port with its data in a fresh temp
/// directory; dropping the handle kills it (SIGKILL), reaps it and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    source: Source,
    url: String,
    local: Option<Local>,
    _container: Option<super::container::Running>,
}

#[derive(Debug)]
struct Local {
    port: u16,
    persistent: bool,
    // Declared in drop order: the process, its watcher, then its directory.
    process: ChildProcess,
    _watcher: DirWatcher,
    dir: tempfile::TempDir,
}

/// The number of script runs (`EVAL` + `EVALSHA` calls) in the reply to
/// `INFO commandstats`: how tests and benchmarks count a Redis backend's round trips on
/// the server.
pub fn script_calls(commandstats: &str) -> u64 {
    commandstats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

impl RedisServer {
    /// A server from the first source that works: `LEASE_TEST_REDIS_URL`; a `redis:7.2`
    /// container when a Docker engine answers; a throwaway `redis-server` (found on
    /// `PATH`, then in /usr/bin, /usr/sbin, /usr/local/bin) on a free loopback port in a
    /// temp dir, without persistence. Prints which source was used to stderr.
    ///
    /// Errors: [`HarnessError::Unavailable`] naming what to install when no source works;
    /// [`HarnessError::Start`] with the server's log when the spawned server does not
    /// answer PING within 10 s.
    pub async fn start() -> Result<RedisServer, HarnessError> {
        if let Some(url) = env_nonempty(URL_VAR) {
            super::announce(format_args!(
                "lease test server: redis at {} (from {URL_VAR})",
                redact(&url)
            ));
            return Ok(RedisServer {
                source: Source::Env,
                url,
                local: None,
                _container: None,
            });
        }
        let spec = super::container::Spec {
            images: &super::engine::REDIS_IMAGES,
            port: 6379,
            ready: vec![("Ready to accept connections", false)],
            env: Vec::new(),
            // Protected mode would refuse clients from outside the container.
            cmd: [
                "redis-server",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ]
            .map(String::from)
            .to_vec(),
            tmpfs: None,
        };
        let started = super::container::try_start(spec).await;
        if started.is_none() && super::container::forced() {
            return Err(super::container::forced_failure("redis"));
        }
        if let Some(c) = started {
            super::announce(format_args!(
                "lease test server: redis at {}:{} (container {})",
                c.host, c.port, c.description
            ));
            return Ok(RedisServer {
                source: Source::Container,
                url: format!("redis://{}:{}/", c.host, c.port),
                local: None,
                _container: Some(c),
            });
        }
        Self::start_local(false).await
    }

    /// Always a throwaway local `redis-server` without persistence, even when
    /// `LEASE_TEST_REDIS_URL` is set or a Docker engine answers: for tests that stop,
    /// kill, pause or restart the server.
    pub async fn start_owned() -> Result<RedisServer, HarnessError> {
        Self::start_local(false).await
    }

    /// A throwaway local `redis-server` with `--appendonly yes --appendfsync always`, for
    /// tests of fencing across restarts. Always a local process, even when
    /// `LEASE_TEST_REDIS_URL` is set, since such tests restart the server.
    pub async fn start_persistent() -> Result<RedisServer, HarnessError> {
        Self::start_local(true).await
    }

    /// A throwaway local `redis-server` (no persistence) whose wall clock is `clock`: for
    /// tests of what a step of the store host's clock does.
    pub async fn start_with_clock(
        clock: &super::clock::SteppedClock,
    ) -> Result<RedisServer, HarnessError> {
        Self::start_local_env(false, clock.env()).await
    }

    /// A throwaway local `redis-server` (no persistence) with extra command-line
    /// arguments, for example a TLS port (`--tls-port`, `--tls-cert-file`, ...) or
    /// `--requirepass`. Readiness is checked on the plain port, where a `NOAUTH` reply
    /// counts as ready.
    pub async fn start_local_with_args(extra: Vec<String>) -> Result<RedisServer, HarnessError> {
        Self::start_local_full(false, Vec::new(), extra).await
    }

    async fn start_local(persistent: bool) -> Result<RedisServer, HarnessError> {
        Self::start_local_env(persistent, Vec::new()).await
    }

    async fn start_local_env(
        persistent: bool,
        env: Vec<(OsString, OsString)>,
    ) -> Result<RedisServer, HarnessError> {
        Self::start_local_full(persistent, env, Vec::new()).await
    }

    async fn start_local_full(
        persistent: bool,
        env: Vec<(OsString, OsString)>,
        extra: Vec<String>,
    ) -> Result<RedisServer, HarnessError> {
        let binary = find_binary("redis-server", &["/usr/bin", "/usr/sbin", "/usr/local/bin"])
            .ok_or_else(|| {
                HarnessError::Unavailable(format!(
                    "no redis-server on PATH or in /usr/bin, /usr/sbin, /usr/local/bin: \
                     {INSTALL_HINT}"
                ))
            })?;
        let dir = tempfile::Builder::new()
            .prefix("lease-redis-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for redis-server", e))?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let log_path = dir.path().join("redis.log");
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let _ = std::fs::remove_file(&log_path);
            let mut args = server_args(port, dir.path(), persistent);
            args.extend(extra.iter().map(OsString::from));
            let mut process =
                ChildProcess::spawn_with_env(binary.clone(), args, log_path.clone(), env.clone())?;
            match wait_ready(&mut process, port).await {
                Ok(()) => {
                    super::announce(format_args!(
                        "lease test server: redis at 127.0.0.1:{port} (local process {}, pid {}, \
                         dir {}{})",
                        binary.display(),
                        process.pid().unwrap_or_default(),
                        dir.path().display(),
                        if persistent {
                            ", appendonly, fsync always"
                        } else {
                            ""
                        }
                    ));
                    return Ok(RedisServer {
                        source: Source::LocalProcess,
                        url: format!("redis://127.0.0.1:{port}/"),
                        local: Some(Local {
                            port,
                            persistent,
                            process,
                            _watcher: watcher,
                            dir,
                        }),
                        _container: None,
                    });
                }
                Err(why) => {
                    let tail = process.log_tail(20);
                    process.kill()?;
                    last_error = format!(
                        "{} on port {port}: {why}; log tail:\n{tail}",
                        binary.display()
                    );
                    if !tail.contains("Address already in use") {
                        break;
                    }
                }
            }
        }
        Err(HarnessError::Start(last_error))
    }

    /// The URL to connect to (`redis://127.0.0.1:PORT/` for a spawned server).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Where the server came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether the harness spawned the server (and so can stop, kill, pause or restart it).
    pub fn owns_process(&self) -> bool {
        self.local.is_some()
    }

    /// The port of a spawned server.
    pub fn port(&self) -> Option<u16> {
        self.local.as_ref().map(|l| l.port)
    }

    /// The pid of a spawned server while it runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.process.pid())
    }

    /// Whether this is a spawned server with `appendonly yes` and `appendfsync always`.
    pub fn is_persistent(&self) -> bool {
        self.local.as_ref().is_some_and(|l| l.persistent)
    }

    /// The data directory of a spawned server.
    pub fn dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|l| l.dir.path())
    }

    /// The last lines of a spawned server's log (empty for other sources).
    pub fn log_tail(&self, lines: usize) -> String {
        self.local
            .as_ref()
            .map(|l| l.process.log_tail(lines))
            .unwrap_or_default()
    }

    fn local_mut(&mut self, operation: &'static str) -> Result<&mut Local, HarnessError> {
        let source = self.source;
        self.local
            .as_mut()
            .ok_or(HarnessError::NotOwned { operation, source })
    }

    fn local(&self, operation: &'static str) -> Result<&Local, HarnessError> {
        self.local.as_ref().ok_or(HarnessError::NotOwned {
            operation,
            source: self.source,
        })
    }

    /// Stops a spawned server gracefully: SIGTERM (and SIGCONT, in case it is paused),
    /// waits for it to exit (SIGKILL after 10 s) and reaps it. A persistent server has
    /// flushed its AOF. Nothing happens if it is not running.
    pub async fn stop(&mut self) -> Result<(), HarnessError> {
        self.local_mut("stop")?.process.terminate(STOP_GRACE).await
    }

    /// Starts a stopped or killed server again: same binary, port, directory and
    /// arguments; returns once it answers PING (after loading its AOF, if persistent).
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        let local = self.local_mut("restart")?;
        local.process.respawn()?;
        if let Err(why) = wait_ready(&mut local.process, local.port).await {
            let tail = local.process.log_tail(20);
            local.process.kill()?;
            return Err(HarnessError::Start(format!(
                "restart on port {}: {why}; log tail:\n{tail}",
                local.port
            )));
        }
        Ok(())
    }

    /// Kills a spawned server at once (SIGKILL, like a crash) and reaps it.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.local_mut("kill")?.process.kill()
    }

    /// Freezes a spawned server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.local("pause")?.process.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server (SIGCONT).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.local("resume")?.process.signal(Signal::SIGCONT)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(local) = &mut self.local {
            // SIGKILL works on a paused process too; then reap. The temp dir is removed
            // when `local.dir` drops right after.
            let _ = local.process.kill();
        }
    }
}

/// Redis Sentinel processes watching one primary under a service name, for tests of a
/// failover: local `redis-sentinel` processes (the Debian package; `redis-server
/// --sentinel` when that binary is missing) on free loopback ports, each with its config
/// file in a temp dir, killed when the handle drops.
///
/// They mark the primary down after 500 ms without a reply and need 2 of them to agree,
/// so a killed primary is replaced within about 2 s.
#[derive(Debug)]
pub struct RedisSentinels {
    service: String,
    ports: Vec<u16>,
    // Declared in drop order: the processes, the watcher, then the directory.
    processes: Vec<ChildProcess>,
    _watcher: DirWatcher,
    _dir: tempfile::TempDir,
}

impl RedisSentinels {
    /// Starts `count` sentinels (at least 3 makes a quorum of 2 meaningful) watching the
    /// primary on `127.0.0.1:primary_port` as `service`, and waits until each knows the
    /// primary and its replicas.
    pub async fn start(
        primary_port: u16,
        service: &str,
        count: usize,
    ) -> Result<RedisSentinels, HarnessError> {
        let (binary, extra) = match find_binary(
            "redis-sentinel",
            &["/usr/bin", "/usr/sbin", "/usr/local/bin"],
        ) {
            Some(b) => (b, None),
            None => (
                find_binary("redis-server", &["/usr/bin", "/usr/sbin", "/usr/local/bin"])
                    .ok_or_else(|| {
                        HarnessError::Unavailable(format!(
                            "no redis-sentinel or redis-server: install the Debian package \
                             `redis-sentinel` ({INSTALL_HINT})"
                        ))
                    })?,
                Some("--sentinel"),
            ),
        };
        let dir = tempfile::Builder::new()
            .prefix("lease-sentinel-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for redis-sentinel", e))?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let ports = super::free_ports(count)?;
        let mut processes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nset-proc-title no\ndir {dir}\n\
                 sentinel monitor {service} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {service} 500\n\
                 sentinel failover-timeout {service} 3000\n\
                 sentinel parallel-syncs {service} 1\n",
                dir = dir.path().display()
            );
            std::fs::write(&conf, text)
                .map_err(|e| HarnessError::io("writing a sentinel config", e))?;
            let mut args: Vec<OsString> = vec![conf.into_os_string()];
            if let Some(flag) = extra {
                args.push(flag.into());
            }
            let log = dir.path().join(format!("sentinel-{i}.log"));
            processes.push(spawn_ready(&binary, args, log, *port, "sentinel").await?);
        }
        super::announce(format_args!(
            "lease test server: {count} redis sentinels for {service} (primary 127.0.0.1:{primary_port}) \
             on ports {ports:?} (local process {}, dir {})",
            binary.display(),
            dir.path().display()
        ));
        Ok(RedisSentinels {
            service: service.to_owned(),
            ports,
            processes,
            _watcher: watcher,
            _dir: dir,
        })
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,.../service`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.service)
    }

    /// The sentinels' ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The last lines of every sentinel's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.processes
            .iter()
            .enumerate()
            .map(|(i, p)| format!("sentinel {i}:\n{}", p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for p in &mut self.processes {
            let _ = p.kill();
        }
    }
}

fn server_args(port: u16, dir: &Path, persistent: bool) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--daemonize",
        "no",
        // Keep the command line (with --dir) as it is, so the cleanup watcher can find
        // the process by its directory.
        "--set-proc-title",
        "no",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push("--dir".into());
    args.push(dir.as_os_str().to_owned());
    if persistent {
        args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(OsString::from));
    } else {
        args.extend(["--appendonly", "no"].map(OsString::from));
    }
    args
}

/// Polls until the server on `port` answers PING with PONG, the process exits, or
/// [`READY_TIMEOUT`] passes. Uses the real clock, so it also works under a paused tokio
/// clock.
async fn wait_ready(process: &mut ChildProcess, port: u16) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Some(status) = process.try_exit_status() {
            return Err(format!("exited with {status}"));
        }
        if ping(port) {
            return Ok(());
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(format!("no PONG within {READY_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One raw RESP `PING` over a fresh TCP connection, with short timeouts (loopback only).
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = Vec::new();
    let mut buf = [0u8; 64];
    while !reply.ends_with(b"\r\n") && reply.len() < 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    // `-LOADING ...` while a persistent server replays its AOF: not ready yet. `-NOAUTH`:
    // ready, and wants a password.
    reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")
}

/// The ACL rules of a least-privilege lease user (after `ACL SETUSER NAME >PASSWORD`):
/// the keys and channels of the default prefix `lease`, and no administrative command
/// (the README gives the same line).
pub const LEASE_USER_ACL: &[&str] = &[
    "on",
    "resetkeys",
    "~lease:*",
    "resetchannels",
    "&lease:*",
    "-@all",
    "+@read",
    "+@write",
    "+@scripting",
    "+@pubsub",
    "+@connection",
    "+time",
];

/// Arguments for [`RedisServer::start_local_with_args`] that open a TLS port `tls_port`
/// with `certs`' server certificate, trusting `certs.ca` for client certificates;
/// `auth_clients` is redis-server's `--tls-auth-clients` (`yes`, `no` or `optional`).
pub fn tls_args(certs: &super::TestCerts, tls_port: u16, auth_clients: &str) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path(&certs.server_cert),
        "--tls-key-file".into(),
        path(&certs.server_key),
        "--tls-ca-cert-file".into(),
        path(&certs.ca),
        "--tls-auth-clients".into(),
        auth_clients.into(),
    ]
}

use lease_core::redact_url as redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_script_calls() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=7,usec=70,usec_per_call=10.00\r\n\
                    cmdstat_eval:calls=2,usec=20,usec_per_call=10.00\r\n\
                    cmdstat_hdel:calls=5,usec=5,usec_per_call=1.00\r\n";
        assert_eq!(script_calls(info), 9);
        assert_eq!(script_calls(""), 0);
    }
}

/// A Redis Cluster for tests: 3 primaries and 3 replicas (`redis-server --cluster-enabled
/// yes`), made into a cluster by `redis-cli --cluster create ... --cluster-replicas 1`, and
/// removed when the handle drops. Its nodes are containers on a private Docker network
/// (each at its own address, reached directly from this machine) where an engine answers,
/// else processes on free loopback ports (see [`RedisCluster::start`]). A node is marked
/// failed after 1 s without a reply (`cluster-node-timeout 1000`), so a killed primary's
/// replica takes over within a few seconds.
///
/// Nodes are named by their ports, which differ in both kinds; [`RedisCluster::address`]
/// gives a node's `host:port`.
#[derive(Debug)]
pub struct RedisCluster {
    ports: Vec<u16>,
    /// Each node's TLS port, in the order of `ports` (empty without TLS).
    tls_ports: Vec<u16>,
    /// Each node's host, in the order of `ports`.
    hosts: Vec<String>,
    nodes: ClusterNodes,
}

/// Where a cluster's nodes run.
#[derive(Debug)]
enum ClusterNodes {
    Local {
        // Declared in drop order: the processes, the watcher, then the directory.
        processes: Vec<ChildProcess>,
        _watcher: DirWatcher,
        _dir: tempfile::TempDir,
    },
    Containers {
        // The containers go before their network.
        containers: Vec<super::docker::DockerContainer>,
        killed: Vec<bool>,
        _network: super::docker::DockerNetwork,
    },
}

/// How long a new cluster may take to agree on its slots.
const CLUSTER_READY: Duration = Duration::from_secs(30);

/// The port of the first node in containers (each node has its own address, so the
/// ports only have to differ between nodes, to name them).
const CONTAINER_PORT_BASE: u16 = 7000;

/// Every node's flags but its port and place.
fn node_args() -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
        "--save",
        "",
        "--appendonly",
        "no",
        // A replica's first sync at once, not after the default 5 s: a primary killed
        // before its replica has synced cannot be failed over.
        "--repl-diskless-sync-delay",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

impl RedisCluster {
    /// 3 primaries with 1 replica each: in containers where a Docker engine answers (and
    /// must, under `LEASE_TEST_SOURCE=containers`), else local processes. Then waits
    /// until every node reports `cluster_state:ok` with all 16384 slots served and every
    /// replica has synced with its primary.
    ///
    /// Errors: [`HarnessError::Unavailable`] without `redis-server` or `redis-cli`;
    /// [`HarnessError::Start`] with the logs when the cluster does not form in 30 s.
    pub async fn start() -> Result<RedisCluster, HarnessError> {
        match super::docker::available() {
            Ok(()) => Self::start_in_containers(3, 1).await,
            Err(why) if super::container::forced() => Err(HarnessError::Start(format!(
                "LEASE_TEST_SOURCE=containers, and no redis cluster in containers: {why}"
            ))),
            Err(_) => Self::start_sized(3, 1).await,
        }
    }

    /// A cluster of local processes on loopback ports, of `primaries` primaries (1, or 3
    /// and more, as `redis-cli --cluster create` needs) with `replicas` replicas each
    /// (none with 1 primary): for the benchmark's comparison of one primary with three,
    /// whatever engine there is. One primary gets every slot by `CLUSTER ADDSLOTSRANGE 0
    /// 16383`.
    ///
    /// Errors: as [`RedisCluster::start`]; [`HarnessError::Start`] for another shape.
    pub async fn start_sized(
        primaries: usize,
        replicas: usize,
    ) -> Result<RedisCluster, HarnessError> {
        Self::start_local(primaries, replicas, None).await
    }

    /// 3 primaries with 1 replica each, local processes, each with a TLS port besides
    /// its plain one (`--tls-port`, certificates of `certs`, client certificates
    /// optional), the cluster bus and replication over TLS (`tls-cluster`,
    /// `tls-replication`). [`RedisCluster::tls_url`] is the `rediss+cluster://` URL; a
    /// client that connects over TLS is told the nodes' TLS ports.
    pub async fn start_tls(certs: &super::TestCerts) -> Result<RedisCluster, HarnessError> {
        Self::start_local(3, 1, Some(certs)).await
    }

    async fn start_local(
        primaries: usize,
        replicas: usize,
        tls: Option<&super::TestCerts>,
    ) -> Result<RedisCluster, HarnessError> {
        check_shape(primaries, replicas)?;
        let binary = find_binary("redis-server", &["/usr/bin", "/usr/sbin", "/usr/local/bin"])
            .ok_or_else(|| HarnessError::Unavailable(format!("no redis-server: {INSTALL_HINT}")))?;
        cli_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lease-redis-cluster-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for a redis cluster", e))?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let ports = cluster_ports(primaries * (1 + replicas))?;
        let tls_ports = match tls {
            Some(_) => super::free_ports(ports.len())?,
            None => Vec::new(),
        };
        let mut processes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let node_dir = dir.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir)
                .map_err(|e| HarnessError::io("creating a cluster node's dir", e))?;
            let mut args: Vec<OsString> = [
                "--port".to_owned(),
                port.to_string(),
                "--bind".to_owned(),
                "127.0.0.1".to_owned(),
                "--dir".to_owned(),
                node_dir.display().to_string(),
            ]
            .into_iter()
            .map(OsString::from)
            .collect();
            args.extend(node_args().into_iter().map(OsString::from));
            if let (Some(certs), Some(tls_port)) = (tls, tls_ports.get(i)) {
                args.extend(
                    tls_args(certs, *tls_port, "optional")
                        .into_iter()
                        .chain(
                            ["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from),
                        )
                        .map(OsString::from),
                );
            }
            let log = dir.path().join(format!("node-{i}.log"));
            processes.push(spawn_ready(&binary, args, log, *port, "cluster node").await?);
        }
        let described = format!(
            "local process {}, dir {}",
            binary.display(),
            dir.path().display()
        );
        let cluster = RedisCluster {
            hosts: vec!["127.0.0.1".to_owned(); ports.len()],
            ports,
            tls_ports,
            nodes: ClusterNodes::Local {
                processes,
                _watcher: watcher,
                _dir: dir,
            },
        };
        cluster.form(primaries, replicas, &described).await
    }

    /// A cluster whose nodes are containers of the redis image on a private network of
    /// their own, each at its own address (ports 7000 and up), reached directly from this
    /// machine: what the cluster announces is what clients here dial.
    pub async fn start_in_containers(
        primaries: usize,
        replicas: usize,
    ) -> Result<RedisCluster, HarnessError> {
        use super::docker::{Attach, DockerContainer, DockerNetwork, RunSpec};
        check_shape(primaries, replicas)?;
        cli_binary()?;
        let network = DockerNetwork::create().await?;
        let image = super::docker::image_for(&super::engine::REDIS_IMAGES).await;
        let count = primaries * (1 + replicas);
        let mut ports = Vec::with_capacity(count);
        let mut hosts = Vec::with_capacity(count);
        let mut containers = Vec::with_capacity(count);
        for i in 0..count {
            let port = CONTAINER_PORT_BASE + u16::try_from(i).unwrap_or(0);
            let ip = network.allocate()?;
            let mut cmd: Vec<String> = [
                "redis-server",
                "--port",
                &port.to_string(),
                "--protected-mode",
                "no",
            ]
            .map(String::from)
            .to_vec();
            cmd.extend(node_args());
            containers.push(
                DockerContainer::run(RunSpec {
                    image: image.clone(),
                    cmd,
                    networks: vec![Attach {
                        network: network.name().to_owned(),
                        ip: Some(ip),
                    }],
                    ..RunSpec::default()
                })
                .await?,
            );
            ports.push(port);
            hosts.push(ip.to_string());
        }
        // "(container IMAGE ...": the run's count of servers by source reads this.
        let described = format!(
            "container {image} for each node, on network {}",
            network.name()
        );
        let cluster = RedisCluster {
            ports,
            tls_ports: Vec::new(),
            hosts,
            nodes: ClusterNodes::Containers {
                killed: vec![false; containers.len()],
                containers,
                _network: network,
            },
        };
        // Each node answers PING before the cluster is made.
        let until = Instant::now() + CLUSTER_READY;
        for port in cluster.ports.clone() {
            loop {
                let out = cluster.cli(port, &["PING"]).await.unwrap_or_default();
                if out.contains("PONG") {
                    break;
                }
                if Instant::now() > until {
                    return Err(HarnessError::Start(format!(
                        "cluster node {} did not answer PING within {CLUSTER_READY:?}; logs:\n{}",
                        cluster.address(port),
                        cluster.log_tail(10)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        cluster.form(primaries, replicas, &described).await
    }

    /// Makes the started nodes a cluster and waits until it is ok.
    async fn form(
        mut self,
        primaries: usize,
        replicas: usize,
        described: &str,
    ) -> Result<RedisCluster, HarnessError> {
        let cli = cli_binary()?;
        let out = if primaries == 1 {
            let out = self
                .cli(self.ports[0], &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
                .await?;
            if out.trim() == "OK" {
                "All 16384 slots covered".to_owned()
            } else {
                out
            }
        } else {
            let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
            create.extend(self.ports.iter().map(|p| self.address(*p)));
            create.extend(["--cluster-replicas".to_owned(), replicas.to_string()]);
            create.push("--cluster-yes".into());
            run_cli(&cli, &create).await?
        };
        if !out.contains("All 16384 slots covered") {
            let logs = self.log_tail(10);
            self.kill_all();
            return Err(HarnessError::Start(format!(
                "redis-cli --cluster create:\n{out}\nlogs:\n{logs}"
            )));
        }
        self.wait_ok(CLUSTER_READY).await?;
        super::announce(format_args!(
            "lease test server: redis cluster of {primaries} primaries with {replicas} \
             replicas each at {} ({described})",
            self.ports
                .iter()
                .map(|p| self.address(*p))
                .collect::<Vec<_>>()
                .join(", "),
        ));
        Ok(self)
    }

    /// The test binary's shared cluster (as [`RedisCluster::start`] gives), started by
    /// the first test that asks and left running until the process exits (its cleanup
    /// watchers remove the nodes then): for tests that neither kill nor reconfigure
    /// nodes, each under key names of its own.
    pub async fn shared() -> Result<&'static RedisCluster, HarnessError> {
        static SHARED: tokio::sync::OnceCell<Result<RedisCluster, String>> =
            tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_init(|| async { RedisCluster::start().await.map_err(|e| e.to_string()) })
            .await
            .as_ref()
            .map_err(|e| HarnessError::Start(e.clone()))
    }

    /// `redis+cluster://HOST1:P1,HOST2:P2,...` (every node, so that any of them can be
    /// killed).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.ports.iter().map(|p| self.address(*p)).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// `rediss+cluster://127.0.0.1:T1,...` over the nodes' TLS ports (a cluster of
    /// [`RedisCluster::start_tls`]; `None` for one without TLS).
    pub fn tls_url(&self) -> Option<String> {
        (!self.tls_ports.is_empty()).then(|| {
            let hosts: Vec<String> = self
                .tls_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect();
            format!("rediss+cluster://{}", hosts.join(","))
        })
    }

    /// The nodes' ports, in start order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// `host:port` of the node on `port` (`127.0.0.1:port` for a local node).
    pub fn address(&self, port: u16) -> String {
        let host = self
            .ports
            .iter()
            .position(|p| *p == port)
            .and_then(|i| self.hosts.get(i))
            .map_or("127.0.0.1", String::as_str);
        format!("{host}:{port}")
    }

    /// Whether the nodes are containers.
    pub fn in_containers(&self) -> bool {
        matches!(self.nodes, ClusterNodes::Containers { .. })
    }

    /// Runs `redis-cli -h HOST -p PORT ARGS...` against one node and returns its output.
    pub async fn cli(&self, port: u16, args: &[&str]) -> Result<String, HarnessError> {
        let cli = cli_binary()?;
        let address = self.address(port);
        let host = address.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
        let mut all: Vec<String> =
            vec!["-h".into(), host.to_owned(), "-p".into(), port.to_string()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        run_cli(&cli, &all).await
    }

    /// The ports of the nodes that are primaries serving slots now (and not marked
    /// failed), as the first running node sees it. A node without slots is left out:
    /// just after the cluster is made, a node's view may still call a new replica
    /// `master` (with no slots) until gossip tells it otherwise.
    pub async fn primaries(&mut self) -> Result<Vec<u16>, HarnessError> {
        let mut out = Vec::new();
        let port = self.live_port()?;
        let nodes = self.cli(port, &["CLUSTER", "NODES"]).await?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // id addr flags master ping pong epoch link [slot ...]
            let [_, addr, flags, _, _, _, _, _, _slots, ..] = fields.as_slice() else {
                continue;
            };
            if flags.split(',').any(|f| f == "master") && !flags.contains("fail") {
                let port = addr
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok());
                if let Some(p) = port {
                    out.push(p);
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The ports of the nodes still running (not killed).
    fn running_ports(&mut self) -> Vec<u16> {
        let running: Vec<bool> = match &mut self.nodes {
            ClusterNodes::Local { processes, .. } => {
                processes.iter_mut().map(|p| p.is_running()).collect()
            }
            ClusterNodes::Containers { killed, .. } => killed.iter().map(|k| !k).collect(),
        };
        self.ports
            .iter()
            .zip(running)
            .filter_map(|(port, up)| up.then_some(*port))
            .collect()
    }

    /// The port of a node that runs.
    fn live_port(&mut self) -> Result<u16, HarnessError> {
        self.running_ports()
            .first()
            .copied()
            .ok_or_else(|| HarnessError::Start("no cluster node is running".into()))
    }

    /// Freezes the node on `port` (SIGSTOP; `docker pause` for a container): it keeps its
    /// connections but answers nothing, replicates nothing, until [`Self::resume_node`].
    pub fn pause_node(&self, port: u16) -> Result<(), HarnessError> {
        self.signal_node(port, Signal::SIGSTOP, "pause")
    }

    /// Undoes [`Self::pause_node`] (SIGCONT; `docker unpause`).
    pub fn resume_node(&self, port: u16) -> Result<(), HarnessError> {
        self.signal_node(port, Signal::SIGCONT, "unpause")
    }

    fn signal_node(&self, port: u16, signal: Signal, docker: &str) -> Result<(), HarnessError> {
        let i = self
            .ports
            .iter()
            .position(|p| *p == port)
            .ok_or_else(|| HarnessError::Start(format!("no cluster node on port {port}")))?;
        match &self.nodes {
            ClusterNodes::Local { processes, .. } => processes[i].signal(signal),
            ClusterNodes::Containers { containers, .. } => super::engine::docker_blocking(
                &[docker, containers[i].id()],
                super::engine::CALL_BOUND,
            )
            .map(drop)
            .map_err(HarnessError::Start),
        }
    }

    /// The ports of the nodes that are replicas now, as the first running node sees it
    /// (those it marks failed for certain, `fail`, left out).
    pub async fn replicas(&mut self) -> Result<Vec<u16>, HarnessError> {
        let port = self.live_port()?;
        let nodes = self.cli(port, &["CLUSTER", "NODES"]).await?;
        let mut out: Vec<u16> = nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let [_, addr, flags, ..] = fields.as_slice() else {
                    return None;
                };
                // A replica marked `fail?` by one node's view is still a replica (and
                // still acknowledges writes).
                if !flags.split(',').any(|f| f == "slave") || flags.split(',').any(|f| f == "fail")
                {
                    return None;
                }
                addr.split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
            })
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// SIGKILLs the node on `port` (`docker kill` for a container).
    pub fn kill_node(&mut self, port: u16) -> Result<(), HarnessError> {
        let i = self
            .ports
            .iter()
            .position(|p| *p == port)
            .ok_or_else(|| HarnessError::Start(format!("no cluster node on port {port}")))?;
        match &mut self.nodes {
            ClusterNodes::Local { processes, .. } => processes[i].kill(),
            ClusterNodes::Containers {
                containers, killed, ..
            } => {
                super::engine::docker_blocking(
                    &["kill", containers[i].id()],
                    super::engine::CALL_BOUND,
                )
                .map_err(HarnessError::Start)?;
                killed[i] = true;
                Ok(())
            }
        }
    }

    /// Waits until every running node reports `cluster_state:ok` with all slots served,
    /// and every running replica has synced with its primary (`master_link_status:up`),
    /// for at most `within`.
    pub async fn wait_ok(&mut self, within: Duration) -> Result<(), HarnessError> {
        let start = Instant::now();
        loop {
            let mut all_ok = true;
            for port in self.running_ports() {
                let info = self
                    .cli(port, &["CLUSTER", "INFO"])
                    .await
                    .unwrap_or_default();
                if !(info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")) {
                    all_ok = false;
                    break;
                }
                let repl = self
                    .cli(port, &["INFO", "replication"])
                    .await
                    .unwrap_or_default();
                if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                    all_ok = false;
                    break;
                }
            }
            if all_ok {
                return Ok(());
            }
            if start.elapsed() > within {
                return Err(HarnessError::Start(format!(
                    "the redis cluster was not ok within {within:?}; logs:\n{}",
                    self.log_tail(10)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every replica that a running primary lists has applied what that
    /// primary had written when this was called (its `offset` in the primary's `INFO
    /// replication` reaches the primary's `master_repl_offset` of then), for at most
    /// `within`.
    pub async fn wait_replicated(&mut self, within: Duration) -> Result<(), HarnessError> {
        let until = Instant::now() + within;
        let mut targets = Vec::new();
        for port in self.primaries().await? {
            let info = self.cli(port, &["INFO", "replication"]).await?;
            let offset = info_field(&info, "master_repl_offset").unwrap_or(0);
            targets.push((port, offset));
        }
        for (port, target) in targets {
            loop {
                let info = self.cli(port, &["INFO", "replication"]).await?;
                let offsets: Vec<u64> = info
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("offset="))
                    .filter_map(|l| {
                        l.split(',')
                            .find_map(|kv| kv.strip_prefix("offset="))
                            .and_then(|v| v.trim().parse().ok())
                    })
                    .collect();
                if !offsets.is_empty() && offsets.iter().all(|o| *o >= target) {
                    break;
                }
                if Instant::now() > until {
                    return Err(HarnessError::Start(format!(
                        "the replicas of {} did not reach offset {target} within {within:?}:\n{info}",
                        self.address(port)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    /// The last lines of every node's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let tails: Vec<String> = match &self.nodes {
            ClusterNodes::Local { processes, .. } => {
                processes.iter().map(|p| p.log_tail(lines)).collect()
            }
            ClusterNodes::Containers { containers, .. } => containers
                .iter()
                .map(|c| {
                    super::engine::docker_blocking(
                        &["logs", "--tail", &lines.to_string(), c.id()],
                        Duration::from_secs(10),
                    )
                    .unwrap_or_else(|e| e)
                })
                .collect(),
        };
        self.ports
            .iter()
            .zip(tails)
            .map(|(port, tail)| format!("node {}:\n{tail}", self.address(*port)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kill_all(&mut self) {
        match &mut self.nodes {
            ClusterNodes::Local { processes, .. } => {
                for p in processes {
                    let _ = p.kill();
                }
            }
            // Removed with their handles.
            ClusterNodes::Containers { .. } => {}
        }
    }
}

/// Spawns `binary` with `args` (its output to `log`) and waits until it answers on
/// `port`; if it does not, kills it and says why with the end of its log.
async fn spawn_ready(
    binary: &Path,
    args: Vec<OsString>,
    log: std::path::PathBuf,
    port: u16,
    what: &str,
) -> Result<ChildProcess, HarnessError> {
    let mut process = ChildProcess::spawn(binary.to_path_buf(), args, log)?;
    if let Err(why) = wait_ready(&mut process, port).await {
        let tail = process.log_tail(20);
        let _ = process.kill();
        return Err(HarnessError::Start(format!(
            "{what} on port {port}: {why}; log tail:\n{tail}"
        )));
    }
    Ok(process)
}

/// `name:value` of an `INFO` reply, as a number.
fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

fn check_shape(primaries: usize, replicas: usize) -> Result<(), HarnessError> {
    if primaries == 1 && replicas == 0 || primaries >= 3 {
        Ok(())
    } else {
        Err(HarnessError::Start(format!(
            "a redis cluster of {primaries} primaries with {replicas} replicas each: 1 \
             primary without replicas, or at least 3"
        )))
    }
}

/// `n` free loopback ports for cluster nodes: each node also listens on its port +
/// 10000 (the cluster bus), so that port must be free too, and the port at most 55535.
fn cluster_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
    let mut held = Vec::new();
    let mut ports = Vec::with_capacity(n);
    for _ in 0..1000 {
        if ports.len() == n {
            return Ok(ports);
        }
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| HarnessError::io("binding 127.0.0.1:0 to find a free port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io("reading the bound port", e))?
            .port();
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        if let Ok(bus_listener) = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, bus)) {
            ports.push(port);
            held.push(listener);
            held.push(bus_listener);
        }
    }
    Err(HarnessError::Start(format!(
        "found only {} of {n} free port pairs (port and port + 10000) for a redis cluster",
        ports.len()
    )))
}

fn cli_binary() -> Result<std::path::PathBuf, HarnessError> {
    find_binary("redis-cli", &["/usr/bin", "/usr/local/bin"]).ok_or_else(|| {
        HarnessError::Unavailable("no redis-cli: install the Debian package `redis-tools`".into())
    })
}

/// Runs `redis-cli` with `args`, bounded by 60 s; its stdout and stderr together.
async fn run_cli(cli: &Path, args: &[String]) -> Result<String, HarnessError> {
    let run = tokio::process::Command::new(cli)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .map_err(|_| HarnessError::Start(format!("redis-cli {args:?} took over 60 s")))?
        .map_err(|e| HarnessError::io("running redis-cli", e))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(text)
}
