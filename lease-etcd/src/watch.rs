//! The one watch per backend instance on `P/l/`: it tells `renew` which of our keys were
//! deleted or overwritten by someone else (an operator's force release, an expiry) and
//! wakes release waiters, without a request per key.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchOptions};

use crate::state::Shared;

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Watches `prefix` from `shared.watch.next_rev` for as long as the task lives (it is
/// aborted when the backend is dropped). Reconnects with backoff, resuming at the first
/// revision not yet delivered, so no event is skipped; if that revision was compacted
/// away, it flags a resync and starts from "now".
pub(crate) async fn run(
    mut client: WatchClient,
    prefix: Vec<u8>,
    shared: Arc<Shared>,
    request_timeout: Duration,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let next_rev = shared.lock().watch.next_rev;
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
                if resp.created() {
                    st.watch.healthy = true;
                    st.watch.generation += 1;
                    if st.watch.next_rev == 0 {
                        st.watch.next_rev = resp.header().map_or(0, |h| h.revision() + 1);
                    }
                    backoff = BACKOFF_MIN;
                }
                if resp.canceled() {
                    tracing::debug!(reason = resp.cancel_reason(), "etcd watch cancelled");
                    break;
                }
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    let rev = kv.mod_revision();
                    st.on_event(kv.key(), rev, event.event_type() == EventType::Delete);
                    st.watch.next_rev = st.watch.next_rev.max(rev + 1);
                }
            },
            Ok(Err(e)) => tracing::debug!(error = %e, "etcd watch could not be created"),
            Err(_) => tracing::debug!("etcd watch creation timed out"),
        }
        shared.lock().watch.healthy = false;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
