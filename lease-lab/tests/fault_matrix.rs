//! The short fault matrix on real servers; the cases live in `lease_lab::matrix`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;

use lease_lab::matrix::{self, Matrix, RENEW, TTL};
use lease_test_servers::RedisServer;

fn m() -> Matrix {
    Matrix {
        holder: PathBuf::from(env!("CARGO_BIN_EXE_lease-holder")),
        ttl: TTL,
        place: matrix::Place::Host,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_killed() {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let (t, _) = matrix::holder_killed(&m(), &server.url()).await;
    eprintln!("redis: takeover {t:?} after SIGKILL (ttl {TTL:?}, renew {RENEW:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_paused() {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let r = matrix::holder_paused(&m(), &server.url()).await;
    eprintln!("paused holder: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_down_twice_the_ttl() {
    let server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let server = tokio::sync::Mutex::new(server);
    matrix::store_down(
        &m(),
        &url,
        async || server.lock().await.stop().await.unwrap(),
        async || server.lock().await.start_again().await.unwrap(),
    )
    .await;
}

mod postgres {
    use super::*;
    use lease_test_servers::PostgresServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_holder_killed() {
        let db = PostgresServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (t, _) = matrix::holder_killed(&m(), &db.url()).await;
        eprintln!("postgres: takeover {t:?} after SIGKILL (ttl {TTL:?}, renew {RENEW:?})");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_holder_paused() {
        let db = PostgresServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let r = matrix::holder_paused(&m(), &db.url()).await;
        eprintln!("paused holder: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_store_down_twice_the_ttl() {
        let server = PostgresServer::start_fast()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if !server.owns_process() {
            eprintln!("skipped: needs a server the harness owns");
            return;
        }
        let url = server.url();
        let server = tokio::sync::Mutex::new(server);
        matrix::store_down(
            &m(),
            &url,
            async || server.lock().await.stop().await.unwrap(),
            async || server.lock().await.start_again().await.unwrap(),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_and_without_aof() {
    for persistent in [false, true] {
        let server = if persistent {
            RedisServer::start_persistent().await
        } else {
            RedisServer::start_owned().await
        }
        .unwrap_or_else(|e| panic!("{e}"));
        let url = server.url();
        let server = tokio::sync::Mutex::new(server);
        let r = matrix::store_restarted(&url, async || {
            let mut s = server.lock().await;
            s.stop().await.unwrap();
            s.start_again().await.unwrap();
        })
        .await;
        eprintln!("redis (aof {persistent}): {r:?}");
        if persistent {
            assert_eq!(r.claim, lease_core::Fencing::Durable);
        } else {
            assert_eq!(r.claim, lease_core::Fencing::Volatile);
            // The counter is lost and seeded again from the server's clock: the tokens
            // still rise (before the seeding: 3 -> 1).
            assert!(
                r.after > r.before,
                "without persistence the tokens must still rise: {r:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_keeps_fencing() {
    let server = lease_test_servers::PostgresServer::start_local_process()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    if !server.owns_process() {
        return;
    }
    let url = server.url();
    let server = tokio::sync::Mutex::new(server);
    let r = matrix::store_restarted(&url, async || {
        let mut s = server.lock().await;
        // A crash (SIGKILL) with default durability: committed counters survive.
        s.kill().unwrap();
        s.start_again().await.unwrap();
    })
    .await;
    eprintln!("postgres (killed, restarted): {r:?}");
    assert_eq!(r.claim, lease_core::Fencing::Durable);
}

mod etcd {
    use super::*;
    use lease_test_servers::{EtcdCluster, EtcdServer};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_holder_killed() {
        let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
        let (t, _) = matrix::holder_killed(&m(), &server.url()).await;
        eprintln!("etcd: takeover {t:?} after SIGKILL (ttl {TTL:?}, renew {RENEW:?})");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_holder_paused() {
        let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
        let r = matrix::holder_paused(&m(), &server.url()).await;
        eprintln!("paused holder: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_store_down_twice_the_ttl() {
        let server = EtcdServer::start_local()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = server.url();
        let server = tokio::sync::Mutex::new(server);
        matrix::store_down(
            &m(),
            &url,
            async || server.lock().await.stop().await.unwrap(),
            async || server.lock().await.start_again().await.unwrap(),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_restart_keeps_fencing() {
        let server = EtcdServer::start_local()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = server.url();
        let server = tokio::sync::Mutex::new(server);
        let r = matrix::store_restarted(&url, async || {
            let mut s = server.lock().await;
            s.kill().unwrap();
            s.start_again().await.unwrap();
        })
        .await;
        eprintln!("etcd (killed, restarted): {r:?}");
        assert_eq!(r.claim, lease_core::Fencing::Durable);
    }

    /// The leader of a 3-member cluster is killed while holders run: the lease survives or
    /// moves, and fencing keeps growing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_cluster_leader_killed() {
        let mut cluster = EtcdCluster::start(3)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = lease_test_servers::etcd::etcd_url(&cluster.endpoints());
        let leader = cluster
            .wait_leader(std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let r = matrix::store_restarted(&url, async || {
            cluster.member(leader).kill().unwrap();
        })
        .await;
        eprintln!("etcd cluster (leader killed): {r:?}");
        assert!(r.after > r.before);
    }
}

mod mysql {
    use super::*;
    use lease_test_servers::MariaDbServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_holder_killed() {
        let db = MariaDbServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (t, _) = matrix::holder_killed(&m(), &db.url()).await;
        eprintln!("mysql: takeover {t:?} after SIGKILL (ttl {TTL:?}, renew {RENEW:?})");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_holder_paused() {
        let db = MariaDbServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let r = matrix::holder_paused(&m(), &db.url()).await;
        eprintln!("paused holder: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_store_down_twice_the_ttl() {
        let server = MariaDbServer::start_fast()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = server.url();
        let server = tokio::sync::Mutex::new(server);
        matrix::store_down(
            &m(),
            &url,
            async || server.lock().await.stop().await.unwrap(),
            async || server.lock().await.start_again().await.unwrap(),
        )
        .await;
    }

    /// A crash (SIGKILL) with the default durability: the counters survive.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_restart_keeps_fencing() {
        let server = MariaDbServer::start_local()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = server.url();
        let server = tokio::sync::Mutex::new(server);
        let r = matrix::store_restarted(&url, async || {
            let mut s = server.lock().await;
            s.kill().unwrap();
            s.start_again().await.unwrap();
        })
        .await;
        eprintln!("mysql (killed, restarted): {r:?}");
        assert_eq!(r.claim, lease_core::Fencing::Durable);
    }
}

mod zookeeper {
    use super::*;
    use lease_test_servers::{ZooKeeperEnsemble, ZooKeeperServer};

    fn url(servers: &str) -> String {
        format!("zk://{servers}/matrix-{}", uuid::Uuid::new_v4().simple())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_holder_killed() {
        let servers = ZooKeeperServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (t, _) = matrix::holder_killed(&m(), &url(&servers)).await;
        eprintln!("zookeeper: takeover {t:?} after SIGKILL (ttl {TTL:?}, renew {RENEW:?})");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_holder_paused() {
        let servers = ZooKeeperServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let r = matrix::holder_paused(&m(), &url(&servers)).await;
        eprintln!("paused holder: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_store_down_twice_the_ttl() {
        let server = ZooKeeperServer::start_local()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = url(&server.address());
        let server = tokio::sync::Mutex::new(server);
        matrix::store_down(
            &m(),
            &url,
            async || server.lock().await.kill().unwrap(),
            async || server.lock().await.start_again().await.unwrap(),
        )
        .await;
    }

    /// A crash (SIGKILL) and a start again: the zxid, and with it the fencing token, is in
    /// the transaction log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_restart_keeps_fencing() {
        let server = ZooKeeperServer::start_local()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = url(&server.address());
        let server = tokio::sync::Mutex::new(server);
        let r = matrix::store_restarted(&url, async || {
            let mut s = server.lock().await;
            s.kill().unwrap();
            s.start_again().await.unwrap();
        })
        .await;
        eprintln!("zookeeper (killed, restarted): {r:?}");
        assert_eq!(r.claim, lease_core::Fencing::Durable);
        assert!(r.after > r.before, "{r:?}");
    }

    /// The leader of a 3-member ensemble is killed while holders run: the lease survives or
    /// moves, and fencing keeps growing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_ensemble_leader_killed() {
        let mut ensemble = ZooKeeperEnsemble::start(3)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = url(&ensemble.connect_string());
        let leader = ensemble.leader().expect("a leader");
        let r = matrix::store_restarted(&url, async || {
            ensemble.kill(leader).unwrap();
        })
        .await;
        eprintln!("zookeeper ensemble (leader killed): {r:?}");
        assert!(r.after > r.before, "{r:?}");
    }
}

/// Network cut between one holder and the store, per store. Needs root (a network
/// namespace); elsewhere each test says it was skipped and why.
mod network_cut {
    use super::*;
    use lease_test_servers::{EtcdServer, PostgresServer};

    async fn run(url: &str, store: &str) {
        let addr = matrix::store_addr(url).unwrap();
        match matrix::network_cut(&m(), url, addr, |to| matrix::with_store_addr(url, to)).await {
            Ok(r) => eprintln!(
                "{store}: cut-off holder lost after {:?}, other took over after {:?}; {}",
                r.lost_after, r.takeover_after, r.report
            ),
            Err(why) => eprintln!("{store}: network cut skipped: {why}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_network_cut() {
        let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
        run(&server.url(), "redis").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_network_cut() {
        let db = PostgresServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        run(&db.url(), "postgres").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_network_cut() {
        let db = lease_test_servers::MariaDbServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        run(&db.url(), "mysql").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_network_cut() {
        let servers = lease_test_servers::ZooKeeperServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        run(
            &format!("zk://{servers}/cut-{}", uuid::Uuid::new_v4().simple()),
            "zookeeper",
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_network_cut() {
        let server = EtcdServer::start().await.unwrap_or_else(|e| panic!("{e}"));
        run(&server.url(), "etcd").await;
    }
}
