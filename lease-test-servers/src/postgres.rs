//! PostgreSQL test servers.
//!
//! [`PostgresServer::start`] gives a server of its own (for fault injection: stop, kill,
//! pause, restart); [`PostgresServer::shared`] gives a fresh database on one server shared
//! by the whole test binary, because `initdb` takes about a second.
//!
//! A spawned server is a throwaway cluster: `initdb -A trust` in a temp directory, then
//! `postgres` listening on 127.0.0.1 on a free port (its Unix socket in the same temp
//! directory). As root it runs as the `postgres` user (Postgres refuses to run as root),
//! with the directory chowned to it. Postgres's child processes each call `setsid()`, so
//! `pause`/`resume`/`kill` signal the postmaster and each of its children one by one
//! (found through `/proc`): a signal to the postmaster's process group would reach the
//! postmaster alone.
//!
//! **Cleanup.** Each spawned server comes with a small watcher process (`sh`) whose
//! standard input is a pipe from the test process. When the test process exits for any
//! reason (even SIGKILL) the kernel closes the pipe; the watcher then shuts the server
//! down (SIGQUIT, then SIGKILL, to its process group) and removes its directory. This is
//! what cleans up the [shared](PostgresServer::shared) server, which lives in a `static`
//! and is never dropped. Dropping a [`PostgresServer`] kills and reaps the server at once.
//!
//! [`PostgresServer::start`] tries, in order, `LEASE_TEST_POSTGRES_URL`, a `postgres:15`
//! container (testcontainers) when a Docker engine answers, and a local cluster;
//! [`PostgresServer::start_local_process`] and [`PostgresServer::start_fast`] always
//! spawn a local cluster (fault injection needs the process).

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{HarnessError, PortAttempts, Source, env_nonempty, find_binary};

/// Environment variable with the URL of a Postgres server to use instead of starting one.
pub const URL_VAR: &str = "LEASE_TEST_POSTGRES_URL";

const INSTALL_HINT: &str = "install the Debian package `postgresql` \
    (apt-get install postgresql) or set LEASE_TEST_POSTGRES_URL=postgres://user:pass@host:port/db";

/// Where `initdb` and `postgres` are looked for after `PATH` (Debian keeps them out of it).
const BIN_DIRS: &[&str] = &[
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/14/bin",
    "/usr/lib/postgresql/13/bin",
    "/usr/local/pgsql/bin",
    "/usr/pgsql/bin",
];

/// How long a spawned server may take to accept a query.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `stop` waits after asking for a fast shutdown before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Connection slots of a spawned server: the advisory-lock mode keeps one connection per
/// held lease, and tests run in parallel.
const MAX_CONNECTIONS: u32 = 500;

/// The watcher: waits for EOF on stdin (the test process is gone, or the handle closed
/// the pipe), then shuts the server down and removes its directory.
/// `$1` = data directory, `$2` = directory to remove.
const WATCHER_SCRIPT: &str = r#"
read -r _ignored
pidfile="$1/postmaster.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  case "$pid" in ''|*[!0-9]*) pid= ;; esac
  if [ -n "$pid" ] && grep -q postgres "/proc/$pid/comm" 2>/dev/null; then
    kill -QUIT -"$pid" 2>/dev/null || kill -QUIT "$pid" 2>/dev/null
    i=0
    while [ -d "/proc/$pid" ] && [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ] && [ $i -lt 100 ]; do
      sleep 0.05
      i=$((i+1))
    done
    kill -KILL -"$pid" 2>/dev/null
  fi
fi
rm -rf -- "$2"
"#;

/// A Postgres server for tests. See the [module docs](self) for where it comes from.
#[derive(Debug)]
pub struct PostgresServer {
    source: Source,
    url: String,
    local: Option<Local>,
    _container: Option<super::container::Running>,
}

#[derive(Debug)]
struct Local {
    port: u16,
    fast: bool,
    postgres: PathBuf,
    data_dir: PathBuf,
    log_path: PathBuf,
    run_as: Option<(u32, u32)>,
    /// Extra environment of the server process (a stepped clock).
    env: Vec<(OsString, OsString)>,
    // Declared in drop order: server, then watcher, then directory.
    server: Option<Child>,
    _watcher: Watcher,
    dir: tempfile::TempDir,
}

/// The cleanup watcher of a spawned server (see the module docs).
#[derive(Debug)]
struct Watcher {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Watcher {
    fn spawn(data_dir: &Path, dir: &Path) -> Result<Watcher, HarnessError> {
        let (child, pipe) = super::process::spawn_watcher(
            WATCHER_SCRIPT,
            "lease-postgres-watcher",
            &[data_dir.as_os_str(), dir.as_os_str()],
            "the postgres cleanup watcher",
        )?;
        Ok(Watcher { child, pipe })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // EOF: the watcher cleans up whatever is left and exits; reap it.
        self.pipe.take();
        let _ = self.child.wait();
    }
}

impl PostgresServer {
    /// A server from the first source that works: `LEASE_TEST_POSTGRES_URL`; a
    /// `postgres:15` container (trust authentication) when a Docker engine answers; a
    /// throwaway cluster from the local
    /// binaries (`initdb` and `postgres` on `PATH` or in /usr/lib/postgresql/*/bin) on a
    /// free loopback port, with default durability settings (fsync on). Prints which
    /// source was used to stderr.
    ///
    /// Errors: [`HarnessError::Unavailable`] naming what to install when no source works;
    /// [`HarnessError::Start`] with the server's log when it does not come up.
    pub async fn start() -> Result<PostgresServer, HarnessError> {
        if let Some(url) = env_nonempty(URL_VAR) {
            super::announce(format_args!(
                "lease test server: postgres at {} (from {URL_VAR})",
                redact(&url)
            ));
            return Ok(PostgresServer {
                source: Source::Env,
                url,
                local: None,
                _container: None,
            });
        }
        if let Some(server) = start_container(&[]).await? {
            return Ok(server);
        }
        Self::start_local(false).await
    }

    /// A throwaway local cluster (even when `LEASE_TEST_POSTGRES_URL` is set), for tests
    /// that stop, kill, pause or restart the server. Default durability (fsync on).
    pub async fn start_local_process() -> Result<PostgresServer, HarnessError> {
        Self::start_local(false).await
    }

    /// Like [`PostgresServer::start_local_process`] but with `fsync=off`,
    /// `synchronous_commit=off` and `full_page_writes=off`: faster, and not crash-safe
    /// (a killed server may lose recent commits, including fencing counters).
    pub async fn start_fast() -> Result<PostgresServer, HarnessError> {
        Self::start_local(true).await
    }

    /// A throwaway local cluster (fast, as [`PostgresServer::start_fast`]) whose wall
    /// clock is `clock`: for tests of what a step of the store host's clock does.
    pub async fn start_with_clock(
        clock: &super::clock::SteppedClock,
    ) -> Result<PostgresServer, HarnessError> {
        let env = clock.env();
        let test = super::current_test();
        tokio::task::spawn_blocking(move || super::for_test(test, || start_blocking(true, env)))
            .await
            .map_err(|e| HarnessError::Start(format!("starting postgres: {e}")))?
    }

    /// A fresh database on the test binary's shared server.
    ///
    /// The shared server is started once per process and outlives every test: where a
    /// Docker engine answers it is a container (as [`PostgresServer::start`], with
    /// `fsync=off`, `synchronous_commit=off`, `full_page_writes=off` and 500 connection
    /// slots), removed by its cleanup watcher when the test process exits; elsewhere a
    /// fast local cluster (as [`PostgresServer::start_fast`]), shut down and its
    /// directory removed by its watcher. Under `LEASE_TEST_SOURCE=containers` a container
    /// that does not start is an error. Each call creates a new database `test_<uuid>`,
    /// dropped again when the handle drops, and prints one `lease test server:` line.
    /// Every `#[tokio::test]` may call it, whatever its runtime.
    ///
    /// With `LEASE_TEST_POSTGRES_URL` set, that URL is returned as is (no database is
    /// created): tests then isolate themselves by table name or key.
    pub async fn shared() -> Result<PostgresDatabase, HarnessError> {
        if let Some(url) = env_nonempty(URL_VAR) {
            return Ok(PostgresDatabase {
                url,
                source: Source::Env,
                name: None,
                port: None,
            });
        }
        static SHARED: tokio::sync::OnceCell<Result<PostgresServer, String>> =
            tokio::sync::OnceCell::const_new();
        let server = SHARED
            .get_or_init(|| async {
                let server = match start_container(SHARED_SERVER_FLAGS).await {
                    Ok(Some(server)) => Ok(server),
                    Ok(None) => tokio::task::spawn_blocking(|| start_blocking(true, Vec::new()))
                        .await
                        .map_err(|e| HarnessError::Start(format!("starting postgres: {e}")))
                        .and_then(|r| r),
                    Err(e) => Err(e),
                };
                server
                    .inspect(|server| {
                        super::announce(format_args!(
                            "lease test server: the shared postgres of this test binary is at {}, source: {}",
                            server.url, server.source
                        ));
                    })
                    .map_err(|e| e.to_string())
            })
            .await
            .as_ref()
            .map_err(|e| HarnessError::Start(format!("shared postgres server: {e}")))?;
        let port = server
            .port()
            .or_else(|| server._container.as_ref().map(|c| c.port))
            .ok_or_else(|| HarnessError::Start("the shared postgres server has no port".into()))?;
        let source = server.source;
        let db = tokio::task::spawn_blocking(move || {
            let name = format!("test_{}", uuid::Uuid::new_v4().simple());
            run_sql(port, "postgres", &format!("CREATE DATABASE {name}")).map_err(|e| {
                HarnessError::Start(format!(
                    "creating database {name} on the shared server: {e}"
                ))
            })?;
            Ok::<_, HarnessError>(PostgresDatabase {
                url: local_url(port, &name),
                source,
                name: Some(name),
                port: Some(port),
            })
        })
        .await
        .map_err(|e| HarnessError::Start(format!("shared postgres server: {e}")))??;
        super::announce(format_args!(
            "lease test server: postgres database {} on the shared server, from a {source}",
            db.name.as_deref().unwrap_or_default()
        ));
        Ok(db)
    }

    async fn start_local(fast: bool) -> Result<PostgresServer, HarnessError> {
        let test = super::current_test();
        tokio::task::spawn_blocking(move || {
            super::for_test(test, || start_blocking(fast, Vec::new()))
        })
        .await
        .map_err(|e| HarnessError::Start(format!("starting postgres: {e}")))?
    }

    /// The URL to connect to: `postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable`
    /// for a spawned server (trust authentication, no password).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The URL of database `database` on this server (spawned servers only; for a server
    /// from the environment, the environment's URL).
    pub fn url_for(&self, database: &str) -> String {
        match &self.local {
            Some(l) => local_url(l.port, database),
            None => self.url.clone(),
        }
    }

    /// Creates database `test_<uuid>` on a spawned server and returns its URL.
    pub fn create_database(&self) -> Result<String, HarnessError> {
        let local = self.local("create a database on")?;
        let name = format!("test_{}", uuid::Uuid::new_v4().simple());
        run_sql(local.port, "postgres", &format!("CREATE DATABASE {name}"))
            .map_err(|e| HarnessError::Start(format!("creating database {name}: {e}")))?;
        Ok(local_url(local.port, &name))
    }

    /// Runs SQL (simple query protocol, as the `postgres` superuser over trust
    /// authentication) on database `database` of a spawned server; returns the rows as
    /// text. For test setup and inspection.
    pub fn sql(&self, database: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>, HarnessError> {
        let local = self.local("run SQL on")?;
        run_sql(local.port, database, sql).map_err(HarnessError::Start)
    }

    /// Turns TLS on (spawned servers only) with `certs`' server certificate, key and CA,
    /// and replaces the client authentication rules with `hba` (lines of pg_hba.conf, for
    /// example `hostssl all app 127.0.0.1/32 scram-sha-256`), after two of the harness's
    /// own: `local all all trust` and `host all postgres 127.0.0.1/32 trust` (so that
    /// [`PostgresServer::sql`] keeps working). Reloads the configuration and waits until
    /// TLS is on.
    pub fn enable_tls(&self, certs: &super::TestCerts, hba: &[&str]) -> Result<(), HarnessError> {
        let local = self.local("turn TLS on for")?;
        // The server reads the files as its own user and wants its key private: copy
        // them into the data directory, owned by that user.
        for (from, to) in [
            (&certs.server_cert, "lease-server.crt"),
            (&certs.server_key, "lease-server.key"),
            (&certs.ca, "lease-ca.crt"),
        ] {
            let dest = local.data_dir.join(to);
            std::fs::copy(from, &dest)
                .map_err(|e| HarnessError::io(format!("copying {}", from.display()), e))?;
            std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(|e| HarnessError::io(format!("chmod {}", dest.display()), e))?;
            if let Some((uid, gid)) = local.run_as {
                std::os::unix::fs::chown(&dest, Some(uid), Some(gid))
                    .map_err(|e| HarnessError::io(format!("chown {}", dest.display()), e))?;
            }
        }
        let mut rules = String::from("local all all trust\nhost all postgres 127.0.0.1/32 trust\n");
        for line in hba {
            rules.push_str(line);
            rules.push('\n');
        }
        let hba_path = local.data_dir.join("pg_hba.conf");
        std::fs::write(&hba_path, rules)
            .map_err(|e| HarnessError::io(format!("writing {}", hba_path.display()), e))?;
        for statement in [
            "ALTER SYSTEM SET ssl = on",
            "ALTER SYSTEM SET ssl_cert_file = 'lease-server.crt'",
            "ALTER SYSTEM SET ssl_key_file = 'lease-server.key'",
            "ALTER SYSTEM SET ssl_ca_file = 'lease-ca.crt'",
            "ALTER SYSTEM SET password_encryption = 'scram-sha-256'",
            "SELECT pg_reload_conf()",
        ] {
            run_sql(local.port, "postgres", statement).map_err(HarnessError::Start)?;
        }
        // The reload is asynchronous.
        let by = Instant::now() + Duration::from_secs(10);
        loop {
            let rows = run_sql(local.port, "postgres", "SHOW ssl").map_err(HarnessError::Start)?;
            if rows
                .first()
                .and_then(|r| r.first())
                .cloned()
                .flatten()
                .as_deref()
                == Some("on")
            {
                break;
            }
            if Instant::now() > by {
                return Err(HarnessError::Start(format!(
                    "ssl still off 10 s after the reload; log tail:\n{}",
                    self.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
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

    /// The postmaster's pid while it runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        self.local
            .as_ref()
            .and_then(|l| l.server.as_ref())
            .map(Child::id)
    }

    /// Whether this is a spawned server without fsync ([`PostgresServer::start_fast`]).
    pub fn is_fast(&self) -> bool {
        self.local.as_ref().is_some_and(|l| l.fast)
    }

    /// The temp directory of a spawned server (data directory `data/` inside).
    pub fn dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|l| l.dir.path())
    }

    /// The last lines of a spawned server's log (empty for other sources).
    pub fn log_tail(&self, lines: usize) -> String {
        self.local
            .as_ref()
            .map(|l| tail(&l.log_path, lines))
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

    /// Stops a spawned server gracefully: a fast shutdown (SIGINT to the postmaster, which
    /// ends the sessions and writes a checkpoint; SIGCONT first in case it is paused),
    /// SIGKILL to every server process after 10 s; reaps it. Nothing happens if it is not
    /// running.
    pub async fn stop(&mut self) -> Result<(), HarnessError> {
        let local = self.local_mut("stop")?;
        let Some(pid) = local.running_pid() else {
            return Ok(());
        };
        let _ = local.signal_all(Signal::SIGCONT);
        nix::sys::signal::kill(pid, Signal::SIGINT)
            .map_err(|e| HarnessError::io(format!("sending SIGINT to postgres {pid}"), e.into()))?;
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if local.running_pid().is_none() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        local.kill()
    }

    /// Starts a stopped or killed server again: same binary, port, directory and settings;
    /// returns once it accepts queries (after crash recovery, if it was killed).
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        let local = self.local_mut("restart")?;
        if local.running_pid().is_some() {
            return Err(HarnessError::Start(
                "postgres is still running; stop or kill it first".into(),
            ));
        }
        local.spawn_server()?;
        let port = local.port;
        let log = local.log_path.clone();
        if let Err(why) = wait_ready_async(local).await {
            local.kill()?;
            return Err(HarnessError::Start(format!(
                "restart on port {port}: {why}; log tail:\n{}",
                tail(&log, 20)
            )));
        }
        Ok(())
    }

    /// Kills a spawned server at once, like a crash: SIGKILL to the postmaster and every
    /// server process; reaps the postmaster.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.local_mut("kill")?.kill()
    }

    /// Freezes a spawned server: SIGSTOP to the postmaster and every server process.
    /// Connections stay open; nothing is answered.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.local("pause")?.signal_all(Signal::SIGSTOP)
    }

    /// Continues a paused server (SIGCONT to every server process).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.local("resume")?.signal_all(Signal::SIGCONT)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(local) = &mut self.local {
            // SIGKILL works on a paused process too; then reap. The watcher and the temp
            // dir go right after.
            let _ = local.kill();
        }
    }
}

impl Local {
    /// The postmaster's pid if it is running (reaps it if it exited).
    fn running_pid(&mut self) -> Option<Pid> {
        let child = self.server.as_mut()?;
        match child.try_wait() {
            Ok(None) => i32::try_from(child.id()).ok().map(Pid::from_raw),
            Ok(Some(_)) | Err(_) => {
                self.server = None;
                None
            }
        }
    }

    /// Sends `signal` to the postmaster and every server process it started. (Postgres's
    /// child processes each call `setsid()`, so a signal to the postmaster's process group
    /// would reach the postmaster alone: a "paused" server would go on answering on its
    /// open connections.) To stop, the postmaster goes first, so that it forks nothing
    /// new; to continue, it goes last.
    fn signal_all(&self, signal: Signal) -> Result<(), HarnessError> {
        let pid = self
            .server
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| HarnessError::Start(format!("cannot send {signal}: not running")))?;
        let send = |p: Pid| {
            nix::sys::signal::kill(p, signal).map_err(|e| {
                HarnessError::io(
                    format!("sending {signal} to postgres process {p}"),
                    e.into(),
                )
            })
        };
        if signal == Signal::SIGCONT {
            for child in children_of(pid) {
                let _ = send(child);
            }
            send(pid)
        } else {
            send(pid)?;
            for child in children_of(pid) {
                // A child may have exited meanwhile.
                let _ = send(child);
            }
            Ok(())
        }
    }

    /// SIGKILL the postmaster and every server process, reap the postmaster, remove its
    /// stale pid file.
    fn kill(&mut self) -> Result<(), HarnessError> {
        let Some(mut child) = self.server.take() else {
            return Ok(());
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let pid = Pid::from_raw(pid);
            // Freeze the postmaster first: it forks nothing more, and its children stay
            // its children (findable) until they are killed too.
            // SIGSTOP takes effect asynchronously: until the postmaster is stopped it may
            // still fork a backend (a client reconnecting), which a list taken earlier
            // would miss and which would keep the shared memory attached.
            let _ = nix::sys::signal::kill(pid, Signal::SIGSTOP);
            let stopped_by = Instant::now() + Duration::from_secs(1);
            while process_state(pid) != Some('T') && Instant::now() < stopped_by {
                std::thread::sleep(Duration::from_millis(1));
            }
            let children = children_of(pid);
            let _ = killpg(pid, Signal::SIGKILL);
            for c in &children {
                let _ = nix::sys::signal::kill(*c, Signal::SIGKILL);
            }
            let _ = child.kill();
            child
                .wait()
                .map_err(|e| HarnessError::io("reaping postgres", e))?;
            // SIGKILL is delivered asynchronously too: a server started again before every
            // old process is gone finds their shared memory still attached and refuses to
            // start. A process that exited detached it, even while it is a zombie.
            let gone_by = Instant::now() + Duration::from_secs(5);
            for c in children {
                while !matches!(process_state(c), None | Some('Z' | 'X'))
                    && Instant::now() < gone_by
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        } else {
            let _ = child.kill();
            child
                .wait()
                .map_err(|e| HarnessError::io("reaping postgres", e))?;
        }
        // Stale after a kill; without it the watcher cannot mistake a reused pid for ours.
        let _ = std::fs::remove_file(self.data_dir.join("postmaster.pid"));
        Ok(())
    }

    fn spawn_server(&mut self) -> Result<(), HarnessError> {
        let log = |what: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)
                .map_err(|e| {
                    HarnessError::io(format!("opening {what} log {}", self.log_path.display()), e)
                })
        };
        let mut command = Command::new(&self.postgres);
        command
            .args(server_args(
                &self.data_dir,
                self.dir.path(),
                self.port,
                self.fast,
            ))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log("stdout")?)
            .stderr(log("stderr")?);
        as_user(&mut command, self.run_as);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawning {}", self.postgres.display()), e))?;
        self.server = Some(child);
        Ok(())
    }
}

/// A database on a test server (see [`PostgresServer::shared`]).
#[derive(Debug)]
pub struct PostgresDatabase {
    url: String,
    source: Source,
    name: Option<String>,
    port: Option<u16>,
}

impl PostgresDatabase {
    /// The URL of this database.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Where the server came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The database name, when the harness created it.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The port of the shared local server (`None` for a server from the environment).
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Runs SQL as the superuser on this database (shared local server only).
    pub fn sql(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, HarnessError> {
        match (self.port, &self.name) {
            (Some(port), Some(name)) => run_sql(port, name, sql).map_err(HarnessError::Start),
            _ => Err(HarnessError::NotOwned {
                operation: "run SQL on",
                source: self.source,
            }),
        }
    }
}

impl Drop for PostgresDatabase {
    fn drop(&mut self) {
        if let (Some(port), Some(name)) = (self.port, &self.name) {
            // Ends the sessions still connected (pools closing in the background).
            let _ = run_sql(
                port,
                "postgres",
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            );
        }
    }
}

/// The settings of the shared server (speed over durability, room for parallel tests).
const SHARED_SERVER_FLAGS: &[&str] = &[
    "-c",
    "fsync=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "full_page_writes=off",
    "-c",
    "max_connections=500",
];

/// A `postgres:15` container (trust authentication) started with the server flags
/// `flags`, when the container source is usable: `Ok(None)` when it is not (said once),
/// an error when it is forced (`LEASE_TEST_SOURCE=containers`) and no container started.
async fn start_container(flags: &[&str]) -> Result<Option<PostgresServer>, HarnessError> {
    let spec = super::container::Spec {
        images: &super::engine::POSTGRES_IMAGES,
        port: 5432,
        // The image's first server (initialisation) logs to stdout, the final one to
        // stderr.
        ready: vec![
            ("database system is ready to accept connections", false),
            ("database system is ready to accept connections", true),
        ],
        env: vec![("POSTGRES_HOST_AUTH_METHOD", "trust".to_owned())],
        // Both images run `postgres` with arguments that start with a dash.
        cmd: flags.iter().map(|f| (*f).to_owned()).collect(),
        tmpfs: None,
    };
    let started = super::container::try_start(spec).await;
    if started.is_none() && super::container::forced() {
        return Err(super::container::forced_failure("postgres"));
    }
    Ok(started.map(|c| {
        super::announce(format_args!(
            "lease test server: postgres at {}:{} (container {})",
            c.host, c.port, c.description
        ));
        PostgresServer {
            source: Source::Container,
            url: format!(
                "postgres://postgres@{}:{}/postgres?sslmode=disable",
                c.host, c.port
            ),
            local: None,
            _container: Some(c),
        }
    }))
}

fn local_url(port: u16, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{database}?sslmode=disable")
}

fn server_args(data_dir: &Path, socket_dir: &Path, port: u16, fast: bool) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "-D".into(),
        data_dir.as_os_str().to_owned(),
        "-k".into(),
        socket_dir.as_os_str().to_owned(),
        "-p".into(),
        port.to_string().into(),
    ];
    let mut settings = vec![
        "listen_addresses=127.0.0.1".to_owned(),
        format!("max_connections={MAX_CONNECTIONS}"),
    ];
    if fast {
        settings.extend(
            [
                "fsync=off",
                "synchronous_commit=off",
                "full_page_writes=off",
            ]
            .map(str::to_owned),
        );
    }
    for s in settings {
        args.push("-c".into());
        args.push(s.into());
    }
    args
}

/// The uid and gid of the `postgres` user, read from /etc/passwd.
pub(crate) fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.first() == Some(&"postgres") && fields.len() >= 4 {
            Some((fields[2].parse().ok()?, fields[3].parse().ok()?))
        } else {
            None
        }
    })
}

pub(crate) fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The state letter of a process (`R`, `S`, `T`, `Z`, ...) from `/proc/<pid>/stat`, or
/// `None` if there is no such process.
fn process_state(pid: Pid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next()?.chars().next()
}

/// The processes whose parent is `parent` (from `/proc/<pid>/stat`).
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`; comm may contain spaces and parentheses.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent.as_raw())
        })
        .map(Pid::from_raw)
        .collect()
}

fn as_user(command: &mut Command, run_as: Option<(u32, u32)>) {
    if let Some((uid, gid)) = run_as {
        // As root, std drops the supplementary groups before switching user.
        std::os::unix::process::CommandExt::uid(command, uid);
        std::os::unix::process::CommandExt::gid(command, gid);
        command.env("HOME", "/tmp").env("USER", "postgres");
    }
}

/// initdb + postgres on a free port; blocking.
fn start_blocking(
    fast: bool,
    env: Vec<(OsString, OsString)>,
) -> Result<PostgresServer, HarnessError> {
    let initdb = find_binary("initdb", BIN_DIRS).ok_or_else(|| {
        HarnessError::Unavailable(format!(
            "no initdb on PATH or in {BIN_DIRS:?}: {INSTALL_HINT}"
        ))
    })?;
    // The `postgres` next to initdb, so that both are the same version.
    let postgres = initdb
        .parent()
        .map(|d| d.join("postgres"))
        .filter(|p| p.exists())
        .or_else(|| find_binary("postgres", BIN_DIRS))
        .ok_or_else(|| {
            HarnessError::Unavailable(format!(
                "no postgres binary next to {}: {INSTALL_HINT}",
                initdb.display()
            ))
        })?;
    let run_as = if running_as_root() {
        Some(postgres_user().ok_or_else(|| {
            HarnessError::Unavailable(format!(
                "running as root, and Postgres refuses to run as root, but there is no \
                 `postgres` user to run it as: {INSTALL_HINT}"
            ))
        })?)
    } else {
        None
    };
    let dir = tempfile::Builder::new()
        .prefix("lease-postgres-")
        .tempdir()
        .map_err(|e| HarnessError::io("creating a temp dir for postgres", e))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
            HarnessError::io(format!("chown {} to postgres", dir.path().display()), e)
        })?;
    }
    let data_dir = dir.path().join("data");
    let log_path = dir.path().join("postgres.log");
    // The watcher first, so that even an interrupted start leaves nothing behind.
    let watcher = Watcher::spawn(&data_dir, dir.path())?;

    let started = Instant::now();
    let mut command = Command::new(&initdb);
    command
        .arg("-D")
        .arg(&data_dir)
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::null());
    as_user(&mut command, run_as);
    let out = command
        .output()
        .map_err(|e| HarnessError::io(format!("running {}", initdb.display()), e))?;
    if !out.status.success() {
        return Err(HarnessError::Start(format!(
            "{} failed ({}):\n{}{}",
            initdb.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let initdb_took = started.elapsed();

    let mut local = Local {
        port: 0,
        fast,
        postgres,
        data_dir,
        log_path,
        run_as,
        env,
        server: None,
        _watcher: watcher,
        dir,
    };
    let mut attempts = PortAttempts::new(&["could not bind", "already in use"]);
    while let Some(ports) = attempts.next(1)? {
        local.port = ports[0];
        let _ = std::fs::remove_file(&local.log_path);
        local.spawn_server()?;
        match wait_ready(&mut local) {
            Ok(()) => {
                super::announce(format_args!(
                    "lease test server: postgres at 127.0.0.1:{} (local process {}, pid {}, \
                     dir {}, initdb {:?}, up {:?}{}{})",
                    local.port,
                    local.postgres.display(),
                    local.server.as_ref().map(Child::id).unwrap_or_default(),
                    local.dir.path().display(),
                    initdb_took,
                    started.elapsed(),
                    if fast { ", fsync off" } else { "" },
                    if run_as.is_some() {
                        ", as user postgres"
                    } else {
                        ""
                    },
                ));
                return Ok(PostgresServer {
                    source: Source::LocalProcess,
                    url: local_url(local.port, "postgres"),
                    local: Some(local),
                    _container: None,
                });
            }
            Err(why) => {
                let log = tail(&local.log_path, 20);
                local.kill()?;
                attempts.failed(
                    format!("{} on port {}: {why}", local.postgres.display(), local.port),
                    &log,
                );
            }
        }
    }
    Err(attempts.into_error())
}

/// Polls until the server answers `SELECT 1`, the process exits, or [`READY_TIMEOUT`]
/// passes. Blocking, on the real clock.
fn wait_ready(local: &mut Local) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if local.running_pid().is_none() {
            return Err("the server exited".into());
        }
        match run_sql(local.port, "postgres", "SELECT 1") {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() > READY_TIMEOUT => {
                return Err(format!("not ready within {READY_TIMEOUT:?}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// [`wait_ready`] for async callers: sleeps on tokio between attempts (each attempt is a
/// short blocking exchange on loopback).
async fn wait_ready_async(local: &mut Local) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if local.running_pid().is_none() {
            return Err("the server exited".into());
        }
        match run_sql(local.port, "postgres", "SELECT 1") {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() > READY_TIMEOUT => {
                return Err(format!("not ready within {READY_TIMEOUT:?}: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(no log at {}: {e})", path.display()),
    }
}

use lease_core::redact_url as redact;

/// Runs `sql` with the simple query protocol over TCP on 127.0.0.1:`port` as user
/// `postgres` with trust authentication (the only authentication spawned servers use).
/// Returns the rows of the last result as text; an error carries the server's message.
/// A few dozen lines of the wire protocol, so the harness needs no database driver.
pub(crate) fn run_sql(
    port: u16,
    database: &str,
    sql: &str,
) -> Result<Vec<Vec<Option<String>>>, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| format!("connect: {e}"))?;
    let timeout = Some(Duration::from_secs(30));
    stream
        .set_read_timeout(timeout)
        .and_then(|()| stream.set_write_timeout(timeout))
        .map_err(|e| format!("socket: {e}"))?;

    let mut startup = Vec::new();
    startup.extend_from_slice(&196_608_i32.to_be_bytes()); // protocol 3.0
    for (k, v) in [("user", "postgres"), ("database", database)] {
        startup.extend_from_slice(k.as_bytes());
        startup.push(0);
        startup.extend_from_slice(v.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    let mut msg = frame_len(startup.len() + 4)?.to_vec();
    msg.extend_from_slice(&startup);
    stream.write_all(&msg).map_err(|e| format!("write: {e}"))?;
    read_until_ready(&mut stream)?;

    let mut query = vec![b'Q'];
    query.extend_from_slice(&frame_len(sql.len() + 5)?);
    query.extend_from_slice(sql.as_bytes());
    query.push(0);
    stream
        .write_all(&query)
        .map_err(|e| format!("write: {e}"))?;
    let rows = read_until_ready(&mut stream)?;
    let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
    Ok(rows)
}

fn frame_len(len: usize) -> Result<[u8; 4], String> {
    i32::try_from(len)
        .map(i32::to_be_bytes)
        .map_err(|_| "message too long".to_owned())
}

/// Reads messages until ReadyForQuery; collects data rows; fails on an ErrorResponse
/// (after reading on to ReadyForQuery where the server sends one).
fn read_until_ready(stream: &mut TcpStream) -> Result<Vec<Vec<Option<String>>>, String> {
    let mut rows = Vec::new();
    let mut error = None;
    loop {
        let mut header = [0u8; 5];
        if let Err(e) = stream.read_exact(&mut header) {
            return Err(error.unwrap_or_else(|| format!("read: {e}")));
        }
        let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let len = usize::try_from(len - 4).map_err(|_| "bad message length".to_owned())?;
        let mut body = vec![0u8; len];
        stream
            .read_exact(&mut body)
            .map_err(|e| format!("read: {e}"))?;
        match header[0] {
            b'R' => {
                let code = body
                    .get(..4)
                    .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                if code != Some(0) {
                    return Err(format!(
                        "the server asks for authentication (code {code:?}); the harness only \
                         speaks trust authentication"
                    ));
                }
            }
            b'E' => error = Some(error_text(&body)),
            b'D' => rows.push(data_row(&body)?),
            b'T' => rows.clear(),
            b'Z' => {
                return match error {
                    Some(e) => Err(e),
                    None => Ok(rows),
                };
            }
            _ => {}
        }
    }
}

fn error_text(body: &[u8]) -> String {
    let mut code = String::new();
    let mut message = String::new();
    for field in body.split(|b| *b == 0) {
        match field.split_first() {
            Some((b'C', rest)) => code = String::from_utf8_lossy(rest).into_owned(),
            Some((b'M', rest)) => message = String::from_utf8_lossy(rest).into_owned(),
            _ => {}
        }
    }
    format!("{message} (SQLSTATE {code})")
}

fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, String> {
    let bad = || "malformed data row".to_owned();
    let count = body.get(..2).ok_or_else(bad)?;
    let count = u16::from_be_bytes([count[0], count[1]]);
    let mut at = 2;
    let mut row = Vec::new();
    for _ in 0..count {
        let len = body.get(at..at + 4).ok_or_else(bad)?;
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        if len < 0 {
            row.push(None);
        } else {
            let len = usize::try_from(len).map_err(|_| bad())?;
            let value = body.get(at..at + len).ok_or_else(bad)?;
            row.push(Some(String::from_utf8_lossy(value).into_owned()));
            at += len;
        }
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_of_a_fast_server() {
        let args = server_args(Path::new("/d/data"), Path::new("/d"), 5555, true);
        let text: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(text.windows(2).any(|w| w == ["-c", "fsync=off"]));
        assert!(text.windows(2).any(|w| w == ["-p", "5555"]));
    }
}
