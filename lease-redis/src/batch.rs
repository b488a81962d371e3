//! Combining concurrent calls of one kind (acquire, release) into one script call.
//!
//! At most one call of a kind is in flight per backend. A caller that finds none in
//! flight becomes the leader and sends its own request at once, alone: with one task
//! there is never any waiting, and the single-request script is used. Callers arriving
//! while a call is in flight queue up; when it finishes, the first of them leads the next
//! call, carrying every queued request (up to [`MAX_BATCH`]) in one script run. Under
//! concurrency the server then runs one script per batch instead of one per request,
//! which is where its CPU goes (the Lua call overhead, not the commands).
//!
//! Cancellation: a leader that is dropped while its call is in flight hands leadership
//! on (a drop guard). A batch carrying other callers' requests runs in a task of its own,
//! so that dropping the leader cannot lose their replies.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use lease_core::{Error, Result};
use redis::Value;
use tokio::sync::oneshot;

/// Most requests carried by one script run (bounds the time the server spends in it).
pub(crate) const MAX_BATCH: usize = 128;

/// A reply for one request: the script's per-request value and whether it came from the
/// retry after a dropped connection.
pub(crate) type Reply = Result<(Value, bool)>;

enum Turn<Req> {
    /// The batch carrying this request finished.
    Done(Reply),
    /// Lead the next call; the request comes back with it.
    Lead(Req),
}

struct Waiting<Req> {
    req: Req,
    tx: oneshot::Sender<Turn<Req>>,
}

struct State<Req> {
    busy: bool,
    queue: VecDeque<Waiting<Req>>,
}

/// One kind of call being combined.
pub(crate) struct Combiner<Req> {
    state: Arc<Mutex<State<Req>>>,
}

impl<Req> Default for Combiner<Req> {
    fn default() -> Self {
        Combiner {
            state: Arc::new(Mutex::new(State {
                busy: false,
                queue: VecDeque::new(),
            })),
        }
    }
}

fn lock<Req>(state: &Mutex<State<Req>>) -> MutexGuard<'_, State<Req>> {
    // The lock guards plain data and no code panics while holding it; a poisoned lock
    // still holds consistent data.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands leadership to the first queued caller still waiting, or marks the kind idle.
struct Handoff<Req> {
    state: Arc<Mutex<State<Req>>>,
}

impl<Req> Drop for Handoff<Req> {
    fn drop(&mut self) {
        let mut st = lock(&self.state);
        while let Some(w) = st.queue.pop_front() {
            match w.tx.send(Turn::Lead(w.req)) {
                Ok(()) => return,
                // That caller gave up waiting; its request goes with it.
                Err(_) => continue,
            }
        }
        st.busy = false;
    }
}

fn gone() -> Error {
    Error::unavailable(
        crate::BACKEND,
        "the batched call carrying this request ended without a reply",
    )
}

impl<Req: Send + 'static> Combiner<Req> {
    /// Runs `req`, alone or with others: `run` gets the requests of one call (the
    /// caller's own first) and must return one reply per request, in order.
    pub(crate) async fn call<F, Fut>(&self, req: Req, run: F) -> Reply
    where
        F: FnOnce(Vec<Req>) -> Fut,
        Fut: Future<Output = Vec<Reply>> + Send + 'static,
    {
        let queued = {
            let mut st = lock(&self.state);
            if st.busy {
                let (tx, rx) = oneshot::channel();
                st.queue.push_back(Waiting { req, tx });
                Err(rx)
            } else {
                st.busy = true;
                Ok(req)
            }
        };
        match queued {
            Ok(req) => self.lead(req, run).await,
            Err(rx) => match rx.await {
                Ok(Turn::Done(reply)) => reply,
                Ok(Turn::Lead(req)) => self.lead(req, run).await,
                Err(_) => Err(gone()),
            },
        }
    }

    async fn lead<F, Fut>(&self, own: Req, run: F) -> Reply
    where
        F: FnOnce(Vec<Req>) -> Fut,
        Fut: Future<Output = Vec<Reply>> + Send + 'static,
    {
        let handoff = Handoff {
            state: self.state.clone(),
        };
        let followers: Vec<Waiting<Req>> = {
            let mut st = lock(&self.state);
            let n = st.queue.len().min(MAX_BATCH - 1);
            st.queue.drain(..n).collect()
        };
        if followers.is_empty() {
            // Alone: run inline (the drop guard hands on leadership even if cancelled).
            let reply = run(vec![own])
                .await
                .into_iter()
                .next()
                .unwrap_or_else(|| Err(gone()));
            drop(handoff);
            return reply;
        }
        let mut reqs = Vec::with_capacity(followers.len() + 1);
        reqs.push(own);
        let mut senders = Vec::with_capacity(followers.len());
        for w in followers {
            reqs.push(w.req);
            senders.push(w.tx);
        }
        let fut = run(reqs);
        let (own_tx, own_rx) = oneshot::channel();
        tokio::spawn(async move {
            // Handed on when this task ends, whatever happens to the leader.
            let _handoff = handoff;
            let mut replies = fut.await.into_iter();
            let _ = own_tx.send(replies.next().unwrap_or_else(|| Err(gone())));
            for tx in senders {
                let reply = replies.next().unwrap_or_else(|| Err(gone()));
                let _ = tx.send(Turn::Done(reply));
            }
        });
        own_rx.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// The same error for every request of a failed batch (errors are not `Clone`).
pub(crate) fn share(e: &Error) -> Error {
    match e {
        Error::Timeout { operation, after } => Error::Timeout {
            operation,
            after: *after,
        },
        Error::UnexpectedReply { backend, detail } => Error::UnexpectedReply {
            backend,
            detail: detail.clone(),
        },
        Error::Unavailable { backend, source } => Error::unavailable(backend, source.to_string()),
        Error::Rejected { backend, source } => Error::Rejected {
            backend,
            source: source.to_string().into(),
        },
        other => Error::Backend {
            backend: crate::BACKEND,
            retryable: other.is_retryable(),
            source: other.to_string().into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Requests are numbers; a call answers each with itself, after a pause, and counts
    /// its requests.
    fn run(
        calls: Arc<Mutex<Vec<usize>>>,
    ) -> impl FnOnce(Vec<i64>) -> std::pin::Pin<Box<dyn Future<Output = Vec<Reply>> + Send>> {
        move |reqs| {
            Box::pin(async move {
                calls.lock().unwrap().push(reqs.len());
                tokio::time::sleep(Duration::from_millis(5)).await;
                reqs.into_iter()
                    .map(|r| Ok((Value::Int(r), false)))
                    .collect()
            })
        }
    }

    #[tokio::test]
    async fn alone_runs_alone_and_concurrent_callers_share_calls() {
        let c = Arc::new(Combiner::<i64>::default());
        let calls = Arc::new(Mutex::new(Vec::new()));
        let r = c.call(7, run(calls.clone())).await.unwrap();
        assert_eq!(r.0, Value::Int(7));
        assert_eq!(*calls.lock().unwrap(), vec![1]);

        calls.lock().unwrap().clear();
        let tasks: Vec<_> = (0..40i64)
            .map(|i| {
                let (c, calls) = (c.clone(), calls.clone());
                tokio::spawn(async move { c.call(i, run(calls)).await.unwrap().0 })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(
                t.await.unwrap(),
                Value::Int(i as i64),
                "every caller gets its own reply"
            );
        }
        let sizes = calls.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 40);
        assert!(sizes.len() < 40, "no call was shared: {sizes:?}");
        assert!(!lock(&c.state).busy);
    }

    #[tokio::test]
    async fn a_cancelled_leader_hands_on() {
        let c = Arc::new(Combiner::<i64>::default());
        let started = Arc::new(AtomicUsize::new(0));
        // A leader whose call never ends, cancelled while queued callers wait.
        let leader = {
            let (c, started) = (c.clone(), started.clone());
            tokio::spawn(async move {
                c.call(0, move |_| {
                    Box::pin(async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<()>().await;
                        Vec::new()
                    })
                        as std::pin::Pin<Box<dyn Future<Output = Vec<Reply>> + Send>>
                })
                .await
            })
        };
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let calls = Arc::new(Mutex::new(Vec::new()));
        let waiters: Vec<_> = (1..4i64)
            .map(|i| {
                let (c, calls) = (c.clone(), calls.clone());
                tokio::spawn(async move { c.call(i, run(calls)).await.unwrap().0 })
            })
            .collect();
        while lock(&c.state).queue.len() < 3 {
            tokio::task::yield_now().await;
        }
        leader.abort();
        for (i, w) in waiters.into_iter().enumerate() {
            assert_eq!(w.await.unwrap(), Value::Int(i as i64 + 1));
        }
        assert!(!lock(&c.state).busy);
    }
}
