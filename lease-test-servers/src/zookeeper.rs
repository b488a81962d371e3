//! A throwaway local ZooKeeper server (Debian's `zookeeper` package, 3.8, on the default
//! JRE) for the ZooKeeper work of issue 36: a standalone server on a free loopback port,
//! with TTL nodes enabled (`extendedTypesEnabled`) and the `ruok`, `srvr` and `stat`
//! four-letter words allowed (readiness).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::process::{ChildProcess, DirWatcher};
use super::{HarnessError, PortAttempts};

const INSTALL_HINT: &str =
    "install the Debian package `zookeeper` (apt-get install zookeeper; it brings a JRE)";

/// Where Debian's package puts the server's classes.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The package's configuration directory (its log4j settings are on the class path).
const CONF_DIR: &str = "/etc/zookeeper/conf";

/// How long a started server may take to serve (a JVM's start-up included).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A throwaway local ZooKeeper server, standalone. Killed when dropped.
#[derive(Debug)]
pub struct ZooKeeperServer {
    port: u16,
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

/// Whether the server serves requests: `srvr` says its mode (`ruok` answers `imok` before
/// the server is ready to serve).
fn serving(port: u16) -> bool {
    four_letter(port, "srvr").is_some_and(|a| a.contains("Mode:"))
}

/// Sends a four-letter word and returns the answer.
fn four_letter(port: u16, word: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

impl ZooKeeperServer {
    /// Starts a standalone server with a tick of 200 ms (sessions from 400 ms to 600 s;
    /// TTL nodes reaped every 100 ms).
    ///
    /// Errors: [`HarnessError::Unavailable`] without Java or Debian's `zookeeper` package.
    pub async fn start_local() -> Result<ZooKeeperServer, HarnessError> {
        let java = java().ok_or_else(|| {
            HarnessError::Unavailable(format!("no java for ZooKeeper: {INSTALL_HINT}"))
        })?;
        if !std::path::Path::new(ZOOKEEPER_JAR).is_file() {
            return Err(HarnessError::Unavailable(format!(
                "no {ZOOKEEPER_JAR}: {INSTALL_HINT}"
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("lease-zookeeper-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for zookeeper", e))?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let mut attempts = PortAttempts::new(&["Address already in use"]);
        while let Some(ports) = attempts.next(1)? {
            let port = ports[0];
            let data = dir.path().join("data");
            let _ = std::fs::remove_dir_all(&data);
            std::fs::create_dir_all(&data)
                .map_err(|e| HarnessError::io("creating zookeeper's data dir", e))?;
            let cfg = dir.path().join("zoo.cfg");
            let text = format!(
                "tickTime=200\nmaxSessionTimeout=600000\ndataDir={data}\nclientPort={port}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\nextendedTypesEnabled=true\n\
                 4lw.commands.whitelist=ruok,srvr,stat\n",
                data = data.display()
            );
            std::fs::write(&cfg, text).map_err(|e| HarnessError::io("writing zoo.cfg", e))?;
            let args: Vec<OsString> = vec![
                "-cp".into(),
                format!("{CONF_DIR}:{ZOOKEEPER_JAR}").into(),
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
                        process,
                        _watcher: watcher,
                        dir,
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

    /// The connect string of one standalone server shared by every test of the test
    /// binary (started by the first caller, killed when the test process exits: its
    /// directory watcher removes it). Tests isolate themselves by path prefix. Every
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
                        .block_on(ZooKeeperServer::start_local())
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

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The answer to `srvr` (version, mode, zxid), or `None` if the server does not
    /// answer.
    pub fn srvr(&self) -> Option<String> {
        four_letter(self.port, "srvr")
    }

    /// The server's directory (configuration, data, log).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Freezes it (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.process.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server (SIGCONT).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.process.signal(Signal::SIGCONT)
    }

    /// Kills it at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.process.kill()
    }

    /// Starts a killed server again (same port and data) and waits until it serves.
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        self.process.respawn()?;
        let start = Instant::now();
        loop {
            if serving(self.port) {
                return Ok(());
            }
            if let Some(status) = self.process.try_exit_status() {
                return Err(HarnessError::Start(format!(
                    "zookeeper exited with {status} on restart: {}",
                    self.process.log_tail(20)
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
        let _ = self.process.kill();
    }
}
