//! The short fault matrix on real servers; the cases live in `lease_conformance::matrix`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;

use lease_conformance::matrix::{self, Matrix, RENEW, TTL};
use lease_conformance::server::RedisServer;

fn m() -> Matrix {
    Matrix {
        holder: PathBuf::from(env!("CARGO_BIN_EXE_lease-holder")),
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
    matrix::holder_paused(&m(), &server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_down_twice_the_ttl() {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
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

mod postgres {
    use super::*;
    use lease_conformance::server::PostgresServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_holder_killed() {
        let db = PostgresServer::shared().await.unwrap_or_else(|e| panic!("{e}"));
        let (t, _) = matrix::holder_killed(&m(), &db.url()).await;
        eprintln!("postgres: takeover {t:?} after SIGKILL (ttl {TTL:?}, renew {RENEW:?})");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_holder_paused() {
        let db = PostgresServer::shared().await.unwrap_or_else(|e| panic!("{e}"));
        matrix::holder_paused(&m(), &db.url()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_store_down_twice_the_ttl() {
        let server = PostgresServer::start_fast().await.unwrap_or_else(|e| panic!("{e}"));
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
