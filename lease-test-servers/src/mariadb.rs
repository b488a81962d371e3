//! MariaDB test servers (the MySQL protocol): a server from `LEASE_TEST_MYSQL_URL`, a
//! `mariadb:10.11` container (or the project's own `lease-test/mariadb:10.11`, built by
//! `scripts/build-test-images.sh`) when a Docker engine answers, or a throwaway local
//! `mariadbd` from Debian's `mariadb-server`.
//!
//! A spawned server gets a fresh data directory (`mariadb-install-db`), listens on
//! 127.0.0.1 on a free port, and lets `root` in from any address without a password (an
//! init file grants it); its durability settings are the defaults
//! (`innodb_flush_log_at_trx_commit=1`). SQL from the harness goes through the `mariadb`
//! command-line client.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::process::{ChildProcess, DirWatcher};
use super::{HarnessError, PortAttempts, Source, env_nonempty, find_binary};

/// Environment variable with the URL of a MySQL or MariaDB server to use instead of
/// starting one (`mysql://user:password@host:port/database`).
pub const URL_VAR: &str = "LEASE_TEST_MYSQL_URL";

const INSTALL_HINT: &str = "install the Debian package `mariadb-server` \
    (apt-get install mariadb-server) or set LEASE_TEST_MYSQL_URL=mysql://user:password@host:port/database";

const DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"];

/// How long a spawned server may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A MariaDB server for tests.
#[derive(Debug)]
pub struct MariaDbServer {
    source: Source,
    url: String,
    /// Where the harness sends its own SQL (spawned servers and containers).
    admin: Option<Admin>,
    local: Option<Local>,
    _container: Option<super::container::Running>,
}

/// The command-line client and the address it reaches the server at, as `root`.
#[derive(Clone, Debug)]
struct Admin {
    client: PathBuf,
    host: String,
    port: u16,
}

impl Admin {
    fn sql(&self, sql: &str) -> Result<Vec<String>, String> {
        run_sql(&self.client, &self.host, self.port, sql)
    }
}

#[derive(Debug)]
struct Local {
    // Declared in drop order: the process, its watcher, then its directory.
    process: ChildProcess,
    _watcher: DirWatcher,
    _dir: tempfile::TempDir,
}

impl MariaDbServer {
    /// A server from the first source that works: `LEASE_TEST_MYSQL_URL`; a container
    /// when a Docker engine answers (default durability settings); a throwaway local
    /// `mariadbd` (default durability settings).
    pub async fn start() -> Result<MariaDbServer, HarnessError> {
        if let Some(url) = env_nonempty(URL_VAR) {
            super::announce(format_args!(
                "lease test server: mysql at {} (from {URL_VAR})",
                lease_core::redact_url(&url)
            ));
            return Ok(MariaDbServer {
                source: Source::Env,
                url,
                admin: None,
                local: None,
                _container: None,
            });
        }
        if let Some(server) = start_container(false).await? {
            return Ok(server);
        }
        Self::start_local().await
    }

    /// Always a throwaway local `mariadbd` with the default durability settings, for
    /// tests that stop, kill or restart it.
    pub async fn start_local() -> Result<MariaDbServer, HarnessError> {
        Self::start_local_with(false, Vec::new()).await
    }

    /// Like [`MariaDbServer::start_local`], but with `innodb_flush_log_at_trx_commit=0`
    /// and `innodb_doublewrite=0`: faster, and not crash-safe (a killed server may lose
    /// its last second of commits, fencing counters included).
    pub async fn start_fast() -> Result<MariaDbServer, HarnessError> {
        Self::start_local_with(true, Vec::new()).await
    }

    /// A throwaway local `mariadbd` with the default durability settings and the server
    /// options `options` added (`--log-bin=binlog`, `--server-id=2`, ...), for tests of
    /// settings such as replication.
    pub async fn start_with_options(options: &[&str]) -> Result<MariaDbServer, HarnessError> {
        let extra: Vec<OsString> = options.iter().map(OsString::from).collect();
        Self::start_local_with(false, extra).await
    }

    /// A throwaway local `mariadbd` (settings of [`MariaDbServer::start_fast`]) that also
    /// accepts TLS, with `certs`' server certificate (`IP:127.0.0.1`) and its CA for
    /// client certificates. Plain connections stay allowed (the harness's own client
    /// uses them); make a user need TLS with `REQUIRE SSL`, `REQUIRE X509` or
    /// `REQUIRE SUBJECT`.
    pub async fn start_tls(certs: &super::TestCerts) -> Result<MariaDbServer, HarnessError> {
        let extra = vec![
            format!("--ssl-ca={}", certs.ca.display()).into(),
            format!("--ssl-cert={}", certs.server_cert.display()).into(),
            format!("--ssl-key={}", certs.server_key.display()).into(),
        ];
        Self::start_local_with(true, extra).await
    }

    /// A throwaway local `mariadbd` (fast: the settings of [`MariaDbServer::start_fast`])
    /// with the server options `extra` added.
    async fn start_local_with(
        fast: bool,
        extra: Vec<OsString>,
    ) -> Result<MariaDbServer, HarnessError> {
        let test = super::current_test();
        tokio::task::spawn_blocking(move || super::for_test(test, || start_blocking(fast, extra)))
            .await
            .map_err(|e| HarnessError::Start(format!("starting mariadbd: {e}")))?
    }

    /// The URL of database `lease` as `root`:
    /// `mysql://root@127.0.0.1:PORT/lease` for a spawned server.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Where the server came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The port of a spawned server.
    pub fn port(&self) -> Option<u16> {
        self.local.as_ref().and(self.admin.as_ref()).map(|a| a.port)
    }

    /// Runs `sql` as `root` (a spawned server or a container) and returns its output
    /// rows, tab-separated, without a header.
    pub fn sql(&self, sql: &str) -> Result<Vec<String>, HarnessError> {
        let admin = self.admin.as_ref().ok_or(HarnessError::NotOwned {
            operation: "run SQL on",
            source: self.source,
        })?;
        admin.sql(sql).map_err(HarnessError::Start)
    }

    /// The pid of a spawned server while it runs (or is paused).
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.process.pid())
    }

    /// Whether the harness started (and so controls) the server.
    pub fn owns_process(&self) -> bool {
        self.local.is_some()
    }

    /// Stops the server (SIGTERM, then SIGKILL after 10 s); [`MariaDbServer::start_again`]
    /// restarts it on the same port and data.
    pub async fn stop(&mut self) -> Result<(), HarnessError> {
        let source = self.source;
        let local = self.local.as_mut().ok_or(HarnessError::NotOwned {
            operation: "stop",
            source,
        })?;
        local.process.terminate(Duration::from_secs(10)).await
    }

    /// SIGKILLs the server (a crash); [`MariaDbServer::start_again`] restarts it on the
    /// same port and data.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        let local = self.local.as_mut().ok_or(HarnessError::NotOwned {
            operation: "kill",
            source: self.source,
        })?;
        local.process.kill()
    }

    /// Starts a killed server again and waits until it answers.
    pub async fn start_again(&mut self) -> Result<(), HarnessError> {
        let source = self.source;
        let local = self.local.as_mut().ok_or(HarnessError::NotOwned {
            operation: "start again",
            source,
        })?;
        local.process.respawn()?;
        let admin = self.admin.clone().ok_or(HarnessError::NotOwned {
            operation: "start again",
            source,
        })?;
        let ready = tokio::task::spawn_blocking(move || wait_ready(&admin))
            .await
            .map_err(|e| HarnessError::Start(format!("waiting for mariadbd: {e}")))?;
        ready.map_err(|why| {
            HarnessError::Start(format!(
                "mariadbd did not come back: {why}; log tail:\n{}",
                local.process.log_tail(20)
            ))
        })
    }

    /// A fresh database on the test binary's shared server, dropped again when the handle
    /// drops. The server is started once per process, with the settings of
    /// [`MariaDbServer::start_fast`]: a container when a Docker engine answers, else a
    /// local process; it is removed when the process exits. With `LEASE_TEST_MYSQL_URL`
    /// set, that URL is returned as is.
    pub async fn shared() -> Result<MariaDbDatabase, HarnessError> {
        if let Some(url) = env_nonempty(URL_VAR) {
            return Ok(MariaDbDatabase {
                url,
                source: Source::Env,
                name: None,
                admin: None,
            });
        }
        static SHARED: tokio::sync::OnceCell<Result<MariaDbServer, String>> =
            tokio::sync::OnceCell::const_new();
        let server = SHARED
            .get_or_init(|| async {
                match start_container(true).await {
                    Ok(Some(server)) => Ok(server),
                    Ok(None) => Self::start_fast().await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await
            .as_ref()
            .map_err(|e| HarnessError::Start(format!("shared mariadb server: {e}")))?;
        let admin = server.admin.clone().ok_or_else(|| {
            HarnessError::Start("the shared mariadb server takes no SQL from the harness".into())
        })?;
        let name = format!("test_{}", uuid::Uuid::new_v4().simple());
        let create = format!("CREATE DATABASE {name}");
        let a = admin.clone();
        tokio::task::spawn_blocking(move || a.sql(&create))
            .await
            .map_err(|e| HarnessError::Start(format!("creating a database: {e}")))?
            .map_err(HarnessError::Start)?;
        let source = server.source;
        super::announce(format_args!(
            "lease test server: mysql database {name} on the shared mariadb server, from a {source}"
        ));
        Ok(MariaDbDatabase {
            url: format!("mysql://root@{}:{}/{name}", admin.host, admin.port),
            source,
            name: Some(name),
            admin: Some(admin),
        })
    }
}

/// A database on a test server (see [`MariaDbServer::shared`]).
#[derive(Debug)]
pub struct MariaDbDatabase {
    url: String,
    source: Source,
    name: Option<String>,
    admin: Option<Admin>,
}

impl MariaDbDatabase {
    /// The URL of this database (as `root`).
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

    /// Runs `sql` as `root` in this database (shared local server only); rows
    /// tab-separated.
    pub fn sql(&self, sql: &str) -> Result<Vec<String>, HarnessError> {
        match (&self.admin, &self.name) {
            (Some(admin), Some(name)) => admin
                .sql(&format!("USE {name}; {sql}"))
                .map_err(HarnessError::Start),
            _ => Err(HarnessError::NotOwned {
                operation: "run SQL on",
                source: self.source,
            }),
        }
    }
}

impl Drop for MariaDbDatabase {
    fn drop(&mut self) {
        if let (Some(admin), Some(name)) = (&self.admin, &self.name) {
            let _ = admin.sql(&format!("DROP DATABASE IF EXISTS {name}"));
        }
    }
}

fn start_blocking(fast: bool, extra: Vec<OsString>) -> Result<MariaDbServer, HarnessError> {
    let missing = |what: &str| {
        HarnessError::Unavailable(format!(
            "no {what} on PATH or in {}: {INSTALL_HINT}",
            DIRS.join(", ")
        ))
    };
    let server = find_binary("mariadbd", DIRS)
        .or_else(|| find_binary("mysqld", DIRS))
        .ok_or_else(|| missing("mariadbd"))?;
    let install = find_binary("mariadb-install-db", DIRS)
        .or_else(|| find_binary("mysql_install_db", DIRS))
        .ok_or_else(|| missing("mariadb-install-db"))?;
    let client = find_binary("mariadb", DIRS)
        .or_else(|| find_binary("mysql", DIRS))
        .ok_or_else(|| missing("mariadb (the client)"))?;
    let dir = tempfile::Builder::new()
        .prefix("lease-mariadb-")
        .tempdir()
        .map_err(|e| HarnessError::io("creating a temp dir for mariadbd", e))?;
    let watcher = DirWatcher::spawn(dir.path())?;
    let data = dir.path().join("data");
    let as_root = nix::unistd::Uid::effective().is_root();
    let started = Instant::now();
    // A temp dir of its own: the bootstrap names its temporary tables after its thread
    // ids, so two bootstraps sharing /tmp at once removed each other's files ("Could not
    // remove temporary table", then "Unknown table 'mysql.tmp_user_sys'").
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp)
        .map_err(|e| HarnessError::io("creating the mariadbd tmpdir", e))?;
    let mut init = Command::new(&install);
    init.arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
    if as_root {
        init.arg("--user=root");
    }
    let out = init
        .output()
        .map_err(|e| HarnessError::io(format!("running {}", install.display()), e))?;
    if !out.status.success() {
        return Err(HarnessError::Start(format!(
            "{} failed: {}{}",
            install.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let initialised = started.elapsed();
    let init_file = dir.path().join("init.sql");
    std::fs::write(
        &init_file,
        "CREATE USER IF NOT EXISTS 'root'@'%';\n\
         GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;\n\
         CREATE DATABASE IF NOT EXISTS lease;\n",
    )
    .map_err(|e| HarnessError::io("writing the init file", e))?;
    let log_path = dir.path().join("mariadbd.log");
    let mut attempts = PortAttempts::new(&["Address already in use", "Can't start server"]);
    while let Some(ports) = attempts.next(1)? {
        let port = ports[0];
        let mut args = server_args(dir.path(), &data, &init_file, port, as_root, fast);
        args.extend(extra.iter().cloned());
        let mut process = ChildProcess::spawn(server.clone(), args, log_path.clone())?;
        let admin = Admin {
            client: client.clone(),
            host: "127.0.0.1".into(),
            port,
        };
        match wait_ready(&admin) {
            Ok(()) => {
                super::announce(format_args!(
                    "lease test server: mariadb at 127.0.0.1:{port} (local process {}, pid {}, \
                     dir {}, install {initialised:?}, up {:?}{})",
                    server.display(),
                    process.pid().unwrap_or_default(),
                    dir.path().display(),
                    started.elapsed(),
                    if fast { ", fast: not crash-safe" } else { "" }
                ));
                return Ok(MariaDbServer {
                    source: Source::LocalProcess,
                    url: format!("mysql://root@127.0.0.1:{port}/lease"),
                    admin: Some(admin),
                    local: Some(Local {
                        process,
                        _watcher: watcher,
                        _dir: dir,
                    }),
                    _container: None,
                });
            }
            Err(why) => {
                let tail = process.log_tail(20);
                process.kill()?;
                attempts.failed(format!("{} on port {port}: {why}", server.display()), &tail);
            }
        }
    }
    Err(attempts.into_error())
}

fn server_args(
    dir: &Path,
    data: &Path,
    init: &Path,
    port: u16,
    as_root: bool,
    fast: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--no-defaults".into(),
        format!("--datadir={}", data.display()).into(),
        format!("--tmpdir={}", dir.join("tmp").display()).into(),
        format!("--port={port}").into(),
        "--bind-address=127.0.0.1".into(),
        format!("--socket={}", dir.join("mariadbd.sock").display()).into(),
        format!("--pid-file={}", dir.join("mariadbd.pid").display()).into(),
        format!("--init-file={}", init.display()).into(),
        "--skip-name-resolve".into(),
        "--max-connections=500".into(),
        "--innodb-buffer-pool-size=64M".into(),
        "--innodb-log-file-size=16M".into(),
    ];
    if as_root {
        args.push("--user=root".into());
    }
    if fast {
        args.push("--innodb-flush-log-at-trx-commit=0".into());
        args.push("--innodb-doublewrite=0".into());
    }
    args
}

fn wait_ready(admin: &Admin) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match admin.sql("SELECT 1") {
            Ok(_) => return Ok(()),
            Err(why) if start.elapsed() > READY_TIMEOUT => {
                return Err(format!("not answering within {READY_TIMEOUT:?}: {why}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// `sql` through the command-line client as `root` over TCP; output rows without a
/// header, tab-separated.
fn run_sql(client: &Path, host: &str, port: u16, sql: &str) -> Result<Vec<String>, String> {
    let out = Command::new(client)
        .args([
            "--no-defaults",
            "--protocol=tcp",
            "-h",
            host,
            "-P",
            &port.to_string(),
            "-u",
            "root",
            "--connect-timeout=2",
            "-N",
            "-B",
            "-e",
            sql,
        ])
        .output()
        .map_err(|e| format!("running {}: {e}", client.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The settings a container's server runs with: the defaults, or with `fast` those of
/// [`MariaDbServer::start_fast`]; room for parallel tests either way.
pub(crate) fn container_flags(fast: bool) -> Vec<String> {
    let mut flags = vec!["--max-connections=500".to_owned()];
    if fast {
        flags.push("--innodb-flush-log-at-trx-commit=0".to_owned());
        flags.push("--innodb-doublewrite=0".to_owned());
    }
    flags
}

/// A MariaDB container, when the container source is usable: `Ok(None)` when it is not
/// (said once) or when no command-line client is installed to reach it (the harness
/// creates databases and users through it); an error when the source is forced
/// (`LEASE_TEST_SOURCE=containers`) and no container started.
async fn start_container(fast: bool) -> Result<Option<MariaDbServer>, HarnessError> {
    let Some(client) = find_binary("mariadb", DIRS).or_else(|| find_binary("mysql", DIRS)) else {
        if super::container::forced() {
            return Err(HarnessError::Unavailable(format!(
                "LEASE_TEST_SOURCE=containers, and no mariadb command-line client to reach a \
                 container with: {INSTALL_HINT}"
            )));
        }
        return Ok(None);
    };
    let spec = super::container::Spec {
        images: &super::engine::MARIADB_IMAGES,
        port: 3306,
        // The official image's first server (initialisation) listens on no port
        // ("port: 0"); the final one, like the project's image, names 3306.
        ready: vec![("port: 3306", true)],
        env: CONTAINER_ENV
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect(),
        // Both images pass arguments that start with a dash to the server.
        cmd: container_flags(fast),
        tmpfs: None,
    };
    let started = super::container::try_start(spec).await;
    if started.is_none() && super::container::forced() {
        return Err(super::container::forced_failure("mariadb"));
    }
    let Some(c) = started else {
        return Ok(None);
    };
    let admin = Admin {
        client,
        host: c.host.clone(),
        port: c.port,
    };
    let a = admin.clone();
    tokio::task::spawn_blocking(move || wait_ready(&a))
        .await
        .map_err(|e| HarnessError::Start(format!("waiting for the mariadb container: {e}")))?
        .map_err(|why| {
            HarnessError::Start(format!("the mariadb container {}: {why}", c.description))
        })?;
    super::announce(format_args!(
        "lease test server: mariadb at {}:{} (container {}{})",
        c.host,
        c.port,
        c.description,
        if fast { ", fast: not crash-safe" } else { "" }
    ));
    Ok(Some(MariaDbServer {
        source: Source::Container,
        url: format!("mysql://root@{}:{}/lease", c.host, c.port),
        admin: Some(admin),
        local: None,
        _container: Some(c),
    }))
}

/// The environment of a container: what the official image needs for the server the
/// project's image makes (`root` without a password, from any address; database `lease`).
pub(crate) const CONTAINER_ENV: &[(&str, &str)] = &[
    ("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD", "1"),
    ("MARIADB_DATABASE", "lease"),
];

/// Whether a server answers as `root` on 127.0.0.1:`port` (false without a client).
pub(crate) fn answers(port: u16) -> bool {
    let Some(client) = find_binary("mariadb", DIRS).or_else(|| find_binary("mysql", DIRS)) else {
        return false;
    };
    run_sql(&client, "127.0.0.1", port, "SELECT 1").is_ok()
}
