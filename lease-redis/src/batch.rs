//! Combining concurrent calls of one kind (acquire, release) into one script call.
//!
//! At most one script run of a kind is in flight per backend, driven by a flusher task.
//! A caller that finds no flusher starts one with its own request (alone: with one task
//! there is never any waiting). Callers arriving while a run is in flight queue up; when
//! the run finishes, the flusher sends everything queued (up to [`MAX_BATCH`]) in the
//! next run, and stops when the queue is empty. Under concurrency the server then runs
//! one script per batch instead of one per request, which is where its CPU goes (the Lua
//! call overhead, not the commands).
//!
//! Cancellation: callers only wait for a reply; the runs belong to the flusher task, so
//! a caller that gives up (timeout, drop) affects nobody else. A request whose caller
//! gave up before it was sent is skipped; one whose reply can no longer be delivered is
//! handed to the `undelivered` hook (acquire releases what it took for nobody). If the
//! flusher task itself dies (runtime shutdown), the queued callers get an error and the
//! next caller starts a new flusher.

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

struct Waiting<Req> {
    req: Req,
    tx: oneshot::Sender<Reply>,
}

struct State<Req> {
    /// A flusher task is running.
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

/// Takes the next batch: queued requests whose callers still wait, up to [`MAX_BATCH`].
/// Marks the kind idle when there are none.
fn next_batch<Req>(state: &Mutex<State<Req>>) -> Vec<Waiting<Req>> {
    let mut st = lock(state);
    let mut batch = Vec::new();
    while batch.len() < MAX_BATCH {
        match st.queue.pop_front() {
            // That caller gave up before its request was sent: skip it.
            Some(w) if w.tx.is_closed() => continue,
            Some(w) => batch.push(w),
            None => break,
        }
    }
    if batch.is_empty() {
        st.busy = false;
    }
    batch
}

/// Ends a flusher: marks the kind idle and fails whatever is still queued, so that
/// nobody waits on a flusher that is gone. Only does anything when the flusher did not
/// finish normally (panic, runtime shutdown).
struct FlusherGuard<Req> {
    state: Arc<Mutex<State<Req>>>,
    finished: bool,
}

impl<Req> Drop for FlusherGuard<Req> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut st = lock(&self.state);
        st.busy = false;
        // Dropping the senders wakes their callers with an error.
        st.queue.clear();
    }
}

fn gone() -> Error {
    Error::unavailable(
        crate::BACKEND,
        "the batched call carrying this request ended without a reply",
    )
}

impl<Req: Send + 'static> Combiner<Req> {
    /// Runs `req`, alone or with others. `run` gets the requests of one script run and
    /// must return each with its reply, in order; `undelivered` gets each request whose
    /// caller is gone by the time its reply is ready.
    pub(crate) async fn call<F, Fut, U>(&self, req: Req, run: F, undelivered: U) -> Reply
    where
        F: Fn(Vec<Req>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<(Req, Reply)>> + Send + 'static,
        U: Fn(Req, Reply) + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = lock(&self.state);
            st.queue.push_back(Waiting { req, tx });
            !std::mem::replace(&mut st.busy, true)
        };
        if start {
            let state = self.state.clone();
            tokio::spawn(async move {
                let mut guard = FlusherGuard {
                    state: state.clone(),
                    finished: false,
                };
                loop {
                    let batch = next_batch(&state);
                    if batch.is_empty() {
                        break;
                    }
                    let (reqs, senders): (Vec<Req>, Vec<_>) =
                        batch.into_iter().map(|w| (w.req, w.tx)).unzip();
                    let n = reqs.len();
                    let mut replies = run(reqs).await.into_iter();
                    for tx in senders {
                        match replies.next() {
                            Some((req, reply)) => {
                                if let Err(reply) = tx.send(reply) {
                                    undelivered(req, reply);
                                }
                            }
                            None => {
                                let _ = tx.send(Err(Error::unexpected(
                                    crate::BACKEND,
                                    format!("a script run returned fewer than {n} replies"),
                                )));
                            }
                        }
                    }
                }
                guard.finished = true;
            });
        }
        rx.await.unwrap_or_else(|_| Err(gone()))
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
    use std::time::Duration;

    type Calls = Arc<Mutex<Vec<usize>>>;
    type Lost = Arc<Mutex<Vec<i64>>>;
    type RunFuture = std::pin::Pin<Box<dyn Future<Output = Vec<(i64, Reply)>> + Send>>;

    /// Requests are numbers; a run answers each with itself after `pause`, and records
    /// its size.
    fn run(calls: Calls, pause: Duration) -> impl Fn(Vec<i64>) -> RunFuture + Send + 'static {
        move |reqs| {
            let calls = calls.clone();
            Box::pin(async move {
                calls.lock().unwrap().push(reqs.len());
                tokio::time::sleep(pause).await;
                reqs.into_iter()
                    .map(|r| (r, Ok((Value::Int(r), false))))
                    .collect()
            })
        }
    }

    fn lost(into: Lost) -> impl Fn(i64, Reply) + Send + 'static {
        move |req, _| into.lock().unwrap().push(req)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn alone_runs_alone_and_concurrent_callers_share_runs() {
        let c = Arc::new(Combiner::<i64>::default());
        let (calls, gone): (Calls, Lost) = Default::default();
        let pause = Duration::from_millis(5);
        let r = c
            .call(7, run(calls.clone(), pause), lost(gone.clone()))
            .await
            .unwrap();
        assert_eq!(r.0, Value::Int(7));
        assert_eq!(*calls.lock().unwrap(), vec![1]);

        calls.lock().unwrap().clear();
        let tasks: Vec<_> = (0..40i64)
            .map(|i| {
                let (c, calls, gone) = (c.clone(), calls.clone(), gone.clone());
                tokio::spawn(
                    async move { c.call(i, run(calls, pause), lost(gone)).await.unwrap().0 },
                )
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
        assert!(sizes.len() < 40, "no run was shared: {sizes:?}");
        assert!(gone.lock().unwrap().is_empty());
        // The flusher ends once the queue is empty.
        tokio::time::timeout(Duration::from_secs(5), async {
            while lock(&c.state).busy {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap();
    }

    /// Callers that give up do not stall anyone: queued ones are skipped, and a reply
    /// that finds its caller gone goes to the `undelivered` hook.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_that_give_up_are_skipped_or_reported() {
        let c = Arc::new(Combiner::<i64>::default());
        let (calls, gone): (Calls, Lost) = Default::default();
        let pause = Duration::from_millis(300);
        // 0 starts a run of 300 ms; 1 and 2 queue behind it and give up after 20 ms,
        // before their requests are sent; 0 gives up after 100 ms, while its run is in
        // flight. (Wide margins: a loaded machine only delays the queued ones' start.)
        let impatient = |i: i64, after: u64| {
            let (c, calls, gone) = (c.clone(), calls.clone(), gone.clone());
            tokio::spawn(async move {
                tokio::time::timeout(
                    Duration::from_millis(after),
                    c.call(i, run(calls, pause), lost(gone)),
                )
                .await
                .is_err()
            })
        };
        let first = impatient(0, 100);
        // Wait until 0's run has started (so that 1 and 2 queue behind it).
        while calls.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let queued = [impatient(1, 20), impatient(2, 20)];
        for q in queued {
            assert!(q.await.unwrap(), "gave up");
        }
        assert!(first.await.unwrap(), "gave up");
        // A patient caller after all that is served.
        let r = c
            .call(3, run(calls.clone(), pause), lost(gone.clone()))
            .await
            .unwrap();
        assert_eq!(r.0, Value::Int(3));
        let sizes = calls.lock().unwrap().clone();
        assert_eq!(sizes, vec![1, 1], "1 and 2 were never sent");
        assert_eq!(
            *gone.lock().unwrap(),
            vec![0],
            "0's reply was undeliverable"
        );
    }
}
