//! Redis test servers.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::process::{ChildProcess, DirWatcher};
use super::{HarnessError, PortAttempts, Source, env_nonempty, find_binary};

mod cluster;
mod sentinel;
pub use cluster::RedisCluster;
pub use sentinel::RedisSentinels;

/// Environment variable with the URL of a Redis server to use instead of starting one.
pub const URL_VAR: &str = "LEASE_TEST_REDIS_URL";

pub(super) const INSTALL_HINT: &str = "install the Debian package `redis-server` \
    (apt-get install redis-server) or set LEASE_TEST_REDIS_URL=redis://host:port";

/// How long a spawned server may take to answer PING.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `stop` waits after SIGTERM before SIGKILL.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(10);

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

/// Microseconds spent in script runs (`EVAL` + `EVALSHA`) in the reply to
/// `INFO commandstats`: the server's time for a backend's scripts (wall time of each run).
pub fn script_usec(commandstats: &str) -> u64 {
    commandstats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(',')
                .find_map(|f| f.strip_prefix("usec="))?
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
        let mut attempts = PortAttempts::new(&["Address already in use"]);
        while let Some(ports) = attempts.next(1)? {
            let port = ports[0];
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
                    attempts.failed(format!("{} on port {port}: {why}", binary.display()), &tail);
                }
            }
        }
        Err(attempts.into_error())
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

    /// Freezes a spawned server (SIGSTOP, and waits until every thread has stopped):
    /// connections stay open, nothing is answered.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.local("pause")?.process.stop()
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

pub(super) fn server_args(port: u16, dir: &Path, persistent: bool) -> Vec<OsString> {
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
pub(super) async fn wait_ready(process: &mut ChildProcess, port: u16) -> Result<(), String> {
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
pub(super) fn ping(port: u16) -> bool {
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

/// Spawns `binary` with `args` (its output to `log`) and waits until it answers on
/// `port`; if it does not, kills it and says why with the end of its log.
pub(super) async fn spawn_ready(
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
