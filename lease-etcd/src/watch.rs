//! The one watch per backend instance on `P/l/`, while the instance holds or waits for a
//! key: it tells `renew` which of our keys were deleted or overwritten by someone else (an
//! operator's force release, an expiry) and wakes release waiters, without a request per
//! key.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchOptions};

use crate::state::Shared;

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Watches `prefix` from `shared.watch.next_rev` until the watch is stopped (it is aborted
/// when the instance goes idle or the backend is dropped; `epoch` tells it whether it is
/// still the current watch whenever it takes the lock). Reconnects with backoff, resuming
/// at the first revision not yet delivered, so no event is skipped; if that revision was
/// compacted away, it flags every held key for verification and starts from "now".
pub(crate) async fn run(
    mut client: WatchClient,
    prefix: Vec<u8>,
    shared: Arc<Shared>,
    epoch: u64,
    request_timeout: Duration,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let next_rev = {
            let st = shared.lock();
            if st.watch.epoch != epoch {
                return;
            }
            st.watch.next_rev
        };
        let mut options = WatchOptions::new().with_prefix();
        if next_rev > 0 {
            options = options.with_start_revision(next_rev);
        }
        let stream =
            tokio::time::timeout(request_timeout, client.watch(prefix.clone(), Some(options)))
                .await;
        match stream {
            Ok(Ok(mut stream)) => loop {
                let resp = match stream.message().await {
                    Ok(Some(resp)) => resp,
                    Ok(None) => {
                        tracing::debug!("etcd watch stream ended; reconnecting");
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd watch stream failed; reconnecting");
                        break;
                    }
                };
                let mut st = shared.lock();
                if st.watch.epoch != epoch {
                    return;
                }
                if resp.compact_revision() > 0 {
                    tracing::warn!(
                        compact_revision = resp.compact_revision(),
                        "etcd history needed by the lease watch was compacted; verifying held \
                         leases on the store"
                    );
                    st.on_history_lost();
                    st.watch.next_rev = 0;
                    break;
                }
                if resp.canceled() {
                    tracing::debug!(reason = resp.cancel_reason(), "etcd watch cancelled");
                    break;
                }
                if resp.created() {
                    let Some(now) = resp.header().map(|h| h.revision() + 1) else {
                        tracing::debug!("etcd watch created without a header; reconnecting");
                        break;
                    };
                    // Events up to the store's revision at creation may still be on their
                    // way (replayed from `next_rev`; etcd 3.4 has no marker for when the
                    // replay is done): `renew` trusts the watch only for what is known of
                    // a key from this revision on, and asks etcd about the rest once.
                    st.watch.from_rev = now;
                    st.saw_rev(now - 1);
                    if st.watch.next_rev == 0 {
                        // Restarted from "now" after a compaction: waiters look again.
                        st.watch.next_rev = now;
                        st.watch.cont_from = now;
                        st.wake_all();
                    }
                    st.watch.healthy = true;
                    backoff = BACKOFF_MIN;
                }
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    let rev = kv.mod_revision();
                    // Every key of a name starts with the name's key (a record's key is
                    // it followed by its etcd lease id, see `keys::owned_key`); what is
                    // kept per name is kept under the name's key.
                    if let Some(name_key) = crate::keys::name_key_of(&prefix, kv.key()) {
                        st.on_event(name_key, rev, event.event_type() == EventType::Delete);
                    }
                    st.watch.next_rev = st.watch.next_rev.max(rev + 1);
                    st.saw_rev(rev);
                }
            },
            Ok(Err(e)) => tracing::debug!(error = %e, "etcd watch could not be created"),
            Err(_) => tracing::debug!("etcd watch creation timed out"),
        }
        {
            let mut st = shared.lock();
            if st.watch.epoch != epoch {
                return;
            }
            st.watch.healthy = false;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
