//! Helpers shared by the Redis test files.

/// A plain connection to the server at `url`, for setting it up (CONFIG, ACL, REPLICAOF).
pub async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
