//! Containers the harness controls: a store or a holder in a Docker container on a
//! private network, which a test can pause (`docker pause`, a cgroup freeze), stop and
//! start, kill, and disconnect from and reconnect to its network.
//!
//! - Driven through the `docker` command line, every call bounded ([`CALL_BOUND`]).
//! - A store container publishes its port on a fixed loopback port chosen at start, so
//!   its address outlives a stop and start; on its private network it has a fixed
//!   address, kept across a disconnect and reconnect.
//! - Every container and network carries the labels `lease-test=1` and
//!   `lease-test.pid=<test process>`. Each is removed by a watcher process when its
//!   handle drops or the test process exits, however it exits (the watcher reads the
//!   end of a pipe the test process holds). What a watcher could not remove (the machine
//!   lost power, the watcher was killed too) is removed by the next test process that
//!   starts a container: [`remove_stale`].
//! - Images: the variable `LEASE_TEST_{REDIS,POSTGRES,ETCD}_IMAGE` if set; else the
//!   official image if the engine has it; else the project's own build
//!   (`scripts/build-test-images.sh`); else the official one, pulled (bounded).
//!
//! Nothing here needs a tokio runtime in `Drop`.

use std::fmt;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::HarnessError;

pub use super::engine::{CALL_BOUND, available, remove_stale, remove_stale_now};
use super::engine::{
    Cleanup, ETCD_IMAGES, Images, MARIADB_IMAGES, POSTGRES_IMAGES, REDIS_IMAGES, docker,
    docker_blocking, image_for, labels, strings,
};
use super::etcd::{CLUSTER_TIMING, SINGLE_TIMING};

/// How long a store container may take to answer after a start.
const READY_BOUND: Duration = Duration::from_secs(60);

/// A private network (`docker network create`) with its own /24 subnet, so that
/// addresses can be fixed; removed when the handle drops.
pub struct DockerNetwork {
    name: String,
    base: [u8; 3],
    next: Mutex<u8>,
    _cleanup: Cleanup,
}

impl fmt::Debug for DockerNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerNetwork")
            .field("name", &self.name)
            .field("subnet", &format!("{}/24", self.address(0)))
            .finish()
    }
}

impl DockerNetwork {
    /// Creates a network on a free 10.x.y.0/24 subnet.
    pub async fn create() -> Result<DockerNetwork, HarnessError> {
        available().map_err(HarnessError::Unavailable)?;
        tokio::task::spawn_blocking(remove_stale)
            .await
            .map_err(|e| HarnessError::Start(format!("removing stale containers: {e}")))?;
        let mut last = String::new();
        for attempt in 0..16u32 {
            let seed = uuid::Uuid::new_v4().as_u128();
            // 10.200.0.0 .. 10.239.255.0: clear of Docker's default pools (172.17+/16,
            // 192.168/16) and of the test network namespaces' 10.77.x.
            let base = [
                10,
                200 + u8::try_from(seed % 40).unwrap_or(0),
                u8::try_from((seed >> 8) % 256).unwrap_or(0),
            ];
            let name = format!("lease-test-{}", uuid::Uuid::new_v4().simple());
            let subnet = format!("{}.{}.{}.0/24", base[0], base[1], base[2]);
            let [l1, l2] = labels();
            let created = docker(strings(&[
                "network", "create", "--driver", "bridge", "--subnet", &subnet, "--label", &l1,
                "--label", &l2, &name,
            ]))
            .await;
            match created {
                Ok(id) => {
                    let cleanup = Cleanup::network(&id)?;
                    return Ok(DockerNetwork {
                        name,
                        base,
                        next: Mutex::new(2),
                        _cleanup: cleanup,
                    });
                }
                Err(e) => {
                    last = format!("attempt {attempt}: {e}");
                }
            }
        }
        Err(HarnessError::Start(format!(
            "no private Docker network could be created: {last}"
        )))
    }

    /// The network's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address `.n` of the subnet.
    pub fn address(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.base[0], self.base[1], self.base[2], n)
    }

    /// A fresh address on the subnet (from .2 up).
    pub fn allocate(&self) -> Result<Ipv4Addr, HarnessError> {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if *next == u8::MAX {
            return Err(HarnessError::Start(format!(
                "network {} has no address left",
                self.name
            )));
        }
        let n = *next;
        *next += 1;
        Ok(self.address(n))
    }
}

/// A network a container joins, with a fixed address or none.
#[derive(Clone, Debug)]
pub struct Attach {
    /// The network's name.
    pub network: String,
    /// Its address there (`None`: the engine chooses).
    pub ip: Option<Ipv4Addr>,
}

/// What to run in a container.
#[derive(Clone, Debug, Default)]
pub struct RunSpec {
    /// The image.
    pub image: String,
    /// The command (after the image; the image's entrypoint, if any, runs it).
    pub cmd: Vec<String>,
    /// An entrypoint instead of the image's.
    pub entrypoint: Option<String>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// Read-only bind mounts: (path here, path in the container).
    pub mounts: Vec<(PathBuf, String)>,
    /// A container port published on a fixed loopback port of this machine (chosen
    /// here); see [`DockerContainer::host_port`].
    pub publish: Option<u16>,
    /// The networks, the first one joined at creation.
    pub networks: Vec<Attach>,
    /// The signal `docker stop` sends first.
    pub stop_signal: Option<String>,
}

/// A container the harness started and controls; removed when the handle drops.
pub struct DockerContainer {
    id: String,
    image: String,
    host_port: Option<u16>,
    networks: Vec<Attach>,
    cleanup: Cleanup,
}

impl fmt::Debug for DockerContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerContainer")
            .field("id", &self.short_id())
            .field("image", &self.image)
            .field("host_port", &self.host_port)
            .finish()
    }
}

impl DockerContainer {
    /// Creates the container, joins its networks, and starts it.
    pub async fn run(spec: RunSpec) -> Result<DockerContainer, HarnessError> {
        available().map_err(HarnessError::Unavailable)?;
        tokio::task::spawn_blocking(remove_stale)
            .await
            .map_err(|e| HarnessError::Start(format!("removing stale containers: {e}")))?;
        let host_port = match spec.publish {
            Some(_) => Some(super::free_port()?),
            None => None,
        };
        let mut args = strings(&["create"]);
        for l in labels() {
            args.extend(["--label".to_owned(), l]);
        }
        if let (Some(port), Some(host)) = (spec.publish, host_port) {
            args.extend(["-p".to_owned(), format!("127.0.0.1:{host}:{port}")]);
        }
        if let Some(first) = spec.networks.first() {
            args.extend(["--network".to_owned(), first.network.clone()]);
            if let Some(ip) = first.ip {
                args.extend(["--ip".to_owned(), ip.to_string()]);
            }
        }
        for (k, v) in &spec.env {
            args.extend(["-e".to_owned(), format!("{k}={v}")]);
        }
        for (from, to) in &spec.mounts {
            args.extend(["-v".to_owned(), format!("{}:{to}:ro", from.display())]);
        }
        if let Some(sig) = &spec.stop_signal {
            args.extend(["--stop-signal".to_owned(), sig.clone()]);
        }
        if let Some(e) = &spec.entrypoint {
            args.extend(["--entrypoint".to_owned(), e.clone()]);
        }
        args.push(spec.image.clone());
        args.extend(spec.cmd.iter().cloned());
        let id = docker(args).await?;
        let cleanup = Cleanup::container(&id)?;
        let container = DockerContainer {
            id,
            image: spec.image.clone(),
            host_port,
            networks: spec.networks.clone(),
            cleanup,
        };
        for extra in spec.networks.iter().skip(1) {
            container.connect(extra).await?;
        }
        docker(strings(&["start", &container.id])).await?;
        Ok(container)
    }

    /// The container's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn short_id(&self) -> &str {
        self.id.get(..12).unwrap_or(&self.id)
    }

    /// The image it runs.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The loopback port of this machine where the published port is reachable (the same
    /// across a stop and start).
    pub fn host_port(&self) -> Option<u16> {
        self.host_port
    }

    /// Its address on `network`, as given at start.
    pub fn ip_on(&self, network: &str) -> Option<Ipv4Addr> {
        self.networks
            .iter()
            .find(|a| a.network == network)
            .and_then(|a| a.ip)
    }

    /// `docker pause`: every process of the container frozen (cgroup freezer); its
    /// connections stay open and unanswered.
    pub async fn pause(&self) -> Result<(), HarnessError> {
        docker(strings(&["pause", &self.id])).await.map(drop)
    }

    /// `docker unpause`.
    pub async fn unpause(&self) -> Result<(), HarnessError> {
        docker(strings(&["unpause", &self.id])).await.map(drop)
    }

    /// `docker stop` (the stop signal, then SIGKILL after 10 s).
    pub async fn stop(&self) -> Result<(), HarnessError> {
        docker(strings(&["stop", "-t", "10", &self.id]))
            .await
            .map(drop)
    }

    /// `docker kill` (SIGKILL).
    pub async fn kill(&self) -> Result<(), HarnessError> {
        docker(strings(&["kill", &self.id])).await.map(drop)
    }

    /// `docker start` after a stop or kill (same ports, same addresses).
    pub async fn start(&self) -> Result<(), HarnessError> {
        docker(strings(&["start", &self.id])).await.map(drop)
    }

    /// Waits until the container's main process has exited.
    pub async fn wait_exit(&self) -> Result<(), HarnessError> {
        docker(strings(&["wait", &self.id])).await.map(drop)
    }

    /// `docker network disconnect`: the container loses that network; packets to and
    /// from its address there go nowhere.
    pub async fn disconnect(&self, network: &str) -> Result<(), HarnessError> {
        docker(strings(&["network", "disconnect", network, &self.id]))
            .await
            .map(drop)
    }

    /// `docker network connect`, with the address the container had there.
    pub async fn reconnect(&self, network: &str) -> Result<(), HarnessError> {
        let attach = self
            .networks
            .iter()
            .find(|a| a.network == network)
            .cloned()
            .unwrap_or(Attach {
                network: network.to_owned(),
                ip: None,
            });
        self.connect(&attach).await
    }

    async fn connect(&self, attach: &Attach) -> Result<(), HarnessError> {
        let mut args = strings(&["network", "connect"]);
        if let Some(ip) = attach.ip {
            args.extend(["--ip".to_owned(), ip.to_string()]);
        }
        args.extend([attach.network.clone(), self.id.clone()]);
        docker(args).await.map(drop)
    }

    /// The last lines of its log (for error messages).
    pub async fn log_tail(&self) -> String {
        docker(strings(&["logs", "--tail", "20", &self.id]))
            .await
            .unwrap_or_else(|e| e.to_string())
    }

    /// Removes the container now (also done on drop, without waiting).
    pub fn remove(mut self) {
        self.cleanup.run_now();
    }
}

/// An image that can run `binary` (mounted read-only): the shared libraries it links, at
/// their paths, and nothing else. Made from this machine's files with `docker import`
/// (no registry needed) once per set of libraries.
pub async fn runtime_image_for(binary: &Path) -> Result<String, HarnessError> {
    let binary = binary.to_owned();
    tokio::task::spawn_blocking(move || runtime_image_blocking(&binary))
        .await
        .map_err(|e| HarnessError::Start(format!("building a runtime image: {e}")))?
}

fn runtime_image_blocking(binary: &Path) -> Result<String, HarnessError> {
    static MADE: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let ldd = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| HarnessError::io("running ldd", e))?;
    let mut libs: Vec<String> = String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(|w| w.trim_start_matches('/').to_owned())
        .collect();
    libs.sort();
    libs.dedup();
    if libs.is_empty() {
        return Err(HarnessError::Start(format!(
            "ldd found no libraries of {}",
            binary.display()
        )));
    }
    let tag = {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for l in &libs {
            l.hash(&mut h);
            std::fs::metadata(Path::new("/").join(l))
                .map(|m| m.len())
                .unwrap_or(0)
                .hash(&mut h);
        }
        format!("lease-test/runtime:{:016x}", h.finish())
    };
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if made.contains(&tag)
        || docker_blocking(
            &["image", "inspect", "--format", "{{.Id}}", &tag],
            CALL_BOUND,
        )
        .is_ok()
    {
        made.push(tag.clone());
        return Ok(tag);
    }
    // tar -h follows the links (/lib64/ld-linux..., /lib -> usr/lib).
    let mut tar = Command::new("tar")
        .args(["-ch", "-C", "/"])
        .args(&libs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| HarnessError::io("running tar", e))?;
    let tar_out = tar
        .stdout
        .take()
        .ok_or_else(|| HarnessError::Start("tar has no stdout".into()))?;
    let import = Command::new("docker")
        .args(["import", "-c", "ENV PATH=/usr/bin:/bin", "-", &tag])
        .stdin(tar_out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| HarnessError::io("running docker import", e))?;
    let tar_status = tar
        .wait()
        .map_err(|e| HarnessError::io("waiting for tar", e))?;
    if !import.status.success() || !tar_status.success() {
        return Err(HarnessError::Start(format!(
            "docker import of {tag} failed: {}",
            String::from_utf8_lossy(&import.stderr).trim()
        )));
    }
    made.push(tag.clone());
    Ok(tag)
}

/// The kind of store in a [`DockerStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// Redis 7, no persistence.
    Redis,
    /// PostgreSQL 15, trust authentication.
    Postgres,
    /// etcd, with the local process's raft timing.
    Etcd,
    /// MariaDB 10.11, `root` without a password, database `lease`, default durability
    /// (`innodb_flush_log_at_trx_commit=1`).
    Mysql,
    /// ZooKeeper 3.8 standalone, the harness's settings (tick 200 ms, sessions up to
    /// 600 s, TTL nodes reaped every 100 ms).
    ZooKeeper,
}

impl StoreKind {
    fn port(self) -> u16 {
        match self {
            StoreKind::Redis => 6379,
            StoreKind::Postgres => 5432,
            StoreKind::Etcd => 2379,
            StoreKind::Mysql => 3306,
            StoreKind::ZooKeeper => 2181,
        }
    }

    fn images(self) -> &'static Images {
        match self {
            StoreKind::Redis => &REDIS_IMAGES,
            StoreKind::Postgres => &POSTGRES_IMAGES,
            StoreKind::Etcd => &ETCD_IMAGES,
            StoreKind::Mysql => &MARIADB_IMAGES,
            StoreKind::ZooKeeper => &super::engine::ZOOKEEPER_IMAGES,
        }
    }

    /// The URL of a server of this kind at `addr`.
    pub fn url(self, addr: SocketAddr) -> String {
        match self {
            StoreKind::Redis => format!("redis://{addr}/"),
            StoreKind::Postgres => format!("postgres://postgres@{addr}/postgres?sslmode=disable"),
            StoreKind::Etcd => format!("etcd://{addr}"),
            StoreKind::Mysql => format!("mysql://root@{addr}/lease"),
            StoreKind::ZooKeeper => format!("zk://{addr}/lease"),
        }
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::Etcd => "etcd",
            StoreKind::Mysql => "mysql",
            StoreKind::ZooKeeper => "zookeeper",
        })
    }
}

/// A store in a container on a private network, published on a loopback port.
#[derive(Debug)]
pub struct DockerStore {
    kind: StoreKind,
    network: String,
    ip: Ipv4Addr,
    container: DockerContainer,
}

impl DockerStore {
    /// Starts one store of `kind` on `network` and waits until it answers.
    pub async fn start(
        kind: StoreKind,
        network: &DockerNetwork,
    ) -> Result<DockerStore, HarnessError> {
        let ip = network.allocate()?;
        let cmd = match kind {
            StoreKind::Etcd => etcd_cmd("n0", ip, &[("n0", ip)], SINGLE_TIMING, "single"),
            StoreKind::Redis => strings(&[
                "redis-server",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ]),
            StoreKind::Postgres => strings(&["-c", "max_connections=300"]),
            StoreKind::Mysql => super::mariadb::container_flags(false),
            // The project's image writes its own configuration; the official one reads
            // the environment (see `create`).
            StoreKind::ZooKeeper => Vec::new(),
        };
        Self::run(kind, network, ip, cmd).await
    }

    /// Starts a `size`-member etcd cluster on `network` (the local cluster's raft timing,
    /// pre-vote) and waits until every member answers healthy.
    pub async fn etcd_cluster(
        network: &DockerNetwork,
        size: usize,
    ) -> Result<Vec<DockerStore>, HarnessError> {
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            members.push((format!("n{i}"), network.allocate()?));
        }
        let peers: Vec<(&str, Ipv4Addr)> =
            members.iter().map(|(n, ip)| (n.as_str(), *ip)).collect();
        let token = format!("lease-test-{}", uuid::Uuid::new_v4().simple());
        let mut started = Vec::with_capacity(size);
        for (name, ip) in &members {
            let mut cmd = etcd_cmd(name, *ip, &peers, CLUSTER_TIMING, &token);
            cmd.push("--pre-vote=true".into());
            // Not waiting here: a member is healthy only once a quorum runs.
            started.push(Self::create(StoreKind::Etcd, network, *ip, cmd).await?);
        }
        for member in &started {
            member.wait_ready().await?;
        }
        Ok(started)
    }

    /// Starts a `size`-member ZooKeeper ensemble on `network` (the standalone server's
    /// settings, tick 200 ms; initLimit 50 and syncLimit 10 ticks, as the local ensemble)
    /// and waits until every member serves, one of them as leader. The image takes the
    /// official image's `ZOO_MY_ID` and `ZOO_SERVERS` (the project's image from revision 2
    /// of `scripts/build-test-images.sh`).
    pub async fn zookeeper_ensemble(
        network: &DockerNetwork,
        size: usize,
    ) -> Result<Vec<DockerStore>, HarnessError> {
        let mut ips = Vec::with_capacity(size);
        for _ in 0..size {
            ips.push(network.allocate()?);
        }
        let servers: Vec<String> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("server.{}={ip}:2888:3888;2181", i + 1))
            .collect();
        let servers = servers.join(" ");
        let mut started = Vec::with_capacity(size);
        for (i, ip) in ips.iter().enumerate() {
            let env = vec![
                ("ZOO_MY_ID".to_owned(), (i + 1).to_string()),
                ("ZOO_SERVERS".to_owned(), servers.clone()),
                ("ZOO_INIT_LIMIT".to_owned(), "50".to_owned()),
                ("ZOO_SYNC_LIMIT".to_owned(), "10".to_owned()),
            ];
            // Not waiting here: a member serves only once a quorum runs.
            started.push(
                Self::create_with(StoreKind::ZooKeeper, network, *ip, Vec::new(), env).await?,
            );
        }
        for member in &started {
            member.wait_ready().await?;
        }
        zookeeper_leader(&started, READY_BOUND).await?;
        Ok(started)
    }

    async fn run(
        kind: StoreKind,
        network: &DockerNetwork,
        ip: Ipv4Addr,
        cmd: Vec<String>,
    ) -> Result<DockerStore, HarnessError> {
        let store = Self::create(kind, network, ip, cmd).await?;
        store.wait_ready().await?;
        Ok(store)
    }

    async fn create(
        kind: StoreKind,
        network: &DockerNetwork,
        ip: Ipv4Addr,
        cmd: Vec<String>,
    ) -> Result<DockerStore, HarnessError> {
        Self::create_with(kind, network, ip, cmd, Vec::new()).await
    }

    /// [`DockerStore::create`] with environment variables beyond the kind's own.
    async fn create_with(
        kind: StoreKind,
        network: &DockerNetwork,
        ip: Ipv4Addr,
        cmd: Vec<String>,
        extra_env: Vec<(String, String)>,
    ) -> Result<DockerStore, HarnessError> {
        let image = image_for(kind.images()).await;
        let mut env: Vec<(String, String)> = match kind {
            StoreKind::Postgres => {
                vec![("POSTGRES_HOST_AUTH_METHOD".into(), "trust".into())]
            }
            StoreKind::Mysql => super::mariadb::CONTAINER_ENV
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            // Not ZOO_DATA_DIR: the official image's entrypoint changes the owner of that
            // directory and fails where it does not exist (no tmpfs here), and its default
            // /data exists; the project's image writes its own configuration.
            StoreKind::ZooKeeper => super::zk_wire::CONTAINER_ENV
                .iter()
                .filter(|(k, _)| *k != "ZOO_DATA_DIR")
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            _ => Vec::new(),
        };
        env.extend(extra_env);
        let container = DockerContainer::run(RunSpec {
            image: image.clone(),
            cmd,
            env,
            publish: Some(kind.port()),
            networks: vec![Attach {
                network: network.name().to_owned(),
                ip: Some(ip),
            }],
            // PostgreSQL's fast shutdown (the official image's choice): SIGTERM would
            // wait for every client to disconnect.
            stop_signal: (kind == StoreKind::Postgres).then(|| "SIGINT".to_owned()),
            ..RunSpec::default()
        })
        .await?;
        super::announce(format_args!(
            "lease test server: {kind} at 127.0.0.1:{} and {ip}:{} on network {} (container {image} {}, controllable)",
            container.host_port().unwrap_or(0),
            kind.port(),
            network.name(),
            container.short_id(),
        ));
        Ok(DockerStore {
            kind,
            network: network.name().to_owned(),
            ip,
            container,
        })
    }

    /// Waits until the store answers on its published port (for at most `READY_BOUND`).
    pub async fn wait_ready(&self) -> Result<(), HarnessError> {
        let port = self.host_port();
        let kind = self.kind;
        let until = Instant::now() + READY_BOUND;
        loop {
            let ready = tokio::task::spawn_blocking(move || answers(kind, port))
                .await
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(HarnessError::Start(format!(
                    "{kind} container did not answer on 127.0.0.1:{port} within {READY_BOUND:?}; its log:\n{}",
                    self.container.log_tail().await
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The kind of store.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// The container (pause, stop, start, kill, disconnect, reconnect).
    pub fn container(&self) -> &DockerContainer {
        &self.container
    }

    /// The published loopback port.
    pub fn host_port(&self) -> u16 {
        self.container.host_port().unwrap_or(0)
    }

    /// The URL from this machine (the published loopback port).
    pub fn url(&self) -> String {
        self.kind
            .url(SocketAddr::from((Ipv4Addr::LOCALHOST, self.host_port())))
    }

    /// The URL from another container on the same network.
    pub fn url_in_network(&self) -> String {
        self.kind.url(SocketAddr::from((self.ip, self.kind.port())))
    }

    /// Its address on its network.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The network's name.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// etcd only: this member's status (id, leader) through its published port.
    pub fn etcd_status(&self) -> Option<super::etcd::MemberStatus> {
        (self.kind == StoreKind::Etcd)
            .then(|| super::etcd::status(self.host_port()))
            .flatten()
    }
}

/// The index of the member that the answering members of an etcd cluster in containers
/// see as leader.
pub async fn etcd_leader(members: &[DockerStore], within: Duration) -> Result<usize, HarnessError> {
    let until = Instant::now() + within;
    loop {
        let ports: Vec<u16> = members.iter().map(DockerStore::host_port).collect();
        let statuses = tokio::task::spawn_blocking(move || {
            ports
                .into_iter()
                .map(super::etcd::status)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let leader = statuses
            .iter()
            .flatten()
            .map(|s| s.leader)
            .find(|l| *l != 0);
        if let Some(l) = leader
            && let Some(i) = statuses
                .iter()
                .position(|s| s.is_some_and(|s| s.member_id == l))
        {
            return Ok(i);
        }
        if Instant::now() > until {
            return Err(HarnessError::Start(format!(
                "no etcd leader within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The index of the member of a ZooKeeper ensemble in containers that reports itself
/// leader (`srvr` through its published port), once exactly one does.
pub async fn zookeeper_leader(
    members: &[DockerStore],
    within: Duration,
) -> Result<usize, HarnessError> {
    let until = Instant::now() + within;
    loop {
        let ports: Vec<u16> = members.iter().map(DockerStore::host_port).collect();
        let modes = tokio::task::spawn_blocking(move || {
            ports
                .into_iter()
                .map(super::zk_wire::mode)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let leaders: Vec<usize> = modes
            .iter()
            .enumerate()
            .filter(|(_, m)| m.as_deref() == Some("leader"))
            .map(|(i, _)| i)
            .collect();
        if let [one] = leaders.as_slice() {
            return Ok(*one);
        }
        if modes.iter().any(|m| m.as_deref() == Some("standalone")) {
            return Err(HarnessError::Start(format!(
                "a member of the zookeeper ensemble runs standalone (modes {modes:?}): its \
                 image ignores ZOO_MY_ID and ZOO_SERVERS (the project's image before revision \
                 2: run scripts/build-test-images.sh)"
            )));
        }
        if Instant::now() > until {
            return Err(HarnessError::Start(format!(
                "no single zookeeper leader within {within:?}: modes {modes:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn etcd_cmd(
    name: &str,
    ip: Ipv4Addr,
    peers: &[(&str, Ipv4Addr)],
    timing: (u32, u32),
    token: &str,
) -> Vec<String> {
    let cluster: Vec<String> = peers
        .iter()
        .map(|(n, ip)| format!("{n}=http://{ip}:2380"))
        .collect();
    vec![
        "/usr/local/bin/etcd".into(),
        "--name".into(),
        name.into(),
        "--data-dir".into(),
        format!("/var/lib/etcd/{name}"),
        "--listen-client-urls".into(),
        "http://0.0.0.0:2379".into(),
        "--advertise-client-urls".into(),
        format!("http://{ip}:2379"),
        "--listen-peer-urls".into(),
        "http://0.0.0.0:2380".into(),
        "--initial-advertise-peer-urls".into(),
        format!("http://{ip}:2380"),
        "--initial-cluster".into(),
        cluster.join(","),
        "--initial-cluster-token".into(),
        token.into(),
        "--initial-cluster-state".into(),
        "new".into(),
        "--heartbeat-interval".into(),
        timing.0.to_string(),
        "--election-timeout".into(),
        timing.1.to_string(),
    ]
}

/// Whether a store of `kind` answers on 127.0.0.1:`port`.
fn answers(kind: StoreKind, port: u16) -> bool {
    match kind {
        StoreKind::Etcd => super::etcd::health(port) == Some(true),
        StoreKind::Postgres => super::postgres::run_sql(port, "postgres", "SELECT 1").is_ok(),
        StoreKind::Redis => redis_ping(port),
        StoreKind::Mysql => super::mariadb::answers(port),
        StoreKind::ZooKeeper => super::zk_wire::serving(port),
    }
}

fn redis_ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if s.set_read_timeout(timeout).is_err() || s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf.get(..n).is_some_and(|b| b.starts_with(b"+PONG")))
}
