//! Mapping lease names to Redis keys.
//!
//! Layout for a name `N` under prefix `P` (`enc(N)` is the name's bytes with every byte
//! other than `A-Z a-z 0-9 - _ . : /` written as `%XX`, so `%` itself becomes `%25`):
//!
//! - `P:{enc(N)}:lock`: the lease itself (a hash with a TTL, see `scripts`);
//! - `P:{enc(N)}:fence`: the fencing counter (a plain integer, no TTL);
//! - `P:{enc(N)}:released`: the pub/sub channel announcing a waited-for release.
//!
//! The encoding is injective (it decodes back, since `%` is always escaped) and contains
//! no braces, and the prefix may not contain braces, so the first `{...}` of every key is
//! exactly `{enc(N)}`: all keys of one name share a Redis Cluster hash slot, and no name
//! can reach into another name's keys or out of the prefix. Common names stay as they
//! are (`lease:{nightly-report}:lock`): readable with `redis-cli`, and no longer than
//! needed (every byte of a key is parsed, hashed and copied on each call).

use lease_core::{InvalidInput, LeaseName};

/// Longest accepted key prefix, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 256;

/// Checks a key prefix: 1 to 256 bytes, no braces (they would change the hash tag), no
/// control characters or whitespace (they make keys hard to handle with `redis-cli`).
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), InvalidInput> {
    if prefix.is_empty() {
        return Err(InvalidInput::Other("redis key prefix is empty".into()));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(InvalidInput::Other(format!(
            "redis key prefix is {} bytes, more than the maximum of {MAX_PREFIX_LEN}",
            prefix.len()
        )));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_control() || c.is_whitespace())
    {
        return Err(InvalidInput::Other(format!(
            "redis key prefix must not contain {c:?} (braces would change the cluster hash tag)"
        )));
    }
    Ok(())
}

/// The keys and channel of one lease name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// The lease hash.
    pub(crate) lock: String,
    /// The fencing counter.
    pub(crate) fence: String,
    /// The release notification channel.
    pub(crate) channel: String,
}

/// The longest suffix after the hash tag (`:released`).
const LONGEST_SUFFIX: usize = 9;

/// For each byte, whether it stands for itself in a key (anything else is `%XX`).
const PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b: u8 = 0;
    loop {
        table[b as usize] =
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/');
        if b == u8::MAX {
            break;
        }
        b += 1;
    }
    table
};

/// Whether `b` stands for itself in a key (anything else is `%XX`).
fn plain(b: u8) -> bool {
    PLAIN[usize::from(b)]
}

/// Where the first byte that is not plain is, if any.
fn first_escaped(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| !plain(b))
}

/// Appends `enc(bytes)` to `out`: each run of plain bytes (ASCII) in one copy, every
/// other byte as `%XX`. Keys are built twice per acquire + release cycle, so this runs
/// on every call. `first` is [`first_escaped`]`(bytes)`, found by the caller.
fn push_encoded(out: &mut String, bytes: &[u8], first: Option<usize>) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut rest = bytes;
    let mut next_escaped = Some(first);
    while !rest.is_empty() {
        let run = next_escaped
            .take()
            .unwrap_or_else(|| first_escaped(rest))
            .unwrap_or(rest.len());
        let (plain_run, tail) = rest.split_at(run);
        // Plain bytes are ASCII, so the run is UTF-8.
        let text = std::str::from_utf8(plain_run);
        debug_assert!(text.is_ok(), "a run of plain bytes is ASCII");
        if let Ok(text) = text {
            out.push_str(text);
        }
        if let Some((&b, after)) = tail.split_first() {
            out.push('%');
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
            rest = after;
        } else {
            rest = tail;
        }
    }
}

/// The hash-tagged base `P:{enc(N)}` shared by all keys of a name, with room for any
/// suffix.
fn base(prefix: &str, name: &[u8]) -> String {
    // Most names are plain throughout: one pass finds that, and gives the length.
    let first_escaped = first_escaped(name);
    let encoded = match first_escaped {
        None => name.len(),
        Some(i) => {
            i + name[i..]
                .iter()
                .map(|&b| if plain(b) { 1 } else { 3 })
                .sum::<usize>()
        }
    };
    let mut s = String::with_capacity(prefix.len() + 3 + encoded + LONGEST_SUFFIX);
    s.push_str(prefix);
    s.push_str(":{");
    push_encoded(&mut s, name, first_escaped);
    s.push('}');
    s
}

/// `base` followed by `suffix`, in a string of its own.
fn joined(base: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(base.len() + suffix.len());
    s.push_str(base);
    s.push_str(suffix);
    s
}

/// The lock key of `name` (used for renew batches, where only that one is needed).
pub(crate) fn lock_key(prefix: &str, name: &LeaseName) -> String {
    let mut s = base(prefix, name.as_bytes());
    s.push_str(":lock");
    s
}

/// [`lock_key`] written into `out` (cleared first): a renew batch builds its thousands of
/// keys in one buffer instead of a string each.
pub(crate) fn write_lock_key(out: &mut String, prefix: &str, name: &LeaseName) {
    let name = name.as_bytes();
    out.clear();
    out.push_str(prefix);
    out.push_str(":{");
    push_encoded(out, name, first_escaped(name));
    out.push_str("}:lock");
}

/// The lock and fence keys of `name` (acquire needs only these).
pub(crate) fn lock_and_fence(prefix: &str, name: &LeaseName) -> (String, String) {
    let mut b = base(prefix, name.as_bytes());
    let lock = joined(&b, ":lock");
    b.push_str(":fence");
    (lock, b)
}

/// Another key (or the channel) of the name whose lock key is `lock`: `suffix` is one of
/// `:fence`, `:released`.
pub(crate) fn sibling(lock: &str, suffix: &str) -> String {
    joined(lock.strip_suffix(":lock").unwrap_or(lock), suffix)
}

/// All keys of `name`.
pub(crate) fn keys(prefix: &str, name: &LeaseName) -> Keys {
    let b = base(prefix, name.as_bytes());
    Keys {
        lock: joined(&b, ":lock"),
        fence: joined(&b, ":fence"),
        channel: joined(&b, ":released"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The part of a key Redis Cluster hashes (the hash tag rule of the cluster spec).
    fn hash_tag(key: &str) -> &str {
        let Some(open) = key.find('{') else {
            return key;
        };
        match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        }
    }

    fn name(b: &[u8]) -> LeaseName {
        LeaseName::new(b).unwrap()
    }

    fn tricky_names() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = vec![
            b"a".to_vec(),
            b"a:b".to_vec(),
            b"a:".to_vec(),
            b":a".to_vec(),
            b"b".to_vec(),
            b"{x}".to_vec(),
            b"{".to_vec(),
            b"}".to_vec(),
            b"}{".to_vec(),
            b"x}:lock".to_vec(),
            b"lease:{61}:lock".to_vec(),
            b"61".to_vec(),
            b"%".to_vec(),
            b"%25".to_vec(),
            b"%7B".to_vec(),
            b"{".to_vec(),
            b"a%3Ab".to_vec(),
            b"A".to_vec(),
            b"\xff".to_vec(),
            b"\xff\xfe\x01".to_vec(),
            b"\x01".to_vec(),
            b"\x01\x01".to_vec(),
            b"\x10".to_vec(),
            "\u{e9}t\u{e9}".as_bytes().to_vec(),
            b" ".to_vec(),
            b"*".to_vec(),
            b"a b".to_vec(),
            vec![b'z'; LeaseName::MAX_LEN],
        ];
        for b in 1..=255u8 {
            v.push(vec![b]);
            v.push(vec![b, b]);
        }
        v
    }

    /// The encoding byte by byte, as the module's documentation states it.
    fn reference(bytes: &[u8]) -> String {
        bytes
            .iter()
            .map(|&b| {
                if b.is_ascii_alphanumeric() || b"-_.:/".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    #[test]
    fn runs_of_plain_bytes_encode_as_byte_by_byte() {
        let mut cases: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        cases.extend((0..=255u8).map(|b| vec![b'a', b, b'z', b, b]));
        cases.push(b"nightly-report".to_vec());
        cases.push("bericht-über-nacht/日本".as_bytes().to_vec());
        cases.push(b"%%{}}{ a b\x00\xff".to_vec());
        cases.push(Vec::new());
        for bytes in cases {
            let mut out = String::new();
            push_encoded(&mut out, &bytes, first_escaped(&bytes));
            assert_eq!(out, reference(&bytes), "{bytes:?}");
        }
    }

    #[test]
    fn encoding_is_injective_and_keeps_keys_apart() {
        let mut seen = HashSet::new();
        let mut names = tricky_names();
        names.sort();
        names.dedup();
        for n in &names {
            let k = keys("lease", &name(n));
            // Every key of every name is distinct from every key of any other name.
            assert!(seen.insert(k.lock.clone()), "collision on {n:?}");
            assert!(seen.insert(k.fence.clone()), "collision on {n:?}");
            assert!(seen.insert(k.channel.clone()), "collision on {n:?}");
        }
    }

    #[test]
    fn lock_and_fence_share_a_hash_tag() {
        let mut tags = HashSet::new();
        for n in tricky_names() {
            let k = keys("lease", &name(&n));
            let tag = hash_tag(&k.lock).to_owned();
            assert_eq!(tag, hash_tag(&k.fence), "name {n:?}");
            assert_eq!(tag, hash_tag(&k.channel), "name {n:?}");
            assert_eq!(tag, {
                let mut e = String::new();
                push_encoded(&mut e, &n, first_escaped(&n));
                e
            });
            assert!(!tag.contains(['{', '}']));
            tags.insert(tag);
        }
        assert!(tags.len() > 500);
    }

    #[test]
    fn known_layout() {
        let k = keys("lease", &name(b"a:{b}"));
        assert_eq!(k.lock, "lease:{a:%7Bb%7D}:lock");
        assert_eq!(k.fence, "lease:{a:%7Bb%7D}:fence");
        assert_eq!(k.channel, "lease:{a:%7Bb%7D}:released");
        assert_eq!(
            keys("lease", &name(b"nightly-report")).lock,
            "lease:{nightly-report}:lock"
        );
        assert_eq!(keys("p", &name(b"100%")).lock, "p:{100%25}:lock");
        assert_eq!(lock_key("lease", &name(b"a:{b}")), k.lock);
        let n = name(b"a:{b}");
        assert_eq!(
            lock_and_fence("lease", &n),
            (k.lock.clone(), k.fence.clone())
        );
        assert_eq!(sibling(&k.lock, ":released"), k.channel);
        assert_eq!(sibling(&k.lock, ":fence"), k.fence);
        assert_eq!(keys("p", &name(b"\xff")).lock, "p:{%FF}:lock");
    }

    /// A renew batch's keys, written into one reused buffer, are the lock keys.
    #[test]
    fn lock_keys_written_into_a_buffer_are_the_lock_keys() {
        let mut buf = String::from("left over from the key before");
        for n in tricky_names() {
            let n = name(&n);
            write_lock_key(&mut buf, "lease", &n);
            assert_eq!(buf, lock_key("lease", &n));
        }
    }

    #[test]
    fn prefixes_never_overlap() {
        // Distinct valid prefixes give distinct keys for any names: the prefix ends right
        // before the first brace.
        let prefixes = ["lease", "lease:", "lease:x", "a", "a:b", "app1:lease"];
        let mut seen = HashSet::new();
        let mut names = tricky_names();
        names.sort();
        names.dedup();
        for p in prefixes {
            validate_prefix(p).unwrap();
            for n in &names {
                assert!(seen.insert(keys(p, &name(n)).lock), "{p} {n:?}");
            }
        }
    }

    #[test]
    fn prefix_validation() {
        assert!(validate_prefix("lease").is_ok());
        assert!(validate_prefix("my-app:leases").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix("a}b").is_err());
        assert!(validate_prefix("a b").is_err());
        assert!(validate_prefix("a\nb").is_err());
        assert!(validate_prefix(&"x".repeat(MAX_PREFIX_LEN + 1)).is_err());
    }
}
