//! Connections a backend keeps between its statements instead of giving them back to
//! their pool after each one.
//!
//! A pool may do work on every return: `sqlx` pings each connection that goes back (one
//! more round trip per statement, for the client and the server alike). A backend that
//! runs one statement per call can keep the connection of a call that ended well in an
//! [`IdleList`] and take it again for its next call. A call that ends in an error or is
//! dropped mid-way drops its connection instead, so that it goes back through the pool's
//! own checks. Kept connections go back to the pool, through the same checks, after
//! [`IdleList::new`]'s `max_idle` without use and `max_age` after they were first kept:
//! the pool's health checks and lifetime limits still see every connection now and then.
//!
//! ```
//! use std::time::Duration;
//! use lease_core::raw::idle::{IdleList, Kept};
//!
//! let list: IdleList<String> = IdleList::new(4, Duration::from_secs(1), Duration::from_secs(60));
//! assert!(list.take().is_none());
//! list.put(Kept::new("a connection".to_owned()));
//! let kept = list.take().expect("kept");
//! assert_eq!(kept.get(), "a connection");
//! ```

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long the backends of this workspace keep a connection unused before it goes back
/// to its pool (their `max_idle`).
pub const KEEP_IDLE: Duration = Duration::from_secs(1);

/// How long after it was first kept a connection goes back to its pool (and its checks:
/// the pool's ping, its `max_lifetime`) even while in use (their `max_age`).
pub const KEEP_AT_MOST: Duration = Duration::from_secs(60);

/// Drops the stale items of `owner`'s list ([`IdleList::drop_stale`]) every `every`, in a
/// task of its own (on the current tokio runtime), until `owner` is dropped: a list
/// nobody takes from does not keep its items for ever.
pub fn sweep<O, T>(owner: std::sync::Weak<O>, list: fn(&O) -> Option<&IdleList<T>>, every: Duration)
where
    O: Send + Sync + 'static,
    T: Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(owner) = owner.upgrade() else { break };
            if let Some(list) = list(&owner) {
                list.drop_stale();
            }
        }
    });
}

/// An item kept in an [`IdleList`], with the time it was first kept.
#[derive(Debug)]
pub struct Kept<T> {
    item: T,
    since: Instant,
}

impl<T> Kept<T> {
    /// `item`, kept from now on.
    pub fn new(item: T) -> Self {
        Kept {
            item,
            since: Instant::now(),
        }
    }

    /// The item.
    pub fn get(&self) -> &T {
        &self.item
    }

    /// The item, to use.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.item
    }

    /// The item, no longer kept.
    pub fn into_inner(self) -> T {
        self.item
    }
}

/// Items kept for reuse, the last one put taken first, at most `cap` of them.
///
/// [`IdleList::checkout`] takes its connections in turn (first come, first served), from
/// the list first, then from the pool: a caller never waits on a full pool while the
/// list's connections go round among later callers.
#[derive(Debug)]
pub struct IdleList<T> {
    items: Mutex<Vec<(Kept<T>, Instant)>>,
    cap: usize,
    max_idle: Duration,
    max_age: Duration,
    /// Callers of `checkout`, in turn.
    queue: tokio::sync::Mutex<()>,
    /// Told of every `put`.
    put_signal: Notify,
}

impl<T> IdleList<T> {
    /// A list of at most `cap` items; an item unused for `max_idle`, or first kept
    /// `max_age` ago, is not taken again (it is dropped instead).
    pub fn new(cap: usize, max_idle: Duration, max_age: Duration) -> Self {
        IdleList {
            items: Mutex::new(Vec::with_capacity(cap)),
            cap,
            max_idle,
            max_age,
            queue: tokio::sync::Mutex::new(()),
            put_signal: Notify::new(),
        }
    }

    /// An item for one use, callers served in turn: a kept one ([`IdleList::take`]), else
    /// one the pool has idle (`idle_in_pool`), else a new one from the pool (`acquire`)
    /// when `pool_has_room`. With the pool full, waits for whichever comes first: an
    /// item put back here, or one from `acquire` (the pool's own queue).
    ///
    /// Cancel safe: dropped while waiting, it has taken nothing (a dropped `acquire` must
    /// leave nothing taken, as a pool's does).
    pub async fn checkout<E, F, Fut>(
        &self,
        idle_in_pool: impl Fn() -> Option<T>,
        pool_has_room: impl Fn() -> bool,
        acquire: F,
    ) -> Result<Checkout<'_, T>, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let kept = {
            let _turn = self.queue.lock().await;
            self.next(idle_in_pool, pool_has_room, acquire).await?
        };
        Ok(Checkout {
            list: Some(self),
            item: kept,
        })
    }

    /// [`IdleList::checkout`] on `list`, or with no list an item from `acquire` that is
    /// never kept ([`Checkout::unkept`]): for a backend that keeps items only on some
    /// pools.
    ///
    /// Cancel safe, as [`IdleList::checkout`].
    pub async fn checkout_from<E, F, Fut>(
        list: Option<&IdleList<T>>,
        idle_in_pool: impl Fn() -> Option<T>,
        pool_has_room: impl Fn() -> bool,
        acquire: F,
    ) -> Result<Checkout<'_, T>, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match list {
            Some(list) => list.checkout(idle_in_pool, pool_has_room, acquire).await,
            None => acquire().await.map(Checkout::unkept),
        }
    }

    async fn next<E, F, Fut>(
        &self,
        idle_in_pool: impl Fn() -> Option<T>,
        pool_has_room: impl Fn() -> bool,
        acquire: F,
    ) -> Result<Kept<T>, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        loop {
            if let Some(kept) = self.take() {
                return Ok(kept);
            }
            if let Some(item) = idle_in_pool() {
                return Ok(Kept::new(item));
            }
            if pool_has_room() {
                return acquire().await.map(Kept::new);
            }
            let put = self.put_signal.notified();
            tokio::pin!(put);
            // Registered before looking again, so that a put in between is not missed.
            put.as_mut().enable();
            if let Some(kept) = self.take() {
                return Ok(kept);
            }
            tokio::select! {
                biased;
                () = &mut put => {}
                item = acquire() => return item.map(Kept::new),
            }
        }
    }

    /// The item put last, if it has not been idle for `max_idle`. Items idle longer are
    /// dropped, outside the list's lock (they were all put earlier than the one found
    /// idle too long).
    pub fn take(&self) -> Option<Kept<T>> {
        let now = Instant::now();
        let stale = {
            let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
            match items.pop() {
                None => return None,
                Some((kept, put)) if now.saturating_duration_since(put) < self.max_idle => {
                    return Some(kept);
                }
                Some(stale) => {
                    let mut all = std::mem::take(&mut *items);
                    all.push(stale);
                    all
                }
            }
        };
        drop(stale);
        None
    }

    /// Keeps `kept` for the next [`IdleList::take`], unless the list is full or the item
    /// was first kept `max_age` ago: then it is dropped.
    pub fn put(&self, kept: Kept<T>) {
        let now = Instant::now();
        if now.saturating_duration_since(kept.since) >= self.max_age {
            return;
        }
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        if items.len() < self.cap {
            items.push((kept, now));
            drop(items);
            self.put_signal.notify_waiters();
            return;
        }
        drop(items);
        drop(kept);
    }

    /// Drops every item unused for `max_idle` (for a task that runs now and then, so that
    /// a list nobody takes from does not keep its items for ever).
    pub fn drop_stale(&self) {
        let now = Instant::now();
        let stale: Vec<(Kept<T>, Instant)> = {
            let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
            // Oldest first: the items put before the first fresh one are stale.
            let fresh = items
                .iter()
                .position(|(_, put)| now.saturating_duration_since(*put) < self.max_idle)
                .unwrap_or(items.len());
            items.drain(..fresh).collect()
        };
        drop(stale);
    }

    /// How many items are kept now.
    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no item is kept now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An item for one use, from [`IdleList::checkout`] (or [`Checkout::unkept`]).
/// [`Checkout::done`] keeps it for the next use if this one ended well; dropped
/// otherwise, it goes back where it came from (a pool connection's drop returns it to the
/// pool, whose checks then find a connection a dropped statement left half-way).
#[derive(Debug)]
pub struct Checkout<'a, T> {
    list: Option<&'a IdleList<T>>,
    item: Kept<T>,
}

impl<T> Checkout<'_, T> {
    /// `item` for one use, never kept (for a backend that keeps nothing).
    pub fn unkept(item: T) -> Self {
        Checkout {
            list: None,
            item: Kept::new(item),
        }
    }

    /// The item, to use.
    pub fn get_mut(&mut self) -> &mut T {
        self.item.get_mut()
    }

    /// Keeps the item for the next checkout if `outcome` is a success; drops it
    /// otherwise.
    pub fn done<R, E>(self, outcome: &Result<R, E>) {
        if let (Some(list), Ok(_)) = (self.list, outcome) {
            list.put(self.item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_last_item_put_is_taken_first_until_it_has_idled_too_long() {
        let list = IdleList::new(2, Duration::from_secs(1), Duration::from_secs(60));
        list.put(Kept::new(1));
        list.put(Kept::new(2));
        // Full: a third is dropped.
        list.put(Kept::new(3));
        assert_eq!(list.len(), 2);
        assert_eq!(list.take().map(Kept::into_inner), Some(2));
        let one = list.take().expect("the first item");
        assert_eq!(*one.get(), 1);
        list.put(one);
        tokio::time::advance(Duration::from_millis(600)).await;
        list.put(Kept::new(4));
        tokio::time::advance(Duration::from_millis(500)).await;
        // `1` has idled 1.1 s, `4` 0.5 s.
        list.drop_stale();
        assert_eq!(list.len(), 1);
        assert_eq!(list.take().map(Kept::into_inner), Some(4));
        list.put(Kept::new(5));
        tokio::time::advance(Duration::from_millis(1001)).await;
        // Idle for more than a second: dropped, and with it every item put before it.
        assert!(list.take().is_none());
        assert!(list.is_empty());
    }

    /// A pool of one item, which the list keeps between uses: a second caller waits for
    /// the first one's put, in turn, even though the pool's queue never sees it back.
    #[tokio::test(start_paused = true)]
    async fn a_caller_facing_a_full_pool_gets_the_item_put_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let list = std::sync::Arc::new(IdleList::new(
            4,
            Duration::from_secs(1),
            Duration::from_secs(60),
        ));
        let opened = std::sync::Arc::new(AtomicUsize::new(0));
        let checkout = |list: std::sync::Arc<IdleList<usize>>,
                        opened: std::sync::Arc<AtomicUsize>| async move {
            list.checkout(
                || None,
                || opened.load(Ordering::SeqCst) == 0,
                || {
                    let opened = opened.clone();
                    async move {
                        if opened.fetch_add(1, Ordering::SeqCst) == 0 {
                            Ok::<usize, ()>(7)
                        } else {
                            // A full pool's queue: nothing comes back through it.
                            std::future::pending().await
                        }
                    }
                },
            )
            .await
            .map(|c| c.item)
        };
        let first = checkout(list.clone(), opened.clone())
            .await
            .expect("opened");
        let waiting = tokio::spawn(checkout(list.clone(), opened.clone()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !waiting.is_finished(),
            "the pool is full and nothing was put back"
        );
        list.put(first);
        let second = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the item put back reaches the waiting caller")
            .expect("joined")
            .expect("an item");
        assert_eq!(second.into_inner(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_first_kept_long_ago_is_not_kept_again() {
        let list = IdleList::new(2, Duration::from_secs(1), Duration::from_secs(60));
        let mut kept = Kept::new("conn");
        for _ in 0..59 {
            list.put(kept);
            tokio::time::advance(Duration::from_millis(999)).await;
            kept = list.take().expect("in use, so kept");
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(*kept.get_mut(), "conn");
        // 60 s since it was first kept: it goes back where it came from.
        tokio::time::advance(Duration::from_secs(1)).await;
        list.put(kept);
        assert!(list.take().is_none());
    }
}
