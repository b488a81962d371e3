//! Seed 002's MySQL alternatives on a real MariaDB (`lease_lab::mysql_alternatives`):
//! `GET_LOCK` and `SKIP LOCKED` hold for ever while a stuck holder keeps its connection,
//! and free at once when the holder's connection closes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseBackend;
use lease_lab::mysql_alternatives::{SessionLock, SessionLockBackend, freed_when_the_holder_dies};
use lease_lab::scenarios;
use lease_test_servers::MariaDbServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_holder_blocks_everyone_and_a_dead_one_frees_at_once() {
    let db = MariaDbServer::shared().await.unwrap();
    for kind in [SessionLock::GetLock, SessionLock::SkipLocked] {
        let b: Arc<dyn LeaseBackend> =
            Arc::new(SessionLockBackend::connect(kind, &db.url()).await.unwrap());
        // Time is the subject: 2 s stands for "for ever" (a lease with a 500 ms TTL frees
        // in under 1 s in the same scenario).
        let stuck = scenarios::stuck_holder_lease(b, Duration::from_secs(2)).await;
        assert_eq!(stuck, None, "{kind:?}: a stuck holder let others in");
        let freed = freed_when_the_holder_dies(kind, &db.url()).await;
        eprintln!("{kind:?}: free {freed:?} after the holder's connection closed");
        assert!(freed < Duration::from_secs(2), "{kind:?}: {freed:?}");
    }
}
