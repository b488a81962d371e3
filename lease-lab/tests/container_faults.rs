//! The fault matrix at the container level (`lease_lab::container_faults`): stores and
//! holders in Docker containers on private networks, paused, stopped and started,
//! killed, disconnected and reconnected; a 3-member etcd cluster in containers with its
//! leader stopped. Needs a Docker engine; without one each test says so and passes, or,
//! under `LEASE_TEST_SOURCE=containers`, fails.
//!
//! The cases run one at a time: each times takeovers against a 1 s TTL, and several
//! containers starting at once on a 2-core machine would measure the machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;

use lease_lab::container_faults;
use lease_lab::matrix::{Matrix, Place, TTL};
use lease_test_servers::docker::{self, StoreKind};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn case(key: &str, kind: StoreKind) {
    if let Err(why) = docker::available() {
        let forced = std::env::var("LEASE_TEST_SOURCE").is_ok_and(|v| v.trim() == "containers");
        assert!(!forced, "LEASE_TEST_SOURCE=containers and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
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

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn holder_container_killed() {
                case("c-holder-killed", $kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn holder_container_paused() {
                case("c-holder-paused", $kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn holder_container_disconnected() {
                case("c-holder-disconnected", $kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn store_container_paused() {
                case("c-store-paused", $kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn store_container_stopped_and_started() {
                case("c-store-stopped", $kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn store_container_killed_keeps_its_fencing_claim() {
                case("c-store-killed", $kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn store_container_disconnected() {
                case("c-store-disconnected", $kind).await;
            }
        }
    )*};
}

per_store!(
    redis => StoreKind::Redis,
    postgres => StoreKind::Postgres,
    etcd => StoreKind::Etcd,
    mysql => StoreKind::Mysql
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_in_containers_leader_stopped() {
    case("c-etcd-member-stopped", StoreKind::Etcd).await;
}
