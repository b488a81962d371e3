//! A PgBouncer connection pooler in front of a local PostgreSQL server, for tests of the
//! PostgreSQL backends through a pooler.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::process::{ChildProcess, DirWatcher};
use super::{HarnessError, PortAttempts, find_binary};

const INSTALL_HINT: &str = "install the Debian package `pgbouncer` (apt-get install pgbouncer)";

/// How long a started PgBouncer may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// PgBouncer's pool mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole session.
    Session,
    /// A server connection per transaction: consecutive statements of one client may run
    /// in different server sessions, and one server session serves many clients.
    Transaction,
}

/// A throwaway local `pgbouncer` on a free loopback port, forwarding every database to
/// the PostgreSQL server on `127.0.0.1:<server port>` as user `postgres` (trust
/// authentication). Killed when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    mode: PoolMode,
    // Declared in drop order: the process, its watcher, then its directory.
    process: ChildProcess,
    _watcher: DirWatcher,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of the server on `server_port`, with at most
    /// `pool_size` server connections per database. It ignores the startup parameter
    /// `extra_float_digits` (as most deployments configure it), and `options` too when
    /// `ignore_options` is set; otherwise it refuses a client that sends `options`.
    pub async fn start(
        server_port: u16,
        mode: PoolMode,
        pool_size: u32,
        ignore_options: bool,
    ) -> Result<PgBouncer, HarnessError> {
        let binary = find_binary("pgbouncer", &["/usr/sbin", "/usr/bin", "/usr/local/bin"])
            .ok_or_else(|| HarnessError::Unavailable(format!("no pgbouncer: {INSTALL_HINT}")))?;
        let dir = tempfile::Builder::new()
            .prefix("lease-pgbouncer-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for pgbouncer", e))?;
        let watcher = DirWatcher::spawn(dir.path())?;
        // PgBouncer refuses to run as root: as root it switches to `postgres` (-u), which
        // must be able to read its files.
        let run_as = if super::postgres::running_as_root() {
            Some(super::postgres::postgres_user().ok_or_else(|| {
                HarnessError::Unavailable(
                    "running as root and PgBouncer refuses root, but there is no `postgres` \
                     user to run it as"
                        .into(),
                )
            })?)
        } else {
            None
        };
        let auth = dir.path().join("users.txt");
        std::fs::write(&auth, "\"postgres\" \"\"\n")
            .map_err(|e| HarnessError::io("writing pgbouncer's auth file", e))?;
        let mut attempts = PortAttempts::new(&["Address already in use"]);
        while let Some(ports) = attempts.next(1)? {
            let port = ports[0];
            let ini = dir.path().join("pgbouncer.ini");
            let ignore = if ignore_options {
                "extra_float_digits,options"
            } else {
                "extra_float_digits"
            };
            let text = format!(
                "[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {auth}\npool_mode = {mode}\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 500\n\
                 ignore_startup_parameters = {ignore}\nserver_reset_query = DISCARD ALL\n",
                auth = auth.display(),
                mode = match mode {
                    PoolMode::Session => "session",
                    PoolMode::Transaction => "transaction",
                },
            );
            std::fs::write(&ini, text).map_err(|e| HarnessError::io("writing pgbouncer.ini", e))?;
            if let Some((uid, gid)) = run_as {
                for p in [dir.path(), ini.as_path(), auth.as_path()] {
                    std::os::unix::fs::chown(p, Some(uid), Some(gid))
                        .map_err(|e| HarnessError::io("chown for pgbouncer", e))?;
                }
            }
            let mut args: Vec<OsString> = Vec::new();
            if run_as.is_some() {
                args.extend(["-u", "postgres"].map(OsString::from));
            }
            args.push(ini.into_os_string());
            let log = dir.path().join("pgbouncer.log");
            let mut process = ChildProcess::spawn(binary.clone(), args, log)?;
            let start = Instant::now();
            let ready = loop {
                if let Some(status) = process.try_exit_status() {
                    break Err(format!("exited with {status}"));
                }
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    break Ok(());
                }
                if start.elapsed() > READY_TIMEOUT {
                    break Err(format!("not listening within {READY_TIMEOUT:?}"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            match ready {
                Ok(()) => {
                    super::announce(format_args!(
                        "lease test server: pgbouncer ({mode:?} pooling) at 127.0.0.1:{port} in \
                         front of postgres at 127.0.0.1:{server_port} (local process {}, pid {})",
                        binary.display(),
                        process.pid().unwrap_or_default()
                    ));
                    return Ok(PgBouncer {
                        port,
                        mode,
                        process,
                        _watcher: watcher,
                        _dir: dir,
                    });
                }
                Err(why) => {
                    let tail = process.log_tail(20);
                    let _ = process.kill();
                    attempts.failed(format!("pgbouncer on port {port}: {why}"), &tail);
                }
            }
        }
        Err(attempts.into_error())
    }

    /// The URL of `database` through the pooler.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?sslmode=disable",
            self.port
        )
    }

    /// The pooler's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pool mode.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// The last lines of PgBouncer's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.process.kill();
    }
}
