//! `lease`: run a command on one host at a time, like `flock(1)` across machines.
//!
//! See `lease --help` and the README for exit codes and examples.

mod cron;
#[cfg(unix)]
mod exec;
#[cfg(unix)]
mod supervise;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold::{Error, LeaseBackend, LeaseClient, LeaseName, Semaphore};

/// Exit code: the lease is held elsewhere and the command did not run (like `flock -n`).
#[cfg_attr(not(unix), allow(dead_code))]
const EXIT_HELD: u8 = 75;
/// Exit code: the lease was lost while the command ran; the command was terminated.
#[cfg_attr(not(unix), allow(dead_code))]
const EXIT_LOST: u8 = 76;
/// Exit code: bad usage: arguments, durations, a malformed or unknown store URL, a store
/// not compiled in.
const EXIT_USAGE: u8 = 64;
/// Exit code: the store failed (unreachable, timed out, refused, unexpected reply).
const EXIT_STORE: u8 = 69;
/// Exit code: the store refused the credentials (wrong user or password, none given).
const EXIT_AUTH: u8 = 77;
/// Exit code: TLS could not be set up (a certificate or key file, the server's
/// certificate failing verification, a client certificate required).
const EXIT_TLS: u8 = 78;
/// Exit code: the command could not be started (not found or not executable).
#[cfg_attr(not(unix), allow(dead_code))]
const EXIT_SPAWN: u8 = 127;

const AFTER_HELP: &str = "\
Exit codes:
  the command's own code   it ran (128+N if it was killed by signal N)
  75                       the lease is held elsewhere; the command did not run
  76                       the lease was lost while the command ran; it was terminated
  64                       usage error: arguments, durations, malformed or unknown URL,
                           store not compiled in
  69                       store error: unreachable, timed out, refused
  77                       the store refused the credentials (user, password)
  78                       TLS failed: a certificate or key file, the server's certificate
                           (unknown CA, wrong host name), a client certificate required
  127                      the command could not be started

Examples:
  # nightly report on one host only (cron on every host):
  0 2 * * *  lease --backend redis://lease-redis:6379 exec --ttl 30s --keep-for 50m nightly-report -- ./report.sh
  # wait up to 10 minutes for a deploy step held by another host:
  lease exec --wait 10m deploy-db-migrations -- ./migrate.sh
  lease status nightly-report --json
  lease release --force nightly-report
  # at most 3 copies at once across hosts (a semaphore), waiting for a permit:
  lease exec --permits 3 --wait 1h thumbnails -- ./thumbnails.sh
  lease status --permits 3 thumbnails
  # over TLS, with a client certificate (mutual TLS):
  lease --backend etcds://etcd-1:2379/app --tls-ca ca.pem --tls-cert me.pem --tls-key me.key status job";

/// Run commands under a distributed lease: on one host at a time, across machines.
#[derive(Debug, Parser)]
#[command(name = "lease", version, after_help = AFTER_HELP)]
struct Cli {
    /// Store URL: redis://, rediss://, redis+sentinel://, redis+cluster://, postgres://,
    /// etcd://, etcds://, mysql://, or memory:// to try it out. Credentials go in the URL
    /// (user:password@, with / ? # @ : percent-encoded); PostgreSQL also reads PGPASSWORD
    /// and ~/.pgpass.
    #[arg(long, env = "LEASE_BACKEND", global = true, hide_env_values = true)]
    backend: Option<String>,
    /// CA bundle (PEM) to verify the store's certificate with (default: the system's).
    #[arg(long, env = "LEASE_TLS_CA", global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, env = "LEASE_TLS_CERT", global = true, value_name = "FILE")]
    tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of the client certificate.
    #[arg(long, env = "LEASE_TLS_KEY", global = true, value_name = "FILE")]
    tls_key: Option<std::path::PathBuf>,
    /// More logs on stderr (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Acquire NAME, run CMD while renewing, release when it exits.
    ///
    /// The command gets LEASE_NAME, LEASE_FENCING_TOKEN and LEASE_HOLDER in its
    /// environment. It runs in a process group of its own, which is signalled as a whole
    /// (on Linux also what leaves the group, e.g. by setsid: it stays in the process tree
    /// below `lease`): SIGINT, SIGTERM, SIGTSTP and SIGCONT are forwarded to it; if the
    /// lease is lost, it gets SIGTERM, then SIGKILL after --grace, and `lease` exits with
    /// 76; if `lease` itself is killed (even with SIGKILL), the group is killed with it.
    /// What the command leaves running when it exits is terminated before the lease is
    /// released. Unix only.
    Exec(ExecArgs),
    /// Run CMD on a cron schedule on every host, each firing on one host only.
    ///
    /// Start it on every host (as a service). At each firing every host tries the
    /// firing's lease; the one that gets it runs CMD, the others skip that firing, also
    /// those whose clocks are up to --max-skew apart or that come up to --start-window
    /// late. A firing that comes while the previous run still goes on is skipped. CMD
    /// gets LEASE_NAME, LEASE_FENCING_TOKEN and LEASE_FIRING (the firing's instant in
    /// Unix seconds); it is killed if the lease is lost. SIGINT or SIGTERM stops it
    /// (letting a run finish within --shutdown-grace); the exit code is then 0.
    Cron(CronArgs),
    /// Show holder, fencing token and remaining TTL of leases.
    Status {
        /// Lease names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Print JSON (one object per name).
        #[arg(long)]
        json: bool,
        /// The names are semaphores of N permits (as `exec --permits N`): show the
        /// permits held.
        #[arg(long, value_name = "N")]
        permits: Option<u32>,
    },
    /// Free a lease whoever holds it (an operator's manual release).
    Release {
        /// Required: this takes the lease away from its holder.
        #[arg(long)]
        force: bool,
        /// Lease name.
        name: String,
    },
    /// Internal: runs the command of `lease exec` in its process group (see
    /// `supervise.rs`).
    #[command(name = "__supervise", hide = true)]
    #[cfg_attr(not(unix), allow(dead_code))]
    Supervise {
        /// Pid of the `lease exec` process.
        #[arg(long)]
        parent: i32,
        /// Time between SIGTERM and SIGKILL for processes the command leaves behind.
        #[arg(long, value_parser = parse_duration)]
        grace: Duration,
        /// Make the command's process group the terminal's foreground group.
        #[arg(long)]
        foreground: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Debug, Args)]
#[cfg_attr(not(unix), allow(dead_code))]
struct ExecArgs {
    /// Lease TTL (lockAtMostFor): how long a crashed holder blocks others.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// How long to wait if the lease is held (0s: do not wait; exit 75).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    wait: Duration,
    /// Keep the lease this long after acquisition even if CMD ends sooner (lockAtLeastFor).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    keep_for: Duration,
    /// After a lost lease, time between SIGTERM and SIGKILL to the command (default: half
    /// the safety margin, TTL/20: the loss is reported a safety margin, TTL/10, before the
    /// store can give the lease to another host, so the command is killed half a margin
    /// before that, with the other half left for a late timer and the kill itself).
    #[arg(long, value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Holder label stored with the lease (default hostname:pid).
    #[arg(long)]
    label: Option<String>,
    /// Run at most N copies at once across hosts: NAME is a semaphore of N permits, and
    /// the command runs while holding one (every host must give the same N). The command
    /// also gets LEASE_PERMIT, its permit's slot (0 to N-1), and LEASE_PERMIT_NAME, the
    /// slot's lease (NAME/permit/SLOT), whose fencing token LEASE_FENCING_TOKEN is.
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Lease name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct CronArgs {
    /// Cron expression: five fields (minute hour day-of-month month day-of-week) or six
    /// with seconds first, as Spring's @Scheduled(cron) writes them ("0 * * * * *": every
    /// minute at second 0).
    schedule: String,
    /// Lease name (the firings' leases are NAME#n).
    name: String,
    /// Time zone the expression is read in (an IANA name).
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// Lease TTL (lockAtMostFor): how long a crashed run blocks the next firings.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// The largest difference between two hosts' clocks.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    max_skew: Duration,
    /// How late after a firing a host still tries it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    start_window: Duration,
    /// On SIGINT or SIGTERM, how long a run in progress may go on before it is killed.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// A firing that no host ran (every host down): `skip` it, or `run-once` late, on
    /// the first host to start, if the next firing is not near.
    #[arg(long, default_value = "skip", value_parser = ["skip", "run-once"])]
    missed: String,
    /// Holder label stored with the lease (default hostname:pid).
    #[arg(long)]
    label: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 30s, 5m, 1h30m)"))
}

/// A failure that ends the program with a one-line message and an exit code.
struct Fail {
    code: u8,
    message: String,
}

impl Fail {
    fn usage(message: impl Into<String>) -> Self {
        Fail {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidInput(_) | Error::NotCompiledIn { .. } | Error::Unsupported { .. } => {
                EXIT_USAGE
            }
            Error::StillHeld { .. } => EXIT_HELD,
            Error::Auth { .. } => EXIT_AUTH,
            Error::Tls { .. } => EXIT_TLS,
            _ => EXIT_STORE,
        };
        Fail {
            code,
            message: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_filter(cli.verbose))),
        )
        .with_writer(std::io::stderr)
        .init();
    #[cfg(unix)]
    if let Cmd::Supervise {
        parent,
        grace,
        foreground,
        command,
    } = &cli.command
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        return match runtime {
            Ok(rt) => {
                ExitCode::from(rt.block_on(supervise::run(*parent, *grace, *foreground, command)))
            }
            Err(e) => {
                eprintln!("lease: cannot start the runtime: {e}");
                ExitCode::from(EXIT_STORE)
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_STORE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(fail) => {
            eprintln!("lease: {}", fail.message);
            ExitCode::from(fail.code)
        }
    }
}

/// The log filter for `-v` counts: by default only this project's warnings (renewal
/// failures, lost leases); the store clients' own warnings (e.g. sqlx's slow-statement
/// warning, which prints the whole SQL statement) from `-v` on.
///
/// One directive covers every crate of the project: a directive's target matches every
/// target it is a prefix of, so `lease` covers `lease_core`, every backend
/// (`lease_redis`, `lease_postgres`, `lease_etcd`, `lease_mysql`, any added later) and
/// `lease_cli`. (A list of crate names had to be kept up to date by hand; the unit test
/// below checks every crate the facade depends on.)
fn log_filter(verbose: u8) -> String {
    let (own, others) = match verbose {
        0 => ("warn", "off"),
        1 => ("info", "warn"),
        2 => ("debug", "debug"),
        _ => ("trace", "trace"),
    };
    format!("{others},lease={own}")
}

/// Where and how to connect: the store URL and the TLS files.
struct Store {
    url: String,
    options: leasehold::ConnectOptions,
}

impl Store {
    async fn connect(&self) -> Result<Arc<dyn LeaseBackend>, Fail> {
        Ok(leasehold::connect_with(&self.url, &self.options).await?)
    }
}

async fn run(cli: Cli) -> Result<u8, Fail> {
    let Some(url) = cli.backend else {
        return Err(Fail::usage(
            "no store given: use --backend URL or set LEASE_BACKEND",
        ));
    };
    let tls = leasehold::TlsFiles {
        ca: cli.tls_ca,
        cert: cli.tls_cert,
        key: cli.tls_key,
    };
    let store = Store {
        url,
        options: leasehold::ConnectOptions::default().with_tls(tls),
    };
    match cli.command {
        #[cfg(unix)]
        Cmd::Exec(args) => exec::exec(&store, args).await,
        // Without process groups and signals nothing could stop the command when the
        // lease is lost, so it is not run at all.
        #[cfg(not(unix))]
        Cmd::Exec(args) => Err(Fail::usage(format!(
            "lease exec {} is not supported on this system: it needs Unix process groups \
             and signals to stop the command if the lease is lost (status and release work)",
            args.name
        ))),
        Cmd::Cron(args) => cron::cron(&store, args).await,
        Cmd::Status {
            names,
            json,
            permits: None,
        } => status(&store, &names, json).await,
        Cmd::Status {
            names,
            json,
            permits: Some(n),
        } => status_permits(&store, &names, n, json).await,
        Cmd::Supervise { .. } => Err(Fail::usage("__supervise is internal to lease exec")),
        Cmd::Release { force, name } => {
            if !force {
                return Err(Fail::usage(format!(
                    "refusing to release {name} without --force: it takes the lease away from its holder"
                )));
            }
            let name = LeaseName::new(&name).map_err(Error::from)?;
            let backend = store.connect().await?;
            let freed = bounded(backend.force_release(&name)).await?;
            if freed {
                println!("released {name}");
            } else {
                println!("{name} was not held");
            }
            Ok(0)
        }
    }
}

async fn bounded<T>(
    fut: impl std::future::Future<Output = leasehold::Result<T>>,
) -> leasehold::Result<T> {
    let limit = Duration::from_secs(10);
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or(Err(Error::Timeout {
            operation: "store call",
            after: limit,
        }))
}

async fn status(store: &Store, names: &[String], json: bool) -> Result<u8, Fail> {
    let names: Vec<LeaseName> = names
        .iter()
        .map(LeaseName::new)
        .collect::<Result<_, _>>()
        .map_err(Error::from)?;
    let backend = store.connect().await?;
    for name in &names {
        let info = bounded(backend.inspect(name)).await?;
        if json {
            let v = match &info {
                Some(i) => serde_json::json!({
                    "name": name.to_string_lossy(),
                    "held": true,
                    "holder": i.holder,
                    "fencing_token": i.fencing.map(|f| f.get()),
                    "remaining_ms": i.remaining.map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
                }),
                None => serde_json::json!({ "name": name.to_string_lossy(), "held": false }),
            };
            println!("{v}");
        } else {
            match info {
                Some(i) => println!(
                    "{name}: held by {} (fencing token {}, {} left)",
                    i.holder.as_deref().unwrap_or("unknown"),
                    i.fencing.map_or("-".into(), |f| f.to_string()),
                    i.remaining.map_or("no ttl".into(), |r| {
                        humantime::format_duration(Duration::from_millis(
                            u64::try_from(r.as_millis()).unwrap_or(u64::MAX),
                        ))
                        .to_string()
                    }),
                ),
                None => println!("{name}: free"),
            }
        }
    }
    Ok(0)
}

/// `lease status --permits N`: the permits held of each semaphore.
async fn status_permits(store: &Store, names: &[String], n: u32, json: bool) -> Result<u8, Fail> {
    let backend = store.connect().await?;
    let client = LeaseClient::new(backend);
    let mut semaphores = Vec::new();
    for name in names {
        semaphores.push(Semaphore::new(client.clone(), name, n)?);
    }
    for sem in &semaphores {
        // One inspect per permit, each bounded by the client (5 s).
        let held = sem.holders().await?;
        let name = sem.name().to_string_lossy();
        if json {
            let permits: Vec<_> = held
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "permit": p.slot,
                        "holder": p.info.holder,
                        "fencing_token": p.info.fencing.map(|f| f.get()),
                        "remaining_ms": p.info.remaining.map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX)),
                    })
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({ "name": name, "permits": n, "held": permits })
            );
        } else {
            println!("{name}: {} of {n} permits held", held.len());
            for p in &held {
                println!(
                    "  permit {}: held by {} (fencing token {}, {} left)",
                    p.slot,
                    p.info.holder.as_deref().unwrap_or("unknown"),
                    p.info.fencing.map_or("-".into(), |f| f.to_string()),
                    p.info.remaining.map_or("no ttl".into(), |r| {
                        humantime::format_duration(round_ms(r)).to_string()
                    }),
                );
            }
        }
    }
    Ok(0)
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

    use std::sync::OnceLock;

    use tracing::callsite::{Callsite, Identifier};
    use tracing::field::FieldSet;
    use tracing::metadata::Kind;
    use tracing::subscriber::Interest;
    use tracing::{Level, Metadata};

    use super::log_filter;

    /// A callsite made at run time, so that a target known only at run time can be put
    /// to a filter.
    struct Probe {
        meta: OnceLock<Metadata<'static>>,
    }

    impl Callsite for Probe {
        fn set_interest(&self, _: Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            self.meta.get().expect("set when made")
        }
    }

    /// Whether the subscriber `main` installs with `filter` lets an event of `level` from
    /// `target` through.
    fn passes(filter: &str, target: &str, level: Level) -> bool {
        let target: &'static str = Box::leak(target.to_owned().into_boxed_str());
        let probe: &'static Probe = Box::leak(Box::new(Probe {
            meta: OnceLock::new(),
        }));
        let meta = Metadata::new(
            "probe",
            target,
            level,
            None,
            None,
            None,
            FieldSet::new(&[], Identifier(probe)),
            Kind::EVENT,
        );
        assert!(probe.meta.set(meta).is_ok());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::dispatcher::get_default(|d| d.enabled(probe.metadata()))
        })
    }

    /// The crates of this workspace whose events the `lease` binary can emit: the facade,
    /// every crate the facade depends on (read from its Cargo.toml now, so that a backend
    /// added later is covered), and this one; as tracing targets.
    fn own_crates() -> Vec<String> {
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../leasehold/Cargo.toml");
        let text = std::fs::read_to_string(manifest).unwrap();
        let mut section = "";
        let mut crates = vec!["lease".to_owned(), "lease_cli".to_owned()];
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
                continue;
            }
            if section != "[dependencies]" {
                continue;
            }
            let Some((key, _)) = line.split_once('=') else {
                continue;
            };
            // `lease-core.workspace = true` or `lease-redis = { ... }`.
            let key = key.trim().split('.').next().unwrap_or_default();
            if key.starts_with("lease-") {
                crates.push(key.replace('-', "_"));
            }
        }
        crates
    }

    #[cfg(unix)]
    #[test]
    fn default_grace_leaves_slack_before_the_store_can_free_the_lease() {
        for ttl_ms in [100, 1000, 2000, 30_000, 3_600_000] {
            let opts =
                leasehold::LeaseOptions::new(std::time::Duration::from_millis(ttl_ms)).unwrap();
            let grace = super::exec::default_grace(&opts);
            assert!(!grace.is_zero(), "ttl {ttl_ms} ms");
            assert!(
                grace * 2 <= opts.safety_margin(),
                "ttl {ttl_ms} ms: grace {grace:?}, margin {:?}",
                opts.safety_margin()
            );
        }
    }

    #[test]
    fn default_filter_shows_the_warnings_of_every_backend() {
        let crates = own_crates();
        for expected in ["lease_core", "lease_redis", "lease_mysql"] {
            assert!(
                crates.iter().any(|c| c == expected),
                "{expected} not among the facade's dependencies: {crates:?}"
            );
        }
        let filter = log_filter(0);
        for target in &crates {
            for module in [target.clone(), format!("{target}::heartbeat")] {
                assert!(
                    passes(&filter, &module, Level::WARN),
                    "default filter {filter:?} hides warnings of {module}"
                );
                assert!(
                    !passes(&filter, &module, Level::INFO),
                    "default filter {filter:?} shows info of {module}"
                );
            }
        }
        // The store clients' own warnings only from -v on.
        for other in ["sqlx::query", "redis", "etcd_client", "h2"] {
            assert!(!passes(&filter, other, Level::WARN), "{other} at -v 0");
            assert!(
                passes(&log_filter(1), other, Level::WARN),
                "{other} at -v 1"
            );
        }
        for target in &crates {
            assert!(
                passes(&log_filter(1), target, Level::INFO),
                "{target} at -v 1"
            );
            assert!(
                passes(&log_filter(2), target, Level::DEBUG),
                "{target} at -v 2"
            );
        }
    }
}
