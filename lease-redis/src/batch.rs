//! Combining concurrent calls of one kind (acquire, release) into one script call.
//!
//! A caller that finds nothing of its kind in flight runs its request itself, inline:
//! with one task there is no queue, no task and no channel between the caller and the
//! connection. A caller that finds a call in flight queues its request; a flusher task
//! sends everything queued (up to [`MAX_BATCH`]) in one run, one run at a time, and
//! stops when the queue is empty. So at most two runs of a kind are in flight (one
//! inline, one from the flusher), and under concurrency the server runs one script per
//! batch instead of one per request, which is where its CPU goes (the Lua call
//! overhead, not the commands).
//!
//! Cancellation: queued callers only wait for a reply, and the flusher's runs belong to
//! the flusher task, so a caller that gives up (timeout, drop) affects nobody else, and
//! queued callers never depend on an inline caller being polled. A queued request whose
//! caller gave up before it was sent is skipped; one whose reply can no longer be
//! delivered is handed to the `undelivered` hook with its reply, and an inline request
//! whose caller gave up mid-run with no reply (its outcome is unknown). If the flusher
//! task itself dies (runtime shutdown), the queued callers get an error and the next
//! caller starts a new flusher.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
    flushing: bool,
    /// An inline call is in flight.
    inline: bool,
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
                flushing: false,
                inline: false,
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
/// Marks the flusher stopped when there are none.
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
        st.flushing = false;
    }
    batch
}

/// Ends a flusher: marks it stopped and fails whatever is still queued, so that nobody
/// waits on a flusher that is gone. Only does anything when the flusher did not finish
/// normally (panic, runtime shutdown).
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
        st.flushing = false;
        // Dropping the senders wakes their callers with an error.
        st.queue.clear();
    }
}

/// An inline call in flight: marks the kind free again when it ends, and reports a
/// request whose caller gave up mid-run.
struct InlineGuard<'a, Req, U: Fn(Req, Option<Reply>)> {
    state: &'a Mutex<State<Req>>,
    /// Still in flight (taken when the reply is in).
    req: Option<Req>,
    undelivered: &'a U,
}

impl<Req, U: Fn(Req, Option<Reply>)> Drop for InlineGuard<'_, Req, U> {
    fn drop(&mut self) {
        lock(self.state).inline = false;
        if let Some(req) = self.req.take() {
            (self.undelivered)(req, None);
        }
    }
}

fn gone() -> Error {
    Error::unavailable(
        crate::BACKEND,
        "the batched call carrying this request ended without a reply",
    )
}

fn short(n: usize) -> Error {
    Error::unexpected(
        crate::BACKEND,
        format!("a script run returned fewer than {n} replies"),
    )
}

/// Sends queued requests until the queue is empty.
async fn flush<Req, F, Fut, U>(state: Arc<Mutex<State<Req>>>, run: F, undelivered: U)
where
    F: Fn(&[Req]) -> Fut,
    Fut: Future<Output = Vec<Reply>>,
    U: Fn(Req, Option<Reply>),
{
    let mut guard = FlusherGuard {
        state: state.clone(),
        finished: false,
    };
    loop {
        let batch = next_batch(&state);
        if batch.is_empty() {
            break;
        }
        let n = batch.len();
        let (reqs, senders): (Vec<Req>, Vec<_>) = batch.into_iter().map(|w| (w.req, w.tx)).unzip();
        if n > 1 {
            tracing::trace!(requests = n, "redis calls combined into one script run");
        }
        let mut replies = run(&reqs).await.into_iter();
        for (req, tx) in reqs.into_iter().zip(senders) {
            let reply = replies.next().unwrap_or_else(|| Err(short(n)));
            if let Err(reply) = tx.send(reply) {
                undelivered(req, Some(reply));
            }
        }
    }
    guard.finished = true;
}

impl<Req: Send + 'static> Combiner<Req> {
    /// Runs `req`, alone or with others. `run` starts the script run for some requests
    /// (it builds the command from them at once; the future it returns owns what it
    /// needs) and must answer them in order. `undelivered` gets a request whose caller
    /// is gone: with its reply, or with `None` when the caller gave up while its inline
    /// run was in flight (the request may or may not have run). A queued request waits
    /// at most `limit` (then [`Error::Timeout`] for `operation`); `run` bounds its own
    /// calls.
    pub(crate) async fn call<F, Fut, U>(
        &self,
        req: Req,
        operation: &'static str,
        limit: Duration,
        run: F,
        undelivered: U,
    ) -> Reply
    where
        F: Fn(&[Req]) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<Reply>> + Send + 'static,
        U: Fn(Req, Option<Reply>) + Send + 'static,
    {
        enum Path<Req> {
            Inline(Req),
            Queued(oneshot::Receiver<Reply>, bool),
        }
        let path = {
            let mut st = lock(&self.state);
            if !st.inline && !st.flushing {
                st.inline = true;
                Path::Inline(req)
            } else {
                let (tx, rx) = oneshot::channel();
                st.queue.push_back(Waiting { req, tx });
                Path::Queued(rx, !std::mem::replace(&mut st.flushing, true))
            }
        };
        let rx = match path {
            Path::Inline(req) => {
                let fut = run(std::slice::from_ref(&req));
                let mut guard = InlineGuard {
                    state: &self.state,
                    req: Some(req),
                    undelivered: &undelivered,
                };
                let reply = fut
                    .await
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| Err(short(1)));
                guard.req = None;
                return reply;
            }
            Path::Queued(rx, start) => {
                if start {
                    tokio::spawn(flush(self.state.clone(), run, undelivered));
                }
                rx
            }
        };
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err(Error::Timeout {
                operation,
                after: limit,
            }),
        }
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

    type Calls = Arc<Mutex<Vec<usize>>>;
    /// Requests whose caller was gone, with whether a reply came.
    type Lost = Arc<Mutex<Vec<(i64, bool)>>>;
    type RunFuture = std::pin::Pin<Box<dyn Future<Output = Vec<Reply>> + Send>>;

    /// Requests are numbers; a run answers each with itself after `pause`, and records
    /// its size when it starts.
    fn run(calls: Calls, pause: Duration) -> impl Fn(&[i64]) -> RunFuture + Send + 'static {
        move |reqs| {
            calls.lock().unwrap().push(reqs.len());
            let reqs = reqs.to_vec();
            Box::pin(async move {
                tokio::time::sleep(pause).await;
                reqs.into_iter()
                    .map(|r| Ok((Value::Int(r), false)))
                    .collect()
            })
        }
    }

    fn lost(into: Lost) -> impl Fn(i64, Option<Reply>) + Send + 'static {
        move |req, reply| into.lock().unwrap().push((req, reply.is_some()))
    }

    const LIMIT: Duration = Duration::from_secs(30);

    async fn until_idle(c: &Combiner<i64>) {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                {
                    let st = lock(&c.state);
                    if !st.flushing && !st.inline {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn alone_runs_inline_and_concurrent_callers_share_runs() {
        let c = Arc::new(Combiner::<i64>::default());
        let (calls, gone): (Calls, Lost) = Default::default();
        let pause = Duration::from_millis(5);
        let r = c
            .call(7, "t", LIMIT, run(calls.clone(), pause), lost(gone.clone()))
            .await
            .unwrap();
        assert_eq!(r.0, Value::Int(7));
        assert_eq!(*calls.lock().unwrap(), vec![1]);
        until_idle(&c).await;

        calls.lock().unwrap().clear();
        let tasks: Vec<_> = (0..40i64)
            .map(|i| {
                let (c, calls, gone) = (c.clone(), calls.clone(), gone.clone());
                tokio::spawn(async move {
                    c.call(i, "t", LIMIT, run(calls, pause), lost(gone))
                        .await
                        .unwrap()
                        .0
                })
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
        until_idle(&c).await;
    }

    /// Callers that give up do not stall anyone: queued ones are skipped, a reply that
    /// finds its caller gone goes to the `undelivered` hook, and so does an inline
    /// request whose caller left mid-run (without a reply).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_that_give_up_are_skipped_or_reported() {
        let c = Arc::new(Combiner::<i64>::default());
        let (calls, gone): (Calls, Lost) = Default::default();
        let pause = Duration::from_millis(300);
        let impatient = |i: i64, after: u64| {
            let (c, calls, gone) = (c.clone(), calls.clone(), gone.clone());
            tokio::spawn(async move {
                tokio::time::timeout(
                    Duration::from_millis(after),
                    c.call(i, "t", LIMIT, run(calls, pause), lost(gone)),
                )
                .await
                .is_err()
            })
        };
        let started = |n: usize| {
            let calls = calls.clone();
            async move {
                while calls.lock().unwrap().len() < n {
                    tokio::task::yield_now().await;
                }
            }
        };
        // 0 runs inline (300 ms) and gives up after 100 ms; 1 queues, so the flusher
        // sends it at once (300 ms), and gives up after 100 ms too; 2 and 3 queue behind
        // the flusher's run and give up after 20 ms, before they are sent. (Wide margins:
        // a loaded machine only delays the later callers' start.)
        let first = impatient(0, 100);
        started(1).await;
        let second = impatient(1, 100);
        started(2).await;
        let queued = [impatient(2, 20), impatient(3, 20)];
        for q in queued {
            assert!(q.await.unwrap(), "gave up");
        }
        assert!(first.await.unwrap(), "gave up");
        assert!(second.await.unwrap(), "gave up");
        // A patient caller after all that is served.
        let r = c
            .call(4, "t", LIMIT, run(calls.clone(), pause), lost(gone.clone()))
            .await
            .unwrap();
        assert_eq!(r.0, Value::Int(4));
        until_idle(&c).await;
        let sizes = calls.lock().unwrap().clone();
        assert_eq!(sizes, vec![1, 1, 1], "2 and 3 were never sent");
        let mut gone = gone.lock().unwrap().clone();
        gone.sort();
        assert_eq!(
            gone,
            vec![(0, false), (1, true)],
            "0 left mid-run, 1's reply was undeliverable"
        );
    }

    /// A queued caller is bounded by the limit even when the run it waits for hangs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_callers_are_bounded() {
        let c = Arc::new(Combiner::<i64>::default());
        let (calls, gone): (Calls, Lost) = Default::default();
        let hang = Duration::from_secs(3600);
        let c0 = c.clone();
        let (calls0, gone0) = (calls.clone(), gone.clone());
        let inline =
            tokio::spawn(
                async move { c0.call(0, "t", LIMIT, run(calls0, hang), lost(gone0)).await },
            );
        while calls.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let r = c
            .call(
                1,
                "t",
                Duration::from_millis(50),
                run(calls.clone(), hang),
                lost(gone.clone()),
            )
            .await;
        assert!(
            matches!(r, Err(Error::Timeout { operation: "t", .. })),
            "{r:?}"
        );
        inline.abort();
    }
}
