//! The error mapping over real error replies: each row puts a real redis-server into a
//! state that makes it answer with one error, sends a lease call, and checks the kind of
//! error the caller gets and whether it says a retry may help.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{Error, HolderLabel, LeaseBackend, LeaseName, Owner};
use lease_redis::RedisBackend;
mod common;
use common::admin;
use lease_test_servers::RedisServer;

fn owner() -> Owner {
    Owner::new(HolderLabel::new("errors").unwrap())
}

fn name() -> LeaseName {
    LeaseName::new(format!("errors-{}", uuid::Uuid::new_v4().simple())).unwrap()
}

async fn cmd(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    let _: redis::Value = c.query_async(conn).await.unwrap();
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Kind {
    /// `Error::Rejected`: the same call fails again.
    Rejected,
    /// `Error::Auth`: the credentials are wrong or missing (not retryable).
    Auth,
    /// `Error::Backend` with `retryable: true`.
    Transient,
    /// `Error::Unavailable` (retryable).
    Unavailable,
}

fn kind(e: &Error) -> Option<Kind> {
    match e {
        Error::Rejected { .. } => Some(Kind::Rejected),
        Error::Auth { .. } => Some(Kind::Auth),
        Error::Backend {
            retryable: true, ..
        } => Some(Kind::Transient),
        Error::Unavailable { .. } => Some(Kind::Unavailable),
        _ => None,
    }
}

fn check<T: std::fmt::Debug>(
    table: &mut Vec<String>,
    reply: &str,
    r: lease_core::Result<T>,
    want: Kind,
) {
    let e = match r {
        Err(e) => e,
        Ok(v) => panic!("{reply}: expected an error, got {v:?}"),
    };
    assert_eq!(kind(&e), Some(want), "{reply}: {e:?}");
    let retryable = matches!(want, Kind::Transient | Kind::Unavailable);
    assert_eq!(e.is_retryable(), retryable, "{reply}: {e}");
    // The message says what the server said (redis-rs spells some codes its own way).
    let says = match reply {
        "WRONGPASS" => "authentication failed",
        "connection refused" => "refused",
        code => code,
    };
    assert!(
        e.to_string().to_lowercase().contains(&says.to_lowercase()),
        "{reply}: {e}"
    );
    table.push(format!("| `{reply}` | {want:?} | {retryable} | {e} |"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_error_replies_map_to_typed_errors() {
    let server = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let port = server.port().unwrap();
    let mut root = admin(&url).await;
    let mut table = Vec::new();
    let ttl = Duration::from_secs(30);

    // OOM: at maxmemory with noeviction, a new lease needs memory.
    let b = RedisBackend::connect(&url).await.unwrap();
    cmd(
        &mut root,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    )
    .await;
    cmd(&mut root, &["CONFIG", "SET", "maxmemory", "1"]).await;
    check(
        &mut table,
        "OOM",
        b.acquire(&name(), &owner(), ttl).await,
        Kind::Transient,
    );
    cmd(&mut root, &["CONFIG", "SET", "maxmemory", "0"]).await;

    // BUSY: another client's script runs past busy-reply-threshold.
    cmd(&mut root, &["CONFIG", "SET", "busy-reply-threshold", "50"]).await;
    let mut blocker = admin(&url).await;
    let busy = tokio::spawn(async move {
        let _: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg("local t = redis.call('TIME'); while true do end")
            .arg(0)
            .query_async(&mut blocker)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    check(
        &mut table,
        "BUSY",
        b.acquire(&name(), &owner(), ttl).await,
        Kind::Transient,
    );
    // SCRIPT KILL is one of the few commands a busy server takes (the script wrote nothing).
    let mut killer = admin(&url).await;
    let _: redis::RedisResult<redis::Value> = redis::cmd("SCRIPT")
        .arg("KILL")
        .query_async(&mut killer)
        .await;
    let _ = busy.await;
    cmd(
        &mut root,
        &["CONFIG", "SET", "busy-reply-threshold", "5000"],
    )
    .await;

    // NOPERM: an ACL user that may not run scripts.
    cmd(
        &mut root,
        &[
            "ACL",
            "SETUSER",
            "noscript",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-@scripting",
        ],
    )
    .await;
    let limited = RedisBackend::connect(&format!("redis://noscript:pw@127.0.0.1:{port}/"))
        .await
        .unwrap();
    check(
        &mut table,
        "NOPERM",
        limited.acquire(&name(), &owner(), ttl).await,
        Kind::Rejected,
    );

    // WRONGPASS: a wrong password at connect.
    check(
        &mut table,
        "WRONGPASS",
        RedisBackend::connect(&format!("redis://noscript:wrong@127.0.0.1:{port}/")).await,
        Kind::Auth,
    );

    // NOAUTH: the server wants a password, the client gives none.
    cmd(&mut root, &["CONFIG", "SET", "requirepass", "secret"]).await;
    let anonymous = RedisBackend::connect(&url).await;
    match anonymous {
        // The persistence probe's CONFIG GET is refused: the backend comes up volatile...
        Ok(b) => check(
            &mut table,
            "NOAUTH",
            b.acquire(&name(), &owner(), ttl).await,
            Kind::Auth,
        ),
        Err(e) => check::<()>(&mut table, "NOAUTH", Err(e), Kind::Auth),
    }
    let mut root = admin(&format!("redis://:secret@127.0.0.1:{port}/")).await;
    cmd(&mut root, &["CONFIG", "SET", "requirepass", ""]).await;

    // READONLY: a replica, reached directly (a new connection reaches it again).
    let replica = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut r = admin(&replica.url()).await;
    cmd(&mut r, &["REPLICAOF", "127.0.0.1", &port.to_string()]).await;
    let on_replica = RedisBackend::connect(&replica.url()).await.unwrap();
    check(
        &mut table,
        "READONLY",
        on_replica.acquire(&name(), &owner(), ttl).await,
        Kind::Transient,
    );

    // MASTERDOWN: a replica cut off from its primary that may not serve stale data.
    cmd(&mut r, &["CONFIG", "SET", "replica-serve-stale-data", "no"]).await;
    let dead = lease_test_servers::free_port().unwrap();
    cmd(&mut r, &["REPLICAOF", "127.0.0.1", &dead.to_string()]).await;
    check(
        &mut table,
        "MASTERDOWN",
        on_replica.acquire(&name(), &owner(), ttl).await,
        Kind::Transient,
    );

    // Connection refused: the server is gone.
    let mut gone = RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = RedisBackend::connect(&gone.url()).await.unwrap();
    gone.kill().unwrap();
    let mut last = b.acquire(&name(), &owner(), ttl).await;
    if !matches!(last, Err(Error::Unavailable { .. })) {
        // The first call may see the dropped connection and retry into the refusal.
        last = b.acquire(&name(), &owner(), ttl).await;
    }
    check(&mut table, "connection refused", last, Kind::Unavailable);

    eprintln!(
        "| reply | kind | retryable | error |\n|---|---|---|---|\n{}",
        table.join("\n")
    );
}
