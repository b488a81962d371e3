//! The fault matrix at the container level: each store in a container on a private
//! Docker network, paused (`docker pause`, a cgroup freeze), stopped and started, killed,
//! disconnected from its network; holders in containers killed, paused and
//! disconnected; and a 3-member etcd cluster and ZooKeeper ensemble in containers with
//! their leader killed.
//!
//! Each case starts its own network and store, asserts what the library guarantees
//! (through [`crate::matrix`]) and returns one line saying what it measured. The same
//! cases run as tests (`tests/container_faults.rs`) and in the report
//! (`lease-report`, docs/comparison.md).

use std::sync::Arc;
use std::time::Duration;

use lease_test_servers::HarnessError;
use lease_test_servers::docker::{self, DockerNetwork, DockerStore, StoreKind};

use crate::matrix::{self, ContainerPlace, Matrix, Place};

/// The rows: key and title.
pub const ROWS: [(&str, &str); 8] = [
    ("c-holder-killed", "Holder container killed (`docker kill`)"),
    (
        "c-holder-paused",
        "Holder container paused for 2x TTL (`docker pause`), then unpaused",
    ),
    (
        "c-holder-disconnected",
        "Holder container disconnected from the store's network, then reconnected",
    ),
    (
        "c-store-paused",
        "Store container paused for 2x TTL (`docker pause`), then unpaused",
    ),
    (
        "c-store-stopped",
        "Store container stopped for 2x TTL (`docker stop`), then started",
    ),
    (
        "c-store-killed",
        "Store container killed (`docker kill`) and started: fencing tokens before → after",
    ),
    (
        "c-store-disconnected",
        "Store container disconnected from its network for 2x TTL (holders in containers), then reconnected",
    ),
    (
        "c-leader-killed",
        "3-member cluster (etcd) or ensemble (ZooKeeper) in containers, leader's container killed (`docker kill`)",
    ),
];

/// The stores the rows run on.
pub const KINDS: [StoreKind; 5] = [
    StoreKind::Redis,
    StoreKind::Postgres,
    StoreKind::Etcd,
    StoreKind::Mysql,
    StoreKind::ZooKeeper,
];

/// A private network and one store of `kind` on it.
pub async fn store(kind: StoreKind) -> Result<(Arc<DockerNetwork>, DockerStore), HarnessError> {
    let net = Arc::new(DockerNetwork::create().await?);
    let store = DockerStore::start(kind, &net).await?;
    Ok((net, store))
}

/// `m` with its holders in containers on `net`.
async fn in_containers(m: &Matrix, net: &Arc<DockerNetwork>) -> Matrix {
    let place = ContainerPlace::new(&m.holder, net.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Matrix {
        place: Place::Containers(Arc::new(place)),
        ..m.clone()
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Runs the case `key` on `kind` and returns its cell; panics where the case's
/// assertions fail or the containers do not start.
pub async fn run(key: &str, kind: StoreKind, m: &Matrix) -> String {
    if key == "c-leader-killed" {
        return leader_killed(kind, m).await;
    }
    let (net, store) = store(kind).await.unwrap_or_else(|e| panic!("{e}"));
    let c = store.container();
    match key {
        "c-holder-killed" => {
            let mc = in_containers(m, &net).await;
            let (t, r) = matrix::holder_killed(&mc, &store.url_in_network()).await;
            format!(
                "takeover after {} ({} double beliefs)",
                secs(t),
                r.double_beliefs.len()
            )
        }
        "c-holder-paused" => {
            let mc = in_containers(m, &net).await;
            let r = matrix::holder_paused(&mc, &store.url_in_network()).await;
            format!(
                "lost signal on unpause; {} stale writes rejected, {} accepted out of order",
                r.stale_rejected, r.accepted_out_of_order
            )
        }
        "c-holder-disconnected" => {
            let mc = in_containers(m, &net).await;
            let r = matrix::holder_disconnected(&mc, &store.url(), &store.url_in_network()).await;
            format!(
                "cut-off holder signals lost after {}, the other takes over after {}; after \
                 reconnecting it does not believe it holds the lease",
                secs(r.lost_after),
                secs(r.takeover_after)
            )
        }
        "c-store-paused" => {
            let (lost, _) = matrix::store_down(
                m,
                &store.url(),
                async || c.pause().await.unwrap(),
                async || c.unpause().await.unwrap(),
            )
            .await;
            format!(
                "holder stops {} after the freeze began; work resumes",
                secs(lost)
            )
        }
        "c-store-stopped" => {
            let (lost, _) = matrix::store_down(
                m,
                &store.url(),
                async || c.stop().await.unwrap(),
                async || {
                    c.start().await.unwrap();
                    store.wait_ready().await.unwrap();
                },
            )
            .await;
            format!(
                "holder stops {} after the stop began; work resumes",
                secs(lost)
            )
        }
        "c-store-killed" => {
            let r = matrix::store_restarted(&store.url(), async || {
                c.kill().await.unwrap();
                // Started only once it has exited: a start while it is still running
                // does nothing, and the exit would then leave it stopped.
                c.wait_exit().await.unwrap();
                c.start().await.unwrap();
                store.wait_ready().await.unwrap();
            })
            .await;
            format!(
                "tokens {} → {} ({:?}, claim held: {})",
                r.before,
                r.after,
                r.claim,
                r.claim_held()
            )
        }
        "c-store-disconnected" => {
            let mc = in_containers(m, &net).await;
            let network = net.name().to_owned();
            let (lost, _) = matrix::store_down(
                &mc,
                &store.url_in_network(),
                async || c.disconnect(&network).await.unwrap(),
                async || c.reconnect(&network).await.unwrap(),
            )
            .await;
            format!(
                "holders stop {} after the disconnect; work resumes after reconnecting",
                secs(lost)
            )
        }
        other => panic!("unknown container case {other}"),
    }
}

/// Whether `kind` runs the `c-leader-killed` row: the stores with a leader among
/// members (etcd's cluster, ZooKeeper's ensemble).
pub fn has_leader(kind: StoreKind) -> bool {
    matches!(kind, StoreKind::Etcd | StoreKind::ZooKeeper)
}

/// A 3-member etcd cluster or ZooKeeper ensemble in containers: the leader's container
/// is killed (no leadership hand-over: the others must elect a new leader) while a lease
/// is taken and released; a new leader is elected among the other two, the lease is
/// taken again and fencing keeps growing; then a holder is killed on the two remaining
/// members and another takes over.
pub async fn leader_killed(kind: StoreKind, m: &Matrix) -> String {
    assert!(has_leader(kind), "{kind} has no leader among members");
    let net = Arc::new(
        DockerNetwork::create()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let members = match kind {
        StoreKind::ZooKeeper => DockerStore::zookeeper_ensemble(&net, 3).await,
        _ => DockerStore::etcd_cluster(&net, 3).await,
    }
    .unwrap_or_else(|e| panic!("{e}"));
    let hosts = members
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.host_port()))
        .collect::<Vec<_>>()
        .join(",");
    let url = match kind {
        StoreKind::ZooKeeper => format!("zk://{hosts}/lease"),
        _ => format!("etcd://{hosts}"),
    };
    let leader_of = async |members: &[DockerStore]| match kind {
        StoreKind::ZooKeeper => docker::zookeeper_leader(members, Duration::from_secs(20)).await,
        _ => docker::etcd_leader(members, Duration::from_secs(20)).await,
    };
    let leader = leader_of(&members).await.unwrap_or_else(|e| panic!("{e}"));
    let victim = members
        .get(leader)
        .unwrap_or_else(|| panic!("no member {leader}"));
    let r = matrix::store_restarted(&url, async || {
        victim.container().kill().await.unwrap();
    })
    .await;
    assert!(
        r.after > r.before,
        "fencing did not grow across the leader's kill: {r:?}"
    );
    // The killed member answers nothing, so the leader found now is one of the others.
    let new_leader = leader_of(&members).await.unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(new_leader, leader, "the killed member is still the leader");
    let (t, report) = matrix::holder_killed(m, &url).await;
    format!(
        "a new leader elected; tokens {} → {} across the kill; with 2 of 3 members, takeover \
         after a holder's kill {} ({} double beliefs)",
        r.before,
        r.after,
        secs(t),
        report.double_beliefs.len()
    )
}
