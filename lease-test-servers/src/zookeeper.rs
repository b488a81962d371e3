//! Throwaway local ZooKeeper servers (Debian's `zookeeper` package, 3.8, on the default
//! JRE): a standalone server, or a 3-member ensemble, on free loopback ports, with TTL
//! nodes enabled (`extendedTypesEnabled`) and the `ruok`, `srvr` and `stat` four-letter
//! words allowed (readiness, the leader).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::process::{ChildProcess, DirWatcher};
pub use super::zk_wire::four_letter;
use super::zk_wire::{CONTAINER_ENV, mode, serving};
use super::{HarnessError, PortAttempts};

const INSTALL_HINT: &str =
    "install the Debian package `zookeeper` (apt-get install zookeeper; it brings a JRE)";

/// Where Debian's package puts the server's classes.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// Netty's codec classes (Debian package libnetty-java, a dependency of zookeeper).
const NETTY_CODEC_JAR: &str = "/usr/share/java/netty-codec.jar";
/// The package's configuration directory (its log4j settings are on the class path).
const CONF_DIR: &str = "/etc/zookeeper/conf";

/// How long a started server may take to serve (a JVM's start-up included).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A throwaway ZooKeeper server, standalone: a container where an engine answers
/// ([`ZooKeeperServer::start`]), else (or always, [`ZooKeeperServer::start_local`]) a local
/// process. Killed when dropped.
#[derive(Debug)]
pub struct ZooKeeperServer {
    port: u16,
    secure_port: Option<u16>,
    source: super::Source,
    local: Option<Local>,
    _container: Option<super::container::Running>,
}

/// A local server process.
#[derive(Debug)]
struct Local {
    // Declared in drop order: the process, its watcher, then its directory.
    process: ChildProcess,
    _watcher: DirWatcher,
    dir: tempfile::TempDir,
}

/// The `java` binary: `$JAVA_HOME/bin/java`, or `java` on the path.
fn java() -> Option<PathBuf> {
    if let Some(home) = super::env_nonempty("JAVA_HOME") {
        let p = PathBuf::from(home).join("bin/java");
        if p.is_file() {
            return Some(p);
        }
    }
    super::find_binary("java", &["/usr/bin", "/usr/local/bin"])
}

impl ZooKeeperServer {
    /// A server from the first source that works: a container (`zookeeper:3.8`, else the
    /// project's `lease-test/zookeeper:3.8` from `scripts/build-test-images.sh`) where a
    /// Docker engine answers, else a local process ([`ZooKeeperServer::start_local`]).
    /// Under `LEASE_TEST_SOURCE=containers` a container that does not start is an error.
    /// Both have the same settings (tick 200 ms, sessions up to 600 s, TTL nodes reaped
    /// every 100 ms, data in memory).
    pub async fn start() -> Result<ZooKeeperServer, HarnessError> {
        let spec = super::container::Spec {
            images: &super::engine::ZOOKEEPER_IMAGES,
            port: 2181,
            // Logged once the client port is bound and the server runs.
            ready: vec![("Using checkIntervalMs=", false)],
            env: CONTAINER_ENV
                .iter()
                .map(|(k, v)| (*k, (*v).to_owned()))
                .collect(),
            cmd: Vec::new(),
            tmpfs: Some("/zookeeper-data"),
        };
        let started = super::container::try_start(spec).await;
        if started.is_none() && super::container::forced() {
            return Err(super::container::forced_failure("zookeeper"));
        }
        let Some(c) = started else {
            return Self::start_local().await;
        };
        // The container's port is published on loopback; the four-letter words go there.
        let start = Instant::now();
        while !serving(c.port) {
            if start.elapsed() > READY_TIMEOUT {
                return Err(HarnessError::Start(format!(
                    "zookeeper container {} logged ready but srvr got no mode within {READY_TIMEOUT:?}",
                    c.description
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        super::announce(format_args!(
            "lease test server: zookeeper at {}:{} (container {})",
            c.host, c.port, c.description
        ));
        Ok(ZooKeeperServer {
            port: c.port,
            secure_port: None,
            source: super::Source::Container,
            local: None,
            _container: Some(c),
        })
    }

    /// Starts a standalone server with a tick of 200 ms (sessions from 400 ms to 600 s;
    /// TTL nodes reaped every 100 ms).
    ///
    /// Errors: [`HarnessError::Unavailable`] without Java or Debian's `zookeeper` package.
    pub async fn start_local() -> Result<ZooKeeperServer, HarnessError> {
        Self::start_local_with(None).await
    }

    /// [`ZooKeeperServer::start_local`] with a secure client port as well (TLS through
    /// Netty, PEM files): the server's certificate from `certs` (`server_cert`, valid for
    /// `127.0.0.1` only), clients verified against `certs.ca` and, with
    /// `require_client_cert`, required to present a certificate it signed. The plain port
    /// stays open (readiness, four-letter words); [`ZooKeeperServer::secure_address`] is
    /// the TLS one.
    pub async fn start_local_tls(
        certs: &super::tls::TestCerts,
        require_client_cert: bool,
    ) -> Result<ZooKeeperServer, HarnessError> {
        Self::start_local_with(Some((certs, require_client_cert))).await
    }

    async fn start_local_with(
        tls: Option<(&super::tls::TestCerts, bool)>,
    ) -> Result<ZooKeeperServer, HarnessError> {
        let java = java().ok_or_else(|| {
            HarnessError::Unavailable(format!("no java for ZooKeeper: {INSTALL_HINT}"))
        })?;
        if !std::path::Path::new(ZOOKEEPER_JAR).is_file() {
            return Err(HarnessError::Unavailable(format!(
                "no {ZOOKEEPER_JAR}: {INSTALL_HINT}"
            )));
        }
        // In /dev/shm where it exists: ZooKeeper fsyncs its log before it answers a write,
        // and on this machine's disk under other servers' I/O that wait reaches seconds.
        let dir = super::etcd::data_root("lease-zookeeper-")?;
        let watcher = DirWatcher::spawn(dir.path())?;
        // The key store: the server's key (PKCS#8) followed by its certificate.
        let tls_cfg = match tls {
            None => String::new(),
            Some((certs, require)) => {
                let key = std::process::Command::new("openssl")
                    .args(["pkcs8", "-topk8", "-nocrypt", "-in"])
                    .arg(&certs.server_key)
                    .output()
                    .map_err(|e| HarnessError::io("running openssl pkcs8", e))?;
                if !key.status.success() {
                    return Err(HarnessError::Start(format!(
                        "openssl pkcs8: {}",
                        String::from_utf8_lossy(&key.stderr)
                    )));
                }
                let cert = std::fs::read(&certs.server_cert)
                    .map_err(|e| HarnessError::io("reading the server certificate", e))?;
                let store = dir.path().join("keystore.pem");
                std::fs::write(&store, [key.stdout, cert].concat())
                    .map_err(|e| HarnessError::io("writing keystore.pem", e))?;
                format!(
                    "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                     ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                     ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
                     ssl.clientAuth={}\nsecureClientPortAddress=127.0.0.1\n",
                    store.display(),
                    certs.ca.display(),
                    if require { "need" } else { "none" }
                )
            }
        };
        let mut attempts = PortAttempts::new(&["Address already in use"]);
        while let Some(ports) = attempts.next(2)? {
            let port = ports[0];
            let secure = tls.map(|_| ports[1]);
            let data = dir.path().join("data");
            let _ = std::fs::remove_dir_all(&data);
            std::fs::create_dir_all(&data)
                .map_err(|e| HarnessError::io("creating zookeeper's data dir", e))?;
            let cfg = dir.path().join("zoo.cfg");
            let mut text = format!(
                "tickTime=200\nmaxSessionTimeout=600000\ndataDir={data}\nclientPort={port}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\nextendedTypesEnabled=true\n\
                 4lw.commands.whitelist=ruok,srvr,stat\n",
                data = data.display()
            );
            if let Some(secure) = secure {
                text.push_str(&format!("secureClientPort={secure}\n{tls_cfg}"));
            }
            std::fs::write(&cfg, text).map_err(|e| HarnessError::io("writing zoo.cfg", e))?;
            let args: Vec<OsString> = vec![
                "-cp".into(),
                // Netty's codec: the secure port's server needs it, and Debian's
                // zookeeper.jar does not list it.
                format!("{CONF_DIR}:{ZOOKEEPER_JAR}:{NETTY_CODEC_JAR}").into(),
                "-Xmx256m".into(),
                // The container and TTL-node reaper every 100 ms (60 s by default), so that a
                // keep-for node is gone soon after its TTL.
                "-Dznode.container.checkIntervalMs=100".into(),
                format!("-Dzookeeper.log.dir={}", dir.path().display()).into(),
                "org.apache.zookeeper.server.ZooKeeperServerMain".into(),
                cfg.into_os_string(),
            ];
            let log = dir.path().join("zookeeper.log");
            let mut process = ChildProcess::spawn(java.clone(), args, log)?;
            let start = Instant::now();
            let ready = loop {
                if let Some(status) = process.try_exit_status() {
                    break Err(format!("exited with {status}"));
                }
                if serving(port) {
                    break Ok(());
                }
                if start.elapsed() > READY_TIMEOUT {
                    break Err(format!("not serving within {READY_TIMEOUT:?}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            match ready {
                Ok(()) => {
                    super::announce(format_args!(
                        "lease test server: zookeeper at 127.0.0.1:{port} (local process {}, pid \
                         {}, dir {}, up {:?})",
                        java.display(),
                        process.pid().unwrap_or_default(),
                        dir.path().display(),
                        start.elapsed()
                    ));
                    return Ok(ZooKeeperServer {
                        port,
                        secure_port: secure,
                        source: super::Source::LocalProcess,
                        local: Some(Local {
                            process,
                            _watcher: watcher,
                            dir,
                        }),
                        _container: None,
                    });
                }
                Err(why) => {
                    let tail = process.log_tail(20);
                    let _ = process.kill();
                    attempts.failed(format!("zookeeper on port {port}: {why}"), &tail);
                }
            }
        }
        Err(attempts.into_error())
    }

    /// The connect string of one standalone server ([`ZooKeeperServer::start`]: a
    /// container where an engine answers) shared by every test of the test binary
    /// (started by the first caller, removed when the test process exits by its cleanup
    /// watcher). Tests isolate themselves by path prefix. Every
    /// `#[tokio::test]` may call it, whatever its runtime.
    pub async fn shared() -> Result<String, HarnessError> {
        static SHARED: tokio::sync::OnceCell<Result<ZooKeeperServer, String>> =
            tokio::sync::OnceCell::const_new();
        let server = SHARED
            .get_or_init(|| async {
                // Started on a runtime of its own: the first caller's runtime ends with
                // its test, and the start waits on tokio timers.
                let started = std::thread::spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?
                        .block_on(ZooKeeperServer::start())
                        .map_err(|e| e.to_string())
                })
                .join()
                .map_err(|_| "the thread starting zookeeper panicked".to_owned())
                .and_then(|r| r);
                if let Ok(s) = &started {
                    super::announce(format_args!(
                        "lease test server: the shared zookeeper of this test binary is at {}",
                        s.address()
                    ));
                }
                started
            })
            .await
            .as_ref()
            .map_err(|e| HarnessError::Start(format!("shared zookeeper server: {e}")))?;
        Ok(server.address())
    }

    /// `127.0.0.1:PORT`, the connect string.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT` of the secure (TLS) client port, for a server started with
    /// [`ZooKeeperServer::start_local_tls`].
    pub fn secure_address(&self) -> Option<String> {
        self.secure_port.map(|p| format!("127.0.0.1:{p}"))
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pid of a spawned server (the JVM) while it runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.process.pid())
    }

    /// The answer to `srvr` (version, mode, zxid), or `None` if the server does not
    /// answer.
    pub fn srvr(&self) -> Option<String> {
        four_letter(self.port, "srvr")
    }

    /// Where the server came from.
    pub fn source(&self) -> super::Source {
        self.source
    }

    /// The server's directory (configuration, data, log); `None` for a container.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.local.as_ref().map(|l| l.dir.path())
    }

    /// The last lines of the server's log (a local process's only).
    pub fn log_tail(&self, lines: usize) -> String {
        self.local
            .as_ref()
            .map(|l| l.process.log_tail(lines))
            .unwrap_or_default()
    }

    fn local(&mut self) -> Result<&mut Local, HarnessError> {
        self.local.as_mut().ok_or_else(|| {
            HarnessError::Start(
                "a zookeeper container cannot be killed, paused or started again here: use \
                 ZooKeeperServer::start_local"
                    .into(),
            )
        })
    }

    /// Freezes it (SIGSTOP, and waits until every thread has stopped): connections stay
    /// open, nothing is answered. A local
    /// process's only.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        self.local()?.process.stop()
    }

    /// Continues a paused server (SIGCONT).
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        self.local()?.process.signal(Signal::SIGCONT)
    }

    /// Kills it at once (SIGKILL) and reaps it. A local process's only.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.local()?.process.kill()
    }

    /// Starts a killed server again (same port and data) and waits until it serves.
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        let port = self.port;
        let local = self.local()?;
        local.process.respawn()?;
        let start = Instant::now();
        loop {
            if serving(port) {
                return Ok(());
            }
            if let Some(status) = local.process.try_exit_status() {
                return Err(HarnessError::Start(format!(
                    "zookeeper exited with {status} on restart: {}",
                    local.process.log_tail(20)
                )));
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(HarnessError::Start(format!(
                    "zookeeper did not answer within {READY_TIMEOUT:?} of its restart"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        if let Some(l) = &mut self.local {
            let _ = l.process.kill();
        }
    }
}

/// The settings every server gets: a tick of 200 ms (sessions from 400 ms to 600 s), TTL
/// nodes, the four-letter words of readiness.
fn common_config(data: &std::path::Path, port: u16) -> String {
    format!(
        "tickTime=200\ninitLimit=50\nsyncLimit=10\nmaxSessionTimeout=600000\ndataDir={data}\n\
         clientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
         extendedTypesEnabled=true\n4lw.commands.whitelist=ruok,srvr,stat\n",
        data = data.display()
    )
}

fn server_args(dir: &std::path::Path, cfg: &std::path::Path) -> Vec<OsString> {
    vec![
        "-cp".into(),
        format!("{CONF_DIR}:{ZOOKEEPER_JAR}").into(),
        "-Xmx256m".into(),
        "-Dznode.container.checkIntervalMs=100".into(),
        format!("-Dzookeeper.log.dir={}", dir.display()).into(),
        "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
        cfg.as_os_str().to_owned(),
    ]
}

/// One member of a [`ZooKeeperEnsemble`].
#[derive(Debug)]
struct Member {
    id: usize,
    port: u16,
    process: ChildProcess,
}

/// A throwaway 3-member (or n-member) ZooKeeper ensemble on loopback, one JVM per member.
/// Killed when dropped.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    members: Vec<Member>,
    _watcher: DirWatcher,
    dir: tempfile::TempDir,
}

impl ZooKeeperEnsemble {
    /// Starts `n` members and waits until each serves (one leader, the others followers).
    ///
    /// Errors: [`HarnessError::Unavailable`] without Java or Debian's `zookeeper` package.
    pub async fn start(n: usize) -> Result<ZooKeeperEnsemble, HarnessError> {
        Self::start_with(n, "").await
    }

    /// [`ZooKeeperEnsemble::start`] with `extra` lines of `zoo.cfg` after the common
    /// settings, which they override (for example `syncLimit=300\n` for an ensemble whose
    /// leader a test starves of CPU on purpose).
    pub async fn start_with(n: usize, extra: &str) -> Result<ZooKeeperEnsemble, HarnessError> {
        let java = java().ok_or_else(|| {
            HarnessError::Unavailable(format!("no java for ZooKeeper: {INSTALL_HINT}"))
        })?;
        if !std::path::Path::new(ZOOKEEPER_JAR).is_file() {
            return Err(HarnessError::Unavailable(format!(
                "no {ZOOKEEPER_JAR}: {INSTALL_HINT}"
            )));
        }
        let dir = super::etcd::data_root("lease-zookeeper-ensemble-")?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let mut attempts = PortAttempts::new(&["Address already in use", "BindException"]);
        while let Some(ports) = attempts.next(3 * n)? {
            let servers: String = (0..n)
                .map(|i| {
                    format!(
                        "server.{}=127.0.0.1:{}:{}\n",
                        i + 1,
                        ports[3 * i + 1],
                        ports[3 * i + 2]
                    )
                })
                .collect();
            let mut members = Vec::with_capacity(n);
            let mut failed = None;
            for i in 0..n {
                let own = dir.path().join(format!("member-{}", i + 1));
                let data = own.join("data");
                let _ = std::fs::remove_dir_all(&own);
                std::fs::create_dir_all(&data)
                    .map_err(|e| HarnessError::io("creating zookeeper's data dir", e))?;
                std::fs::write(data.join("myid"), format!("{}\n", i + 1))
                    .map_err(|e| HarnessError::io("writing myid", e))?;
                let cfg = own.join("zoo.cfg");
                let text = format!("{}{extra}{servers}", common_config(&data, ports[3 * i]));
                std::fs::write(&cfg, text).map_err(|e| HarnessError::io("writing zoo.cfg", e))?;
                let log = own.join("zookeeper.log");
                match ChildProcess::spawn(java.clone(), server_args(&own, &cfg), log) {
                    Ok(process) => members.push(Member {
                        id: i + 1,
                        port: ports[3 * i],
                        process,
                    }),
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
            let start = Instant::now();
            let ready = match failed {
                Some(why) => Err(why),
                None => loop {
                    if let Some(m) = members
                        .iter_mut()
                        .find_map(|m| m.process.try_exit_status().map(|_| m.id))
                    {
                        break Err(format!("member {m} exited"));
                    }
                    let modes: Vec<Option<String>> = members.iter().map(|m| mode(m.port)).collect();
                    if modes.iter().all(Option::is_some)
                        && modes.iter().flatten().filter(|m| *m == "leader").count() == 1
                    {
                        break Ok(());
                    }
                    if start.elapsed() > READY_TIMEOUT {
                        break Err(format!(
                            "not serving within {READY_TIMEOUT:?}: modes {modes:?}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                },
            };
            match ready {
                Ok(()) => {
                    let ensemble = ZooKeeperEnsemble {
                        members,
                        _watcher: watcher,
                        dir,
                    };
                    super::announce(format_args!(
                        "lease test server: zookeeper ensemble of {n} at {} (local process {}, \
                         dir {}, up {:?})",
                        ensemble.connect_string(),
                        java.display(),
                        ensemble.dir.path().display(),
                        start.elapsed()
                    ));
                    return Ok(ensemble);
                }
                Err(why) => {
                    let tail = members
                        .first()
                        .map(|m| m.process.log_tail(20))
                        .unwrap_or_default();
                    for m in &mut members {
                        let _ = m.process.kill();
                    }
                    attempts.failed(format!("zookeeper ensemble: {why}"), &tail);
                }
            }
        }
        Err(attempts.into_error())
    }

    /// The connect string of one 3-member ensemble shared by every test of the test
    /// binary, from the first source that works: containers on a private network where a
    /// Docker engine answers ([`DockerStore::zookeeper_ensemble`](super::docker::DockerStore::zookeeper_ensemble)),
    /// else local processes ([`ZooKeeperEnsemble::start`]); under
    /// `LEASE_TEST_SOURCE=containers` an ensemble in containers that does not start is an
    /// error. Started by the first caller; removed or killed when the test process exits.
    /// Tests isolate themselves by path prefix and must not stop members.
    pub async fn shared() -> Result<String, HarnessError> {
        static SHARED: tokio::sync::OnceCell<Result<SharedEnsemble, String>> =
            tokio::sync::OnceCell::const_new();
        let ensemble = SHARED
            .get_or_init(|| async {
                std::thread::spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?
                        .block_on(SharedEnsemble::start())
                        .map_err(|e| e.to_string())
                })
                .join()
                .map_err(|_| "the thread starting zookeeper panicked".to_owned())
                .and_then(|r| r)
            })
            .await
            .as_ref()
            .map_err(|e| HarnessError::Start(format!("shared zookeeper ensemble: {e}")))?;
        Ok(ensemble.connect_string())
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`, the connect string of every member.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index (0-based) of the member that reports itself leader, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| mode(m.port).as_deref() == Some("leader"))
    }

    /// The pid of member `i`'s JVM while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(|m| m.process.pid())
    }

    /// `127.0.0.1:P`, the address of member `i` alone.
    pub fn member_address(&self, i: usize) -> Option<String> {
        self.members.get(i).map(|m| format!("127.0.0.1:{}", m.port))
    }

    /// Kills member `i` at once (SIGKILL).
    pub fn kill(&mut self, i: usize) -> Result<(), HarnessError> {
        self.member(i)?.process.kill()
    }

    /// Starts a killed member again (same ports and data); returns when it serves.
    pub async fn start_again(&mut self, i: usize) -> Result<(), HarnessError> {
        let m = self.member(i)?;
        m.process.respawn()?;
        let port = m.port;
        let start = Instant::now();
        while mode(port).is_none() {
            if start.elapsed() > READY_TIMEOUT {
                return Err(HarnessError::Start(format!(
                    "zookeeper member {} did not serve within {READY_TIMEOUT:?} of its restart",
                    i + 1
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Waits until the members that run agree on one leader again; returns its index.
    pub async fn wait_for_leader(&self, within: Duration) -> Result<usize, HarnessError> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if start.elapsed() > within {
                return Err(HarnessError::Start(format!(
                    "no zookeeper leader within {within:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn member(&mut self, i: usize) -> Result<&mut Member, HarnessError> {
        let n = self.members.len();
        self.members
            .get_mut(i)
            .ok_or_else(|| HarnessError::Start(format!("no member {i} in an ensemble of {n}")))
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.process.kill();
        }
    }
}

/// The ensemble behind [`ZooKeeperEnsemble::shared`]: in containers or local processes.
#[derive(Debug)]
enum SharedEnsemble {
    Local(ZooKeeperEnsemble),
    Containers {
        members: Vec<super::docker::DockerStore>,
        // Dropped after the members (fields drop in order): the network is removed once
        // its containers are.
        _network: super::docker::DockerNetwork,
    },
}

impl SharedEnsemble {
    async fn start() -> Result<SharedEnsemble, HarnessError> {
        let forced = super::container::forced();
        match super::docker::available() {
            Ok(()) => match Self::in_containers().await {
                Ok(e) => return Ok(e),
                Err(e) if forced => {
                    return Err(HarnessError::Start(format!(
                        "LEASE_TEST_SOURCE=containers, and no zookeeper ensemble started in \
                         containers (build the images with scripts/build-test-images.sh; the \
                         project's image needs revision 2 for an ensemble): {e}"
                    )));
                }
                Err(e) => super::announce(format_args!(
                    "lease test server: no zookeeper ensemble in containers ({e}); local processes"
                )),
            },
            Err(why) if forced => {
                return Err(HarnessError::Start(format!(
                    "LEASE_TEST_SOURCE=containers and {why}"
                )));
            }
            Err(_) => {}
        }
        ZooKeeperEnsemble::start(3).await.map(SharedEnsemble::Local)
    }

    async fn in_containers() -> Result<SharedEnsemble, HarnessError> {
        let network = super::docker::DockerNetwork::create().await?;
        let start = Instant::now();
        let members = super::docker::DockerStore::zookeeper_ensemble(&network, 3).await?;
        let e = SharedEnsemble::Containers {
            members,
            _network: network,
        };
        super::announce(format_args!(
            "lease test server: zookeeper ensemble of 3 at {} (containers on a private network, up {:?})",
            e.connect_string(),
            start.elapsed()
        ));
        Ok(e)
    }

    fn connect_string(&self) -> String {
        match self {
            SharedEnsemble::Local(e) => e.connect_string(),
            SharedEnsemble::Containers { members, .. } => members
                .iter()
                .map(|m| format!("127.0.0.1:{}", m.host_port()))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}
