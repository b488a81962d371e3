//! The record of the leases this backend holds (or may hold: an acquire whose reply was
//! not seen), each with the deadline past which the sweep deletes it.

use std::collections::{BTreeSet, HashMap};

use lease_core::OwnerToken;
use tokio::time::Instant;

/// A lease this backend took (or may have taken: an acquire whose reply was not seen).
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// The session (TTL in ms) the holder node is on, and that session's id.
    pub(crate) ttl_ms: u64,
    pub(crate) session: i64,
    /// The name node's version after the acquisition; `None` while the acquire's reply
    /// is outstanding (or was lost).
    pub(crate) version: Option<i32>,
    pub(crate) fencing: u64,
    pub(crate) label: String,
    /// When the acquire's reply arrived (keep-for counts from here: never early).
    pub(crate) acquired_at: Instant,
    /// The lease lapses here unless renewed.
    pub(crate) deadline: Instant,
}

pub(crate) type Key = (String, OwnerToken);

/// Keys are hashed with foldhash (seeded at random per process), not SipHash: a lookup
/// is on every acquire and release, and this map holds only this process's own leases.
#[derive(Default)]
pub(crate) struct Records {
    pub(crate) by_key: HashMap<Key, Record, foldhash::fast::RandomState>,
    by_deadline: BTreeSet<(Instant, String, [u8; 16])>,
}

impl Records {
    pub(crate) fn put(&mut self, key: Key, rec: Record) {
        if let Some(old) = self.by_key.get(&key) {
            self.by_deadline
                .remove(&(old.deadline, key.0.clone(), *key.1.as_bytes()));
        }
        self.by_deadline
            .insert((rec.deadline, key.0.clone(), *key.1.as_bytes()));
        self.by_key.insert(key, rec);
    }

    /// Puts `rec` in place of `key`'s record: in place where the deadline is the same
    /// (the acquire's answer to the record made before it was sent), else as [`put`].
    ///
    /// [`put`]: Records::put
    pub(crate) fn confirm(&mut self, key: &Key, rec: Record) {
        match self.by_key.get_mut(key) {
            Some(old) if old.deadline == rec.deadline => *old = rec,
            _ => self.put(key.clone(), rec),
        }
    }

    /// Puts `rec` back unless `key` has a record again (the owner acquired it anew).
    pub(crate) fn put_back(&mut self, key: Key, rec: Record) {
        if !self.by_key.contains_key(&key) {
            self.put(key, rec);
        }
    }

    pub(crate) fn remove(&mut self, key: &Key) -> Option<Record> {
        let rec = self.by_key.remove(key)?;
        self.by_deadline
            .remove(&(rec.deadline, key.0.clone(), *key.1.as_bytes()));
        Some(rec)
    }

    /// Moves the deadline of `key` to `deadline` if it is later.
    pub(crate) fn extend(&mut self, key: &Key, deadline: Instant) {
        if let Some(rec) = self.by_key.get_mut(key)
            && deadline > rec.deadline
        {
            self.by_deadline
                .remove(&(rec.deadline, key.0.clone(), *key.1.as_bytes()));
            rec.deadline = deadline;
            self.by_deadline
                .insert((deadline, key.0.clone(), *key.1.as_bytes()));
        }
    }

    /// Removes and returns the records whose deadline is before `now`.
    pub(crate) fn take_expired(&mut self, now: Instant) -> Vec<(Key, Record)> {
        let mut out = Vec::new();
        while let Some(first) = self.by_deadline.first() {
            if first.0 > now {
                break;
            }
            let Some((_, path, token)) = self.by_deadline.pop_first() else {
                break;
            };
            let key = (path, OwnerToken::from_bytes(token));
            if let Some(rec) = self.by_key.remove(&key) {
                out.push((key, rec));
            }
        }
        out
    }

    /// Forgets every record on session `id` (it expired: its nodes are gone).
    pub(crate) fn forget_session(&mut self, id: i64) {
        let gone: Vec<Key> = self
            .by_key
            .iter()
            .filter(|(_, r)| r.session == id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}
