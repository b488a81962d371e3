//! How a resource fences semaphore permits: one fence per permit
//! (`Permit::fence_resource`). The tokens of two slots are unrelated, so one fence for
//! all permits refuses a current holder whose slot's count is behind another's; per
//! permit, every current holder writes, and a holder whose permit was taken over is
//! refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lease_core::fence::Fence;
use lease_core::{
    Error, LeaseBackend, LeaseClient, LeaseOptions, MemoryBackend, Permit, Semaphore, TryPermit,
};

async fn take(pool: &Semaphore, opts: &LeaseOptions) -> Permit {
    match pool.try_acquire(opts).await.unwrap() {
        TryPermit::Acquired(p) => p,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn permits_are_fenced_one_fence_per_slot() {
    let backend = Arc::new(MemoryBackend::new());
    let dyn_backend: Arc<dyn LeaseBackend> = backend.clone();
    let client = LeaseClient::new(dyn_backend);
    let pool = Semaphore::new(client, "exports", 2).unwrap();
    let opts = LeaseOptions::new(Duration::from_secs(10)).unwrap();
    // Slot 0 has been used a few times more than slot 1.
    for _ in 0..3 {
        take(&pool, &opts).await.release().await.unwrap();
    }
    let a = take(&pool, &opts).await;
    let b = take(&pool, &opts).await;
    assert_ne!(a.slot(), b.slot());
    let (high, low) = if a.fencing() > b.fencing() {
        (&a, &b)
    } else {
        (&b, &a)
    };

    // One fence for all permits: the holder of the slot with the lower count is refused
    // although its permit is current.
    let shared = Fence::new("exports");
    shared.check(high.fencing()).unwrap();
    assert!(matches!(
        shared.check(low.fencing()),
        Err(Error::Fenced { .. })
    ));

    // One fence per permit: both current holders write.
    let fences: HashMap<String, Fence> = (0..2)
        .map(|slot| {
            let r = format!("exports/permit/{slot}");
            (r.clone(), Fence::new(r))
        })
        .collect();
    for p in [&a, &b] {
        fences[&p.fence_resource("exports")]
            .check(p.fencing())
            .unwrap();
    }

    // A's permit is taken over (its holder paused past the TTL; here forced free), C
    // gets that slot with a higher token and writes; A's late write is refused.
    let slot_name = pool.slot_name(a.slot()).unwrap().clone();
    assert!(backend.force_release(&slot_name).await.unwrap());
    let c = take(&pool, &opts).await;
    assert_eq!(c.slot(), a.slot());
    assert!(c.fencing() > a.fencing());
    let fence = &fences[&a.fence_resource("exports")];
    fence.check(c.fencing()).unwrap();
    assert!(matches!(
        fence.check(a.fencing()),
        Err(Error::Fenced { .. })
    ));
    // B's permit is untouched: it still writes.
    fences[&b.fence_resource("exports")]
        .check(b.fencing())
        .unwrap();
}
