//! Redis Cluster for tests: [`RedisCluster`], containers on a private network or local
//! processes.

use super::*;

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
        containers: Vec<crate::docker::DockerContainer>,
        killed: Vec<bool>,
        _network: crate::docker::DockerNetwork,
    },
}

/// How long a new cluster may take to agree on its slots.
pub(super) const CLUSTER_READY: Duration = Duration::from_secs(30);

/// The port of the first node in containers (each node has its own address, so the
/// ports only have to differ between nodes, to name them).
pub(super) const CONTAINER_PORT_BASE: u16 = 7000;

/// Every node's flags but its port and place.
pub(super) fn node_args() -> Vec<String> {
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
        match crate::docker::available() {
            Ok(()) => Self::start_in_containers(3, 1).await,
            Err(why) if crate::container::forced() => Err(HarnessError::Start(format!(
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
    pub async fn start_tls(certs: &crate::TestCerts) -> Result<RedisCluster, HarnessError> {
        Self::start_local(3, 1, Some(certs)).await
    }

    async fn start_local(
        primaries: usize,
        replicas: usize,
        tls: Option<&crate::TestCerts>,
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
            Some(_) => crate::free_ports(ports.len())?,
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
                // Keep the command line (with --dir) as it is, so the cleanup watcher
                // finds the node by its directory when the test binary exits (the shared
                // cluster is never dropped); with the default title the command line is
                // `redis-server 127.0.0.1:PORT [cluster]` and the node outlived the binary.
                "--set-proc-title".to_owned(),
                "no".to_owned(),
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
        use crate::docker::{Attach, DockerContainer, DockerNetwork, RunSpec};
        check_shape(primaries, replicas)?;
        cli_binary()?;
        let network = DockerNetwork::create().await?;
        let image = crate::engine::image_for(&crate::engine::REDIS_IMAGES).await;
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
        crate::announce(format_args!(
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
            ClusterNodes::Containers { containers, .. } => crate::engine::docker_blocking(
                &[docker, containers[i].id()],
                crate::engine::CALL_BOUND,
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
                crate::engine::docker_blocking(
                    &["kill", containers[i].id()],
                    crate::engine::CALL_BOUND,
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
                    crate::engine::docker_blocking(
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

/// `name:value` of an `INFO` reply, as a number.
pub(super) fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

pub(super) fn check_shape(primaries: usize, replicas: usize) -> Result<(), HarnessError> {
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
pub(super) fn cluster_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
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

pub(super) fn cli_binary() -> Result<std::path::PathBuf, HarnessError> {
    find_binary("redis-cli", &["/usr/bin", "/usr/local/bin"]).ok_or_else(|| {
        HarnessError::Unavailable("no redis-cli: install the Debian package `redis-tools`".into())
    })
}

/// Runs `redis-cli` with `args`, bounded by 60 s; its stdout and stderr together.
pub(super) async fn run_cli(cli: &Path, args: &[String]) -> Result<String, HarnessError> {
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
