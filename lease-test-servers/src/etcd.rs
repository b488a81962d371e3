//! etcd test servers: a single node ([`EtcdServer`]) or a cluster on loopback
//! ([`EtcdCluster`]).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::process::{ChildProcess, DirWatcher};
use super::{
    HarnessError, PORT_ATTEMPTS, PortAttempts, Source, env_nonempty, find_binary, free_ports,
};

/// Environment variable with the endpoints (`host:port[,host:port...]`) of an etcd cluster
/// to use instead of starting one.
pub const ENDPOINTS_VAR: &str = "LEASE_TEST_ETCD_ENDPOINTS";

const INSTALL_HINT: &str = "install the Debian package `etcd-server` \
    (apt-get install etcd-server) or set LEASE_TEST_ETCD_ENDPOINTS=host:port[,host:port...]";

/// How long a spawned node or cluster may take to report healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Raft timing (heartbeat, election timeout, in ms) of a single node: it never holds an
/// election against anyone, so it can be fast.
pub(crate) const SINGLE_TIMING: (u32, u32) = (10, 100);

/// Raft timing of cluster members: fast failover, yet no spurious elections when a
/// loaded 2-core machine delays a heartbeat by a few tens of milliseconds.
pub const CLUSTER_TIMING: (u32, u32) = (25, 250);

/// One etcd process the harness spawned: a single node or a cluster member.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: ChildProcess,
}

/// What a member's `/v3/maintenance/status` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    /// This member's id.
    pub member_id: u64,
    /// The leader's id as this member sees it (0: no leader).
    pub leader: u64,
    /// The store revision on this member.
    pub revision: i64,
}

impl EtcdMember {
    /// The member's name (`n0`, `n1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its client URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Its client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// Its peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The pid while it runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the process is alive (paused counts as alive).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Whether `/health` says `true` (serving, with a leader).
    pub fn is_healthy(&self) -> bool {
        health(self.client_port) == Some(true)
    }

    /// `/v3/maintenance/status` through the gRPC gateway, `None` if it does not answer.
    pub fn status(&self) -> Option<MemberStatus> {
        status(self.client_port)
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// SIGTERM (and SIGCONT in case it is paused), wait for it to exit (SIGKILL after
    /// 10 s) and reap it. Nothing happens if it is not running.
    pub async fn stop(&mut self) -> Result<(), HarnessError> {
        self.process.terminate(STOP_GRACE).await
    }

    /// Kills it at once (SIGKILL, like a crash) and reaps it.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.process.kill()
    }

    /// Freezes it (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.process.signal(Signal::SIGSTOP)
    }

    /// Continues a paused member (SIGCONT).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.process.signal(Signal::SIGCONT)
    }

    /// Starts a stopped or killed member again (same ports, data and arguments) and waits
    /// until it serves `/health`. In a cluster it may not have a leader yet (e.g. while
    /// quorum is still missing): see [`EtcdCluster::wait_healthy`].
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        self.process.respawn()?;
        if let Err(why) = wait_until(&mut self.process, self.client_port, false).await {
            let tail = self.process.log_tail(20);
            self.process.kill()?;
            return Err(HarnessError::Start(format!(
                "etcd member {} restart on port {}: {why}; log tail:\n{tail}",
                self.name, self.client_port
            )));
        }
        Ok(())
    }
}

/// A single-node etcd for tests. See the [module docs](super) for where it comes from.
///
/// A spawned node listens on 127.0.0.1 on free ports with its data in a fresh temp
/// directory (in /dev/shm where available: etcd fsyncs every write); dropping the handle
/// kills it (SIGKILL), reaps it and removes the directory.
#[derive(Debug)]
pub struct EtcdServer {
    source: Source,
    endpoints: Vec<String>,
    local: Option<Local>,
    _container: Option<super::container::Running>,
}

#[derive(Debug)]
struct Local {
    // Declared in drop order: the process, its watcher, then its directory.
    member: EtcdMember,
    _watcher: DirWatcher,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// A server from the first source that works: `LEASE_TEST_ETCD_ENDPOINTS`; a
    /// `quay.io/coreos/etcd:v3.5.17` container when a Docker engine answers; a throwaway
    /// `etcd` (found on `PATH`,
    /// then in /usr/bin, /usr/local/bin) on free loopback ports in a temp dir, with
    /// `--heartbeat-interval 10 --election-timeout 100`. Prints which source was used to
    /// stderr.
    ///
    /// Errors: [`HarnessError::Unavailable`] naming what to install when no source works;
    /// [`HarnessError::Start`] with the server's log when the spawned node does not report
    /// healthy within 20 s.
    pub async fn start() -> Result<EtcdServer, HarnessError> {
        if let Some(endpoints) = env_nonempty(ENDPOINTS_VAR) {
            let endpoints: Vec<String> = endpoints
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect();
            super::announce(format_args!(
                "lease test server: etcd at {endpoints:?} (from {ENDPOINTS_VAR})"
            ));
            return Ok(EtcdServer {
                source: Source::Env,
                endpoints,
                local: None,
                _container: None,
            });
        }
        let spec = super::container::Spec {
            images: &super::engine::ETCD_IMAGES,
            port: 2379,
            ready: vec![("ready to serve client requests", true)],
            env: Vec::new(),
            cmd: vec![
                "/usr/local/bin/etcd".to_owned(),
                "--listen-client-urls".to_owned(),
                "http://0.0.0.0:2379".to_owned(),
                "--advertise-client-urls".to_owned(),
                "http://0.0.0.0:2379".to_owned(),
                // The local process's raft timing: with etcd's default (100 ms heartbeat,
                // 1 s election) the shortest lease is 2 s, and the 1 s TTL checks fail.
                "--heartbeat-interval".to_owned(),
                SINGLE_TIMING.0.to_string(),
                "--election-timeout".to_owned(),
                SINGLE_TIMING.1.to_string(),
                // In memory, as the local process's data dir (/dev/shm): on the container's
                // disk every write waits for an fsync, and under the I/O of other servers
                // starting (initdb, mariadb-install-db) lease expiry and replies were
                // seconds late (a CLI waiter saw its lease freed 3.9 s late).
                "--data-dir".to_owned(),
                "/etcd-data/default.etcd".to_owned(),
            ],
            tmpfs: Some("/etcd-data"),
        };
        let started = super::container::try_start(spec).await;
        if started.is_none() && super::container::forced() {
            return Err(super::container::forced_failure("etcd"));
        }
        if let Some(c) = started {
            super::announce(format_args!(
                "lease test server: etcd at {}:{} (container {})",
                c.host, c.port, c.description
            ));
            return Ok(EtcdServer {
                source: Source::Container,
                endpoints: vec![format!("http://{}:{}", c.host, c.port)],
                local: None,
                _container: Some(c),
            });
        }
        Self::start_local().await
    }

    /// Always a throwaway local node, even when `LEASE_TEST_ETCD_ENDPOINTS` is set (for
    /// tests that stop, kill or pause the server).
    pub async fn start_local() -> Result<EtcdServer, HarnessError> {
        Self::start_local_with(&[]).await
    }

    /// Like [`EtcdServer::start_local`], with extra command-line flags for the server
    /// (for example `--quota-backend-bytes=...` or `--max-request-bytes=...`).
    pub async fn start_local_with(extra_args: &[&str]) -> Result<EtcdServer, HarnessError> {
        let extra: Vec<OsString> = extra_args.iter().map(OsString::from).collect();
        Self::start_local_inner(0, &|_, _| extra.clone())
            .await
            .map(|(server, _)| server)
    }

    /// A throwaway local node that also serves clients over TLS, with `certs`' server
    /// certificate and key, on a second port; `client_cert_auth` makes that port require
    /// a client certificate signed by `certs.ca` (`--trusted-ca-file`,
    /// `--client-cert-auth`). The plain port
    /// stays (for [`EtcdServer::endpoints`], readiness and setup). Returns the server and
    /// its `https://127.0.0.1:PORT` endpoint.
    pub async fn start_local_tls(
        certs: &super::TestCerts,
        client_cert_auth: bool,
    ) -> Result<(EtcdServer, String), HarnessError> {
        let mut files: Vec<OsString> = vec![
            "--cert-file".into(),
            certs.server_cert.clone().into_os_string(),
            "--key-file".into(),
            certs.server_key.clone().into_os_string(),
        ];
        if client_cert_auth {
            // etcd requires a client certificate on its TLS port whenever it has a
            // trusted CA file, whatever --client-cert-auth says.
            files.extend([
                "--trusted-ca-file".into(),
                certs.ca.clone().into_os_string(),
                "--client-cert-auth".into(),
            ]);
        }
        // The TLS port is drawn with each attempt's ports: a port found free once can be
        // taken before etcd binds it, and the attempt is then made again on new ones.
        let (server, extra) = Self::start_local_inner(1, &|client_port, extra| {
            let tls_port = extra.first().copied().unwrap_or_default();
            let both = format!("http://127.0.0.1:{client_port},https://127.0.0.1:{tls_port}");
            let mut args: Vec<OsString> = vec![
                "--listen-client-urls".into(),
                both.clone().into(),
                "--advertise-client-urls".into(),
                both.into(),
            ];
            args.extend(files.iter().cloned());
            args
        })
        .await?;
        let tls_port = extra.first().copied().unwrap_or_default();
        Ok((server, format!("https://127.0.0.1:{tls_port}")))
    }

    /// A local node; `extra_args` gets the client port and `extra_ports` more free ports
    /// drawn with each attempt's, which are returned with the server.
    async fn start_local_inner(
        extra_ports: usize,
        extra_args: &(dyn Fn(u16, &[u16]) -> Vec<OsString> + Sync),
    ) -> Result<(EtcdServer, Vec<u16>), HarnessError> {
        let binary = etcd_binary()?;
        let dir = data_root("lease-etcd-")?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let token = cluster_token();
        let mut attempts = PortAttempts::new(&["address already in use"]);
        while let Some(ports) = attempts.next(2 + extra_ports)? {
            let (client_port, peer_port, extra) = match ports.as_slice() {
                &[c, p, ref rest @ ..] => (c, p, rest.to_vec()),
                _ => return Err(HarnessError::Start("no two free ports".into())),
            };
            let ports = [(client_port, peer_port)];
            let initial = initial_cluster(&ports);
            let _ = std::fs::remove_dir_all(dir.path().join("n0"));
            let log = dir.path().join("n0.log");
            let _ = std::fs::remove_file(&log);
            let args = member_args(
                "n0",
                dir.path(),
                client_port,
                peer_port,
                &initial,
                &token,
                SINGLE_TIMING,
            );
            let mut args = args;
            args.extend(extra_args(client_port, &extra));
            let mut process = ChildProcess::spawn(binary.clone(), args, log)?;
            match wait_until(&mut process, client_port, true).await {
                Ok(()) => {
                    super::announce(format_args!(
                        "lease test server: etcd at 127.0.0.1:{client_port} (local process {}, \
                         pid {}, dir {})",
                        binary.display(),
                        process.pid().unwrap_or_default(),
                        dir.path().display()
                    ));
                    let member = EtcdMember {
                        name: "n0".into(),
                        client_port,
                        peer_port,
                        process,
                    };
                    return Ok((
                        EtcdServer {
                            source: Source::LocalProcess,
                            endpoints: vec![member.endpoint()],
                            local: Some(Local {
                                member,
                                _watcher: watcher,
                                dir,
                            }),
                            _container: None,
                        },
                        extra,
                    ));
                }
                Err(why) => {
                    let tail = process.log_tail(20);
                    process.kill()?;
                    attempts.failed(
                        format!(
                            "{} on ports {client_port}/{peer_port} {extra:?}: {why}",
                            binary.display()
                        ),
                        &tail,
                    );
                }
            }
        }
        Err(attempts.into_error())
    }

    /// The client endpoints (`http://127.0.0.1:PORT` for a spawned node).
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// An `etcd://host:port[,host:port...]` URL for `leasehold::connect`.
    pub fn url(&self) -> String {
        etcd_url(&self.endpoints)
    }

    /// Where the server came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether the harness spawned the node (and so can stop, kill, pause or restart it).
    pub fn owns_process(&self) -> bool {
        self.local.is_some()
    }

    /// The spawned node.
    pub fn member(&mut self) -> Result<&mut EtcdMember, HarnessError> {
        let source = self.source;
        self.local
            .as_mut()
            .map(|l| &mut l.member)
            .ok_or(HarnessError::NotOwned {
                operation: "control",
                source,
            })
    }

    /// The pid of a spawned node while it runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.member.pid())
    }

    /// The data directory of a spawned node.
    pub fn dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|l| l.dir.path())
    }

    /// The last lines of a spawned node's log (empty for other sources).
    pub fn log_tail(&self, lines: usize) -> String {
        self.local
            .as_ref()
            .map(|l| l.member.log_tail(lines))
            .unwrap_or_default()
    }

    fn local(&self, operation: &'static str) -> Result<&Local, HarnessError> {
        self.local.as_ref().ok_or(HarnessError::NotOwned {
            operation,
            source: self.source,
        })
    }

    fn local_mut(&mut self, operation: &'static str) -> Result<&mut Local, HarnessError> {
        let source = self.source;
        self.local
            .as_mut()
            .ok_or(HarnessError::NotOwned { operation, source })
    }

    /// Stops a spawned node gracefully (SIGTERM, SIGKILL after 10 s) and reaps it.
    pub async fn stop(&mut self) -> Result<(), HarnessError> {
        self.local_mut("stop")?.member.stop().await
    }

    /// Starts a stopped or killed node again (same ports, data and arguments) and waits
    /// until it reports healthy. Its data (and so the store revision) survives.
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        let member = &mut self.local_mut("restart")?.member;
        member.process.respawn()?;
        if let Err(why) = wait_until(&mut member.process, member.client_port, true).await {
            let tail = member.process.log_tail(20);
            member.process.kill()?;
            return Err(HarnessError::Start(format!(
                "etcd restart on port {}: {why}; log tail:\n{tail}",
                member.client_port
            )));
        }
        Ok(())
    }

    /// Kills a spawned node at once (SIGKILL, like a crash) and reaps it.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.local_mut("kill")?.member.kill()
    }

    /// Freezes a spawned node (SIGSTOP).
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.local("pause")?.member.pause()
    }

    /// Continues a paused node (SIGCONT).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.local("resume")?.member.resume()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        if let Some(local) = &mut self.local {
            // SIGKILL works on a paused process too; then reap. The temp dir is removed
            // when `local.dir` drops right after.
            let _ = local.member.kill();
        }
    }
}

/// A cluster of etcd members on loopback, always spawned locally (fault injection needs
/// the processes). Dropping it kills (SIGKILL) and reaps every member and removes the
/// data directories.
#[derive(Debug)]
pub struct EtcdCluster {
    // Declared in drop order: the processes, their watcher, then their directory.
    members: Vec<EtcdMember>,
    _watcher: DirWatcher,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `size` members (`n0`, `n1`, ...) with [`CLUSTER_TIMING`] and pre-vote, and
    /// waits until every member reports healthy (has a leader).
    pub async fn start(size: usize) -> Result<EtcdCluster, HarnessError> {
        Self::start_with_timing(size, CLUSTER_TIMING).await
    }

    /// Like [`EtcdCluster::start`] with the given (heartbeat, election timeout) in ms.
    pub async fn start_with_timing(
        size: usize,
        timing: (u32, u32),
    ) -> Result<EtcdCluster, HarnessError> {
        if size == 0 {
            return Err(HarnessError::Start(
                "a cluster needs at least one member".into(),
            ));
        }
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            match Self::start_once(size, timing).await {
                Ok(cluster) => {
                    super::announce(format_args!(
                        "lease test server: etcd cluster of {size} at {:?} (local processes, \
                         dir {})",
                        cluster.endpoints(),
                        cluster.dir.path().display()
                    ));
                    return Ok(cluster);
                }
                // Another process took one of the ports between probing and binding.
                Err(HarnessError::Start(m)) if m.contains("address already in use") => {
                    last_error = m;
                }
                Err(e) => return Err(e),
            }
        }
        Err(HarnessError::Start(last_error))
    }

    async fn start_once(size: usize, timing: (u32, u32)) -> Result<EtcdCluster, HarnessError> {
        let binary = etcd_binary()?;
        let dir = data_root("lease-etcd-cluster-")?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let token = cluster_token();
        // Distinct ports for every member (a repeated port makes etcd refuse the
        // initial cluster as having a duplicate URL).
        let all = free_ports(size * 2)?;
        let ports: Vec<(u16, u16)> = all.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        let initial = initial_cluster(&ports);
        let mut members = Vec::with_capacity(size);
        for (i, (client_port, peer_port)) in ports.iter().copied().enumerate() {
            let name = format!("n{i}");
            let log = dir.path().join(format!("{name}.log"));
            let mut args = member_args(
                &name,
                dir.path(),
                client_port,
                peer_port,
                &initial,
                &token,
                timing,
            );
            args.push("--pre-vote=true".into());
            let process = ChildProcess::spawn(binary.clone(), args, log)?;
            members.push(EtcdMember {
                name,
                client_port,
                peer_port,
                process,
            });
        }
        let mut cluster = EtcdCluster {
            members,
            _watcher: watcher,
            dir,
        };
        if let Err(why) = cluster.wait_healthy(READY_TIMEOUT).await {
            let tails: Vec<String> = cluster
                .members
                .iter()
                .map(|m| format!("[{}]\n{}", m.name, m.log_tail(10)))
                .collect();
            return Err(HarnessError::Start(format!(
                "{}: {why}; log tails:\n{}",
                binary.display(),
                tails.join("\n")
            )));
        }
        Ok(cluster)
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The client endpoints of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// Member `i` (panics if out of range, as indexing does).
    pub fn member(&mut self, i: usize) -> &mut EtcdMember {
        &mut self.members[i]
    }

    /// All members.
    pub fn members(&mut self) -> &mut [EtcdMember] {
        &mut self.members
    }

    /// The data directory of the cluster (one subdirectory per member).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The index of the member most running members see as leader, if any.
    pub fn leader_index(&self) -> Option<usize> {
        let statuses: Vec<Option<MemberStatus>> =
            self.members.iter().map(EtcdMember::status).collect();
        let mut votes: Vec<(u64, usize)> = Vec::new();
        for s in statuses.iter().flatten() {
            if s.leader == 0 {
                continue;
            }
            match votes.iter_mut().find(|(id, _)| *id == s.leader) {
                Some((_, n)) => *n += 1,
                None => votes.push((s.leader, 1)),
            }
        }
        let (leader, _) = votes.into_iter().max_by_key(|(_, n)| *n)?;
        statuses
            .iter()
            .position(|s| s.is_some_and(|s| s.member_id == leader))
    }

    /// Waits until some member is leader and returns its index.
    pub async fn wait_leader(&self, timeout: Duration) -> Result<usize, HarnessError> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.leader_index() {
                return Ok(i);
            }
            if start.elapsed() > timeout {
                return Err(HarnessError::Start(format!("no leader within {timeout:?}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every running member reports healthy (serving, with a leader).
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), HarnessError> {
        let start = Instant::now();
        loop {
            let mut all = true;
            for m in &mut self.members {
                if let Some(status) = m.process.try_exit_status() {
                    return Err(HarnessError::Start(format!(
                        "etcd member {} exited with {status}",
                        m.name
                    )));
                }
                if m.process.pid().is_some() && !m.is_healthy() {
                    all = false;
                }
            }
            if all {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(HarnessError::Start(format!(
                    "etcd cluster not healthy within {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops every member gracefully, one at a time (all at once makes etcd's shutdown
    /// slow: each member waits for the others).
    pub async fn stop_all(&mut self) -> Result<(), HarnessError> {
        for m in &mut self.members {
            m.stop().await?;
        }
        Ok(())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
        }
    }
}

fn etcd_binary() -> Result<PathBuf, HarnessError> {
    find_binary("etcd", &["/usr/bin", "/usr/local/bin", "/usr/sbin"]).ok_or_else(|| {
        HarnessError::Unavailable(format!(
            "no etcd on PATH or in /usr/bin, /usr/local/bin, /usr/sbin: {INSTALL_HINT}"
        ))
    })
}

/// A fresh temp dir, in /dev/shm where it exists (etcd fsyncs each write; memory makes
/// that cheap), else in the default temp dir.
pub(crate) fn data_root(prefix: &str) -> Result<tempfile::TempDir, HarnessError> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix(prefix).tempdir_in(shm)
    {
        return Ok(dir);
    }
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| HarnessError::io("creating a temp dir for a test server", e))
}

/// A token unique to this cluster, so members of concurrently running test clusters that
/// happen to reuse ports never join each other.
fn cluster_token() -> String {
    format!("lease-test-{}", uuid::Uuid::new_v4().simple())
}

fn initial_cluster(ports: &[(u16, u16)]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("n{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn member_args(
    name: &str,
    dir: &Path,
    client_port: u16,
    peer_port: u16,
    initial_cluster: &str,
    token: &str,
    (heartbeat, election): (u32, u32),
) -> Vec<OsString> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut args: Vec<OsString> = vec!["--name".into(), name.into(), "--data-dir".into()];
    args.push(dir.join(name).into_os_string());
    args.extend(
        [
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            initial_cluster,
            "--initial-cluster-token",
            token,
            "--initial-cluster-state",
            "new",
            "--heartbeat-interval",
            &heartbeat.to_string(),
            "--election-timeout",
            &election.to_string(),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            "--enable-v2=false",
        ]
        .map(OsString::from),
    );
    args
}

/// Polls until `/health` on `port` answers (`healthy`: with `"health":"true"`), the
/// process exits, or [`READY_TIMEOUT`] passes. Uses the real clock, so it also works under
/// a paused tokio clock.
async fn wait_until(process: &mut ChildProcess, port: u16, healthy: bool) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Some(status) = process.try_exit_status() {
            return Err(format!("exited with {status}"));
        }
        match health(port) {
            Some(true) => return Ok(()),
            Some(false) if !healthy => return Ok(()),
            _ => {}
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(format!("not healthy within {READY_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `GET /health`: `Some(true)` healthy, `Some(false)` answering but unhealthy (no leader),
/// `None` not answering.
pub(crate) fn health(port: u16) -> Option<bool> {
    let reply = http(port, "GET", "/health", "")?;
    if reply.contains("\"health\":\"true\"") {
        Some(true)
    } else if reply.contains("\"health\"") {
        Some(false)
    } else {
        None
    }
}

pub(crate) fn status(port: u16) -> Option<MemberStatus> {
    let reply = http(port, "POST", "/v3/maintenance/status", "{}")?;
    let body = &reply[reply.find("\r\n\r\n")?..];
    // The gateway prints 64-bit integers as JSON strings.
    let member_id = json_number(body, "member_id")?;
    let leader = json_number(body, "leader").unwrap_or(0);
    let revision = json_number(body, "revision").unwrap_or(0);
    Some(MemberStatus {
        member_id,
        leader,
        revision: i64::try_from(revision).unwrap_or(i64::MAX),
    })
}

/// The number after `"field":` (quoted or not) in `json`.
fn json_number(json: &str, field: &str) -> Option<u64> {
    let pattern = format!("\"{field}\":");
    let at = json.find(&pattern)? + pattern.len();
    let digits: String = json[at..]
        .trim_start_matches([' ', '"'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// One HTTP/1.1 request over a fresh loopback connection with short timeouts; the whole
/// reply (headers and body) as text.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    let timeout = Some(Duration::from_millis(1000));
    stream.set_read_timeout(timeout).ok()?;
    stream.set_write_timeout(timeout).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(buf.get(..n)?),
            Err(_) if !reply.is_empty() => break,
            Err(_) => return None,
        }
        if reply.len() > 64 * 1024 {
            break;
        }
    }
    Some(String::from_utf8_lossy(&reply).into_owned())
}

/// `etcd://host:port,host:port` from client endpoints such as `http://127.0.0.1:2379`.
pub fn etcd_url(endpoints: &[String]) -> String {
    let hosts: Vec<&str> = endpoints
        .iter()
        .map(|e| {
            e.trim_start_matches("http://")
                .trim_start_matches("https://")
                .trim_end_matches('/')
        })
        .collect();
    format!("etcd://{}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gateway_numbers() {
        let body = r#"{"header":{"cluster_id":"1","member_id":"3319814642761637952","revision":"7"},"leader":"3319814642761637952"}"#;
        assert_eq!(json_number(body, "member_id"), Some(3319814642761637952));
        assert_eq!(json_number(body, "leader"), Some(3319814642761637952));
        assert_eq!(json_number(body, "revision"), Some(7));
        assert_eq!(json_number(body, "missing"), None);
    }

    #[test]
    fn initial_cluster_string() {
        assert_eq!(
            initial_cluster(&[(1, 2), (3, 4)]),
            "n0=http://127.0.0.1:2,n1=http://127.0.0.1:4"
        );
    }
}
