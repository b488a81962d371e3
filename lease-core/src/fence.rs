//! The resource side of fencing: a write carries its holder's fencing token, and the
//! protected resource accepts it only if the token is not below the highest token it has
//! seen (docs/fencing.md in the repository).
//!
//! The stores' own fences live beside their backends (`lease_postgres::fence`,
//! `lease_mysql::fence`, `lease_redis::fence`), for writes to those databases inside the
//! caller's own transaction or script. This module has the rule itself,
//! [`admits`], and [`Fence`], the rule kept in memory for a resource in this process (a
//! service that owns a file, a device, an in-process cache that several leases feed).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;
use crate::types::FencingToken;

/// Whether a resource that has seen `highest` (none yet: `None`) accepts a write carrying
/// `token`: not below the highest. An equal token is accepted: the same holder writes
/// more than once under one acquisition.
///
/// ```
/// use lease_core::{FencingToken, fence::admits};
/// assert!(admits(None, FencingToken(3)));
/// assert!(admits(Some(FencingToken(3)), FencingToken(3)));
/// assert!(!admits(Some(FencingToken(4)), FencingToken(3)));
/// ```
pub fn admits(highest: Option<FencingToken>, token: FencingToken) -> bool {
    highest.is_none_or(|h| token >= h)
}

/// The highest token seen by one resource, kept in memory: [`Fence::check`] accepts a
/// token not below it and records it, atomically, from any number of threads.
///
/// Use it where the resource lives in this process; a resource in a database needs the
/// check inside the write's own transaction (the stores' fences), because a check made
/// before a write and apart from it leaves room for a newer holder's write in between.
/// A `Fence` starts empty when the process starts: keep one per resource for the
/// resource's lifetime.
///
/// ```
/// use lease_core::{Error, FencingToken, fence::Fence};
/// let fence = Fence::new("report.csv");
/// fence.check(FencingToken(7)).unwrap();
/// fence.check(FencingToken(8)).unwrap();
/// // The holder of token 7 was paused past its TTL; the holder of 8 has written since.
/// match fence.check(FencingToken(7)) {
///     Err(Error::Fenced { token: 7, highest: 8, .. }) => {}
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug)]
pub struct Fence {
    resource: String,
    /// The highest token accepted; 0 for none (tokens start at 1).
    highest: AtomicU64,
}

impl Fence {
    /// An empty fence for the resource named `resource` (used in errors).
    pub fn new(resource: impl Into<String>) -> Self {
        Fence {
            resource: resource.into(),
            highest: AtomicU64::new(0),
        }
    }

    /// Accepts `token` if it is not below the highest token seen, and records it.
    ///
    /// Errors: [`Error::Fenced`] for a stale token (nothing recorded).
    pub fn check(&self, token: FencingToken) -> Result<(), Error> {
        let mut seen = self.highest.load(Ordering::Acquire);
        loop {
            if token.get() < seen {
                return Err(Error::Fenced {
                    resource: self.resource.clone(),
                    token: token.get(),
                    highest: seen,
                });
            }
            if token.get() == seen {
                return Ok(());
            }
            match self.highest.compare_exchange_weak(
                seen,
                token.get(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => seen = now,
            }
        }
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        match self.highest.load(Ordering::Acquire) {
            0 => None,
            t => Some(FencingToken(t)),
        }
    }

    /// The resource's name.
    pub fn resource(&self) -> &str {
        &self.resource
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use std::sync::Arc;

    /// Many threads check rising tokens at once: the highest ends at the largest, and no
    /// token below an accepted one is accepted after it.
    #[test]
    fn concurrent_checks_keep_the_highest() {
        let fence = Arc::new(Fence::new("r"));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let fence = fence.clone();
                std::thread::spawn(move || {
                    let mut accepted = Vec::new();
                    for i in 0..10_000u64 {
                        let token = FencingToken(i * 4 + t + 1);
                        if fence.check(token).is_ok() {
                            accepted.push(token);
                        }
                    }
                    accepted
                })
            })
            .collect();
        for t in threads {
            let accepted = t.join().unwrap();
            assert!(accepted.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!(fence.highest(), Some(FencingToken(40_000)));
        assert!(fence.check(FencingToken(39_999)).is_err());
    }
}
