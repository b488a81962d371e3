//! The Redis fence (`lease_redis::fence::RedisFence`) on a real server: fenced SET, HSET,
//! XADD and a script of the caller's own run only for a token not below the highest
//! seen; a stale write changes nothing; tokens compare as numbers of any length; and the
//! paused-holder scenario with real leases.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use lease_core::{
    AcquireOutcome, Error, FencingToken, HolderLabel, LeaseBackend, LeaseName, Owner,
};
use lease_redis::RedisBackend;
use lease_redis::fence::{FencedScript, RedisFence};
use lease_redis::redis::{self, AsyncCommands};
use lease_test_servers::RedisServer;

fn unique(prefix: &str) -> String {
    format!("{{{prefix}-{}}}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn fenced_writes_refuse_stale_tokens_and_change_nothing() {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let tag = unique("report");
    let (fence_key, data) = (format!("{tag}:fence"), format!("{tag}:latest"));
    let fence = RedisFence::new(&fence_key);
    assert_eq!(fence.highest(&mut conn).await.unwrap(), None);
    fence
        .set(&mut conn, &data, b"v5", FencingToken(5))
        .await
        .unwrap();
    fence
        .set(&mut conn, &data, b"v5b", FencingToken(5))
        .await
        .unwrap();
    // 10 is above 9 although "10" < "9" as text.
    fence
        .set(&mut conn, &data, b"v9", FencingToken(9))
        .await
        .unwrap();
    fence
        .set(&mut conn, &data, b"v10", FencingToken(10))
        .await
        .unwrap();
    match fence.set(&mut conn, &data, b"stale", FencingToken(9)).await {
        Err(Error::Fenced {
            resource,
            token: 9,
            highest: 10,
        }) => assert_eq!(resource, fence_key),
        other => panic!("{other:?}"),
    }
    let v: String = conn.get(&data).await.unwrap();
    assert_eq!(v, "v10");
    assert_eq!(
        fence.highest(&mut conn).await.unwrap(),
        Some(FencingToken(10))
    );

    let hash = format!("{tag}:hash");
    fence
        .hset(&mut conn, &hash, b"f", b"x", FencingToken(11))
        .await
        .unwrap();
    assert!(matches!(
        fence
            .hset(&mut conn, &hash, b"f", b"old", FencingToken(10))
            .await,
        Err(Error::Fenced { .. })
    ));
    let v: String = conn.hget(&hash, "f").await.unwrap();
    assert_eq!(v, "x");

    let stream = format!("{tag}:stream");
    let id = fence
        .xadd(
            &mut conn,
            &stream,
            &[(b"push", b"user-1"), (b"n", b"1")],
            FencingToken(11),
        )
        .await
        .unwrap();
    assert!(id.contains('-'), "{id}");
    assert!(matches!(
        fence
            .xadd(&mut conn, &stream, &[(b"push", b"user-2")], FencingToken(3))
            .await,
        Err(Error::Fenced { .. })
    ));
    let len: u64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 1);

    // A body of the caller's own: two writes, both or neither.
    let script = FencedScript::new(
        "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('RPUSH', KEYS[2], ARGV[2])",
    );
    let (cursor, sent) = (format!("{tag}:cursor"), format!("{tag}:sent"));
    let n: i64 = fence
        .run(
            &mut conn,
            &script,
            &[&cursor, &sent],
            &[b"1042", b"user-7"],
            FencingToken(12),
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let r: Result<i64, _> = fence
        .run(
            &mut conn,
            &script,
            &[&cursor, &sent],
            &[b"1", b"user-0"],
            FencingToken(11),
        )
        .await;
    assert!(matches!(r, Err(Error::Fenced { highest: 12, .. })), "{r:?}");
    let c: String = conn.get(&cursor).await.unwrap();
    assert_eq!(c, "1042");
    // Tokens beyond a Lua number's exact range still compare exactly.
    fence
        .set(&mut conn, &data, b"big", FencingToken(u64::MAX - 1))
        .await
        .unwrap();
    assert!(matches!(
        fence
            .set(&mut conn, &data, b"x", FencingToken(u64::MAX - 2))
            .await,
        Err(Error::Fenced { .. })
    ));
    fence
        .set(&mut conn, &data, b"max", FencingToken(u64::MAX))
        .await
        .unwrap();
}

/// Real leases on Redis: holder A's lease lapses while it is paused (no renewal), B takes
/// the name and writes through the fence; A resumes and writes with its token: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_ttl_cannot_overwrite_the_next_holder() {
    let server = RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let tag = unique("outbox");
    let fence = RedisFence::new(format!("{tag}:fence"));
    let data = format!("{tag}:sent-by");
    let name = LeaseName::new(tag.as_bytes()).unwrap();
    let (a, b) = (
        Owner::new(HolderLabel::new("a").unwrap()),
        Owner::new(HolderLabel::new("b").unwrap()),
    );
    let ttl = Duration::from_millis(500);
    let AcquireOutcome::Acquired {
        fencing: token_a, ..
    } = backend.acquire(&name, &a, ttl).await.unwrap()
    else {
        panic!("a did not acquire")
    };
    let by = tokio::time::Instant::now() + Duration::from_secs(5);
    let token_b = loop {
        if let AcquireOutcome::Acquired { fencing, .. } =
            backend.acquire(&name, &b, ttl).await.unwrap()
        {
            break fencing;
        }
        assert!(tokio::time::Instant::now() < by, "the lease did not lapse");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(token_b > token_a);
    fence.set(&mut conn, &data, b"b", token_b).await.unwrap();
    assert!(matches!(
        fence.set(&mut conn, &data, b"a", token_a).await,
        Err(Error::Fenced { .. })
    ));
    let v: String = conn.get(&data).await.unwrap();
    assert_eq!(v, "b");
}
