//! The conformance suite against the in-memory reference backend, directly and through
//! `Box<dyn>` / `Arc<dyn>` forwarding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use lease_conformance::Fixture;
use lease_core::{LeaseBackend, MemoryBackend};

async fn memory() -> Fixture {
    Fixture::new(Arc::new(MemoryBackend::new()))
}

lease_conformance::conformance_suite!(memory);

mod forwarded {
    use super::*;

    async fn boxed() -> Fixture {
        let boxed: Box<dyn LeaseBackend> = Box::new(MemoryBackend::new());
        let arc_of_box: Arc<Box<dyn LeaseBackend>> = Arc::new(boxed);
        Fixture::new(Arc::new(arc_of_box))
    }

    lease_conformance::conformance_suite!(boxed);
}

/// The observer check can fail: an observer that reads less often than leaderships last
/// misses some of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "the observer's leaders are not the leaderships in order")]
async fn the_observer_check_fails_for_an_observer_slower_than_a_leadership() {
    let backend: Arc<dyn LeaseBackend> = Arc::new(MemoryBackend::new());
    lease_conformance::suite::election_observer_check(
        backend,
        std::time::Duration::from_millis(400),
    )
    .await;
}
