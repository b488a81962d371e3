//! The fault matrix at the container level (`lease_lab::container_faults`): stores and
//! holders in Docker containers on private networks, paused, stopped and started,
//! killed, disconnected and reconnected; a 3-member etcd cluster in containers with its
//! leader stopped. Needs a Docker engine; without one each test says so and passes, or,
//! under `LEASE_TEST_SOURCE=containers`, fails.
//!
//! The cases run one at a time: each times takeovers against a 1 s TTL, and several
//! containers starting at once on a 2-core machine would measure the machine.
//!
//! Each case runs under a watchdog: one that is still running after [`CASE_BOUND`] (its
//! runtime's shutdown included) ends the test process with the state of its threads,
//! containers and processes, so that a hang fails the run and says where it is instead
//! of holding CI until CI's own limit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use lease_lab::container_faults;
use lease_lab::matrix::{Matrix, Place, TTL};
use lease_test_servers::docker::{self, StoreKind};

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long one case may take, from the start of its runtime to the end of its
/// shutdown. The cases take 5 to 40 s here; a case has up to about 10 `docker` calls,
/// each bounded by 240 s, but a call that takes minutes is a stuck engine already.
const CASE_BOUND: Duration = Duration::from_secs(420);

/// Ends the process with diagnostics if dropped later than [`CASE_BOUND`] after it was
/// started.
struct Watchdog {
    done: Option<mpsc::Sender<()>>,
}

impl Watchdog {
    fn start(case: String) -> Watchdog {
        let (done, wait) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if wait.recv_timeout(CASE_BOUND) != Err(mpsc::RecvTimeoutError::Timeout) {
                return;
            }
            // Written to the process's stderr directly: the test's captured output
            // would be lost with the exit.
            let mut err = std::io::stderr();
            let _ = writeln!(
                err,
                "container fault {case}: still running after {CASE_BOUND:?}; ending the \
                 test process. The state of things:"
            );
            let pid = std::process::id().to_string();
            for (what, program, args) in [
                ("containers", "docker", vec!["ps", "-a", "--no-trunc"]),
                (
                    "this process's threads",
                    "gdb",
                    vec!["-p", &pid, "-batch", "-ex", "thread apply all bt"],
                ),
                ("processes", "ps", vec!["-ef", "--forest"]),
            ] {
                let mut all = vec!["60", program];
                all.extend(args);
                let out = Command::new("timeout").args(&all).output();
                let _ = match out {
                    Ok(o) => writeln!(
                        err,
                        "--- {what} ({program}):\n{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    ),
                    Err(e) => writeln!(err, "--- {what}: {program} did not run: {e}"),
                };
            }
            std::process::exit(101);
        });
        Watchdog { done: Some(done) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Disconnects the channel: the watchdog thread ends.
        self.done.take();
    }
}

/// Runs one case on a runtime of its own, one case at a time, under a watchdog.
fn run_case(key: &str, kind: StoreKind) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let _watchdog = Watchdog::start(format!("{key} on {kind}"));
    // The runtime is dropped (its shutdown done) before the watchdog.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(case(key, kind));
}

async fn case(key: &str, kind: StoreKind) {
    if let Err(why) = docker::available() {
        let forced = std::env::var("LEASE_TEST_SOURCE").is_ok_and(|v| v.trim() == "containers");
        assert!(!forced, "LEASE_TEST_SOURCE=containers and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let m = Matrix {
        holder: PathBuf::from(env!("CARGO_BIN_EXE_lease-holder")),
        ttl: TTL,
        place: Place::Host,
    };
    let cell = container_faults::run(key, kind, &m).await;
    eprintln!("container fault {key} on {kind}: {cell}");
}

macro_rules! per_store {
    ($($module:ident => $kind:expr),*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn holder_container_killed() {
                run_case("c-holder-killed", $kind);
            }

            #[test]
            fn holder_container_paused() {
                run_case("c-holder-paused", $kind);
            }

            #[test]
            fn holder_container_disconnected() {
                run_case("c-holder-disconnected", $kind);
            }

            #[test]
            fn store_container_paused() {
                run_case("c-store-paused", $kind);
            }

            #[test]
            fn store_container_stopped_and_started() {
                run_case("c-store-stopped", $kind);
            }

            #[test]
            fn store_container_killed_keeps_its_fencing_claim() {
                run_case("c-store-killed", $kind);
            }

            #[test]
            fn store_container_disconnected() {
                run_case("c-store-disconnected", $kind);
            }
        }
    )*};
}

per_store!(
    redis => StoreKind::Redis,
    postgres => StoreKind::Postgres,
    etcd => StoreKind::Etcd,
    mysql => StoreKind::Mysql,
    zookeeper => StoreKind::ZooKeeper
);

#[test]
fn etcd_cluster_in_containers_leader_killed() {
    run_case("c-leader-killed", StoreKind::Etcd);
}

#[test]
fn zookeeper_ensemble_in_containers_leader_killed() {
    run_case("c-leader-killed", StoreKind::ZooKeeper);
}
