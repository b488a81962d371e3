//! Mapping lease names to etcd keys, and the value stored under each key.
//!
//! **Keys.** A name `N` under the prefix `P` is stored at
//!
//! ```text
//! P/l/<enc(N)>#
//! ```
//!
//! where `enc(N)` is the name's bytes with every ASCII byte other than
//! `A-Z a-z 0-9 - _ . : /` written as `%XX` (so `%` itself becomes `%25`), and `#` a
//! terminator. Bytes of 0x80 and above (UTF-8 beyond ASCII: a Korean syllable stays 3
//! bytes, where hex made it 6 and `%XX` would make it 9) stand for themselves, as the
//! listed ASCII bytes do; etcd keys are bytes. The encoding is injective (it decodes
//! back, since `%` is always escaped). The terminator never occurs in `enc(N)`, so no name's key is a proper prefix
//! of another name's key: a prefix range (`get --prefix`, a prefix watch) on one name's
//! key can never reach another name. Every key lies under `P/l/`, whatever bytes the name
//! contains (slashes, `..`, non-UTF-8), so no name can escape the prefix either.
//!
//! Common names stay as they are (`lease/l/nightly-report#`), half the length of the hex
//! layout this replaced. Length matters on the wire: a gRPC request of 256 bytes or more
//! is written apart (h2 chains such a payload to its write buffer instead of copying it,
//! and sends the end of the stream in a frame and system call of its own), where smaller
//! requests of concurrent callers share one write. An acquire's transaction carries the
//! name's key twice (the comparison over its range) and the record's key once, and the
//! value with the holder label: with the default prefix the request's DATA frame is
//! `3 × name + label + 122` bytes (the name percent-encoded; read off the frames a
//! `count-cycles` run writes, `strace -e writev`), under 256 for a name of 40 bytes with
//! a label of 13, or a name of 30 with a label of 43. A held attempt reads the holder with a
//! request of its own, so that the common case, a free name, stays short.
//!
//! **Record keys.** A name's key is not written itself: an acquisition stores its record
//! at the name's key followed by the id of the etcd lease it is attached to
//! ([`owned_key`]), as etcd's lock service keys each lock by its session lease. The name
//! is free while the range `[key, range_end(key))` is empty; that range holds exactly the
//! keys starting with the name's key, since no other name's key does. Only acquisitions
//! through that etcd lease (one backend instance's session) ever write a record key, one
//! after the other, so the instance that put a record may delete it without a
//! comparison, where a shared key needed an owner-checked transaction.
//!
//! **Values.** `lease1\n<state>\n<owner token>\n<holder label>`, where `state` is `held`
//! or `released` (released with keep-for: still taken, never renewable). Labels contain no
//! control characters, so the newline split is unambiguous. Anything else under the
//! prefix is reported as an unexpected reply, never mistaken for a lease.

use lease_core::{InvalidInput, OwnerToken};

/// Longest accepted key prefix, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 256;

const MAGIC: &str = "lease1";
const HELD: &str = "held";
const RELEASED: &str = "released";

/// Checks a key prefix: 1 to 256 bytes, no control characters or whitespace.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), InvalidInput> {
    if prefix.is_empty() {
        return Err(InvalidInput::Other("etcd key prefix is empty".into()));
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(InvalidInput::Other(format!(
            "etcd key prefix is {} bytes, more than the maximum of {MAX_PREFIX_LEN}",
            prefix.len()
        )));
    }
    if let Some(c) = prefix.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(InvalidInput::Other(format!(
            "etcd key prefix must not contain {c:?}"
        )));
    }
    Ok(())
}

/// Ends every key; never produced by the encoding (plain bytes and `%XX`).
const TERMINATOR: u8 = b'#';

/// Whether `b` stands for itself in a key (anything else is `%XX`): never `%` or the
/// terminator, so that keys decode back and no key is a prefix of another.
fn plain(b: u8) -> bool {
    b >= 0x80 || b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/')
}

/// The key layout of one backend (one prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `P/l/`: every lease key starts with it.
    range: Vec<u8>,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        let mut range = Vec::with_capacity(prefix.len() + 3);
        range.extend_from_slice(prefix.as_bytes());
        range.extend_from_slice(b"/l/");
        Layout { range }
    }

    /// The common prefix of every lease key (for the watch).
    pub(crate) fn range_prefix(&self) -> &[u8] {
        &self.range
    }

    /// The key of a name.
    pub(crate) fn key(&self, name: &[u8]) -> Vec<u8> {
        const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
        let escaped = name.iter().filter(|&&b| !plain(b)).count();
        let mut key = Vec::with_capacity(self.range.len() + name.len() + 2 * escaped + 1);
        key.extend_from_slice(&self.range);
        if escaped == 0 {
            key.extend_from_slice(name);
        } else {
            for &b in name {
                if plain(b) {
                    key.push(b);
                } else {
                    key.push(b'%');
                    key.push(DIGITS[usize::from(b >> 4)]);
                    key.push(DIGITS[usize::from(b & 0x0f)]);
                }
            }
        }
        key.push(TERMINATOR);
        key
    }

    /// The name key (see [`Layout::key`]) of `stored`, a key under this layout's range:
    /// everything up to and including its first terminator. `None` for a key that has
    /// none (not a lease key).
    pub(crate) fn name_key_of<'a>(&self, stored: &'a [u8]) -> Option<&'a [u8]> {
        name_key_of(&self.range, stored)
    }
}

/// [`Layout::name_key_of`] for the layout whose [`Layout::range_prefix`] is `range`.
pub(crate) fn name_key_of<'a>(range: &[u8], stored: &'a [u8]) -> Option<&'a [u8]> {
    let rest = stored.strip_prefix(range)?;
    let end = rest.iter().position(|&b| b == TERMINATOR)?;
    stored.get(..range.len() + end + 1)
}

/// The key an acquisition through etcd lease `session` stores its record at: the name's
/// key (see [`Layout::key`]) followed by the lease id in 16 lowercase hex digits, as
/// etcd's lock service keys a lock by its session lease. Acquisitions of one name on one
/// session reuse the key one after the other, so the name's range in etcd's index holds
/// a key per session, not one per acquisition (a deleted key stays in the index until
/// the history is compacted, and the acquire's comparison visits each). With `unique`,
/// the owner token follows too (`.` and 32 hex digits): for an acquisition made while
/// this instance still has a record of the name (see `EtcdBackend::acquire`).
pub(crate) fn owned_key(name_key: &[u8], session: i64, unique: Option<&OwnerToken>) -> Vec<u8> {
    let mut key = Vec::with_capacity(name_key.len() + 16 + 33);
    key.extend_from_slice(name_key);
    push_hex(&mut key, &session.to_be_bytes());
    if let Some(token) = unique {
        key.push(b'.');
        push_hex(&mut key, token.as_bytes());
    }
    key
}

/// The end of the range that holds every key stored for the name whose key is
/// `name_key`: the key with its terminator raised by one, so that `[name_key, end)` is
/// exactly the keys that start with `name_key` (no other name's key does, see
/// [`Layout::key`]).
pub(crate) fn range_end(name_key: &[u8]) -> Vec<u8> {
    let mut end = name_key.to_vec();
    if let Some(last) = end.last_mut() {
        *last = TERMINATOR + 1;
    }
    end
}

/// A decoded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) token: OwnerToken,
    pub(crate) released: bool,
    pub(crate) label: String,
}

/// Encodes the value of a held (or, with `released`, a released-with-keep-for) lease.
///
/// The owner token is written in its 32 hex digits without hyphens (every version of this
/// crate reads both forms, [`OwnerToken::parse`]): the value goes into every acquire's
/// request, whose size matters (see the module's documentation, "Keys").
pub(crate) fn encode_value(token: &OwnerToken, label: &str, released: bool) -> Vec<u8> {
    let state = if released { RELEASED } else { HELD };
    let mut value = Vec::with_capacity(MAGIC.len() + state.len() + 32 + label.len() + 3);
    for part in [MAGIC, state] {
        value.extend_from_slice(part.as_bytes());
        value.push(b'\n');
    }
    push_hex(&mut value, token.as_bytes());
    value.push(b'\n');
    value.extend_from_slice(label.as_bytes());
    value
}

/// Appends `bytes` in lowercase hex digits.
fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0x0f)]);
    }
}

/// Decodes a value; `Err` with a short reason for anything that is not ours.
pub(crate) fn decode_value(value: &[u8]) -> Result<Stored, String> {
    let text = std::str::from_utf8(value).map_err(|_| "value is not UTF-8".to_owned())?;
    let mut parts = text.splitn(4, '\n');
    let (Some(magic), Some(state), Some(token), Some(label)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("value {:?} is not a lease record", preview(text)));
    };
    if magic != MAGIC {
        return Err(format!("value {:?} is not a lease record", preview(text)));
    }
    let released = match state {
        HELD => false,
        RELEASED => true,
        other => return Err(format!("unknown lease state {:?}", preview(other))),
    };
    let token = OwnerToken::parse(token)
        .map_err(|_| format!("malformed owner token {:?}", preview(token)))?;
    if label.is_empty() || label.chars().any(char::is_control) {
        return Err(format!("malformed holder label {:?}", preview(label)));
    }
    Ok(Stored {
        token,
        released,
        label: label.to_owned(),
    })
}

/// At most 40 characters of `s`, for error messages.
fn preview(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn names() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = [
            "a", "a.", "a/", "a/b", "ab", "b", ".", "..", "/", "a:", "{a}", "*", "잠금", "a\n",
            "61", "6", "x.y", "#", "%", "%25", "a#", "a%23", "a%",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        v.push(vec![0xff, 0xfe]);
        v.push(vec![0x01]);
        v.push(vec![0x2e, 0xff]);
        v.push(vec![0xff, 0x2e]);
        v.push(vec![b'x'; 1024]);
        v
    }

    #[test]
    fn keys_are_injective_and_prefix_free() {
        let layout = Layout::new("lease");
        let names = names();
        let keys: Vec<Vec<u8>> = names.iter().map(|n| layout.key(n)).collect();
        for (i, a) in keys.iter().enumerate() {
            assert!(a.starts_with(b"lease/l/"));
            assert!(a.ends_with(b"#"));
            assert_eq!(a.iter().filter(|&&c| c == b'#').count(), 1, "{a:?}");
            for (j, b) in keys.iter().enumerate() {
                if i != j {
                    assert_ne!(a, b, "{:?} and {:?} share a key", names[i], names[j]);
                    assert!(
                        !b.starts_with(a),
                        "key of {:?} is a prefix of the key of {:?}",
                        names[i],
                        names[j]
                    );
                }
            }
        }
    }

    #[test]
    fn key_is_the_escaped_name_with_terminator() {
        let layout = Layout::new("app/x");
        assert_eq!(layout.key(b"a/b"), b"app/x/l/a/b#".to_vec());
        assert_eq!(
            layout.key(b"nightly-report.v2:eu_1"),
            b"app/x/l/nightly-report.v2:eu_1#".to_vec()
        );
        assert_eq!(layout.key(&[0x00, 0xff]), b"app/x/l/%00\xff#".to_vec());
        assert_eq!(layout.key(b"50% #1"), b"app/x/l/50%25%20%231#".to_vec());
        assert_eq!(
            layout.key("잠금".as_bytes()),
            "app/x/l/잠금#".as_bytes().to_vec()
        );
        assert_eq!(layout.range_prefix(), b"app/x/l/");
    }

    #[test]
    fn neither_escape_nor_terminator_stands_for_itself() {
        for b in 0..=255u8 {
            if plain(b) {
                assert!(b != b'%' && b != TERMINATOR, "{b:#x}");
            }
        }
        assert!(plain(0x80) && plain(0xff) && !plain(b' ') && !plain(0x7f));
    }

    /// Decodes `enc(N)#` back to `N`: the encoding loses nothing.
    fn decode(key: &[u8]) -> Vec<u8> {
        let body = &key[..key.len() - 1];
        let mut out = Vec::new();
        let mut i = 0;
        while i < body.len() {
            if body[i] == b'%' {
                let hex = std::str::from_utf8(&body[i + 1..i + 3]).unwrap_or("zz");
                out.push(u8::from_str_radix(hex, 16).unwrap_or_default());
                i += 3;
            } else {
                out.push(body[i]);
                i += 1;
            }
        }
        out
    }

    #[test]
    fn keys_decode_back_to_their_names() {
        let layout = Layout::new("p");
        for name in names() {
            let key = layout.key(&name);
            assert_eq!(decode(&key[b"p/l/".len()..]), name, "{key:?}");
        }
    }

    #[test]
    fn every_byte_pair_maps_to_a_distinct_key() {
        let layout = Layout::new("p");
        let mut seen = std::collections::HashSet::new();
        for a in 0..=255u8 {
            assert!(seen.insert(layout.key(&[a])));
            for b in [0u8, b'#', b'%', 0x2e, 0x2f, 0x30, 0x61, 0xff] {
                assert!(seen.insert(layout.key(&[a, b])));
            }
        }
    }

    #[test]
    fn values_round_trip() {
        let token = OwnerToken::random();
        for released in [false, true] {
            let v = encode_value(&token, "host:42 with spaces", released);
            let d = decode_value(&v).expect("decode");
            assert_eq!(d.token, token);
            assert_eq!(d.released, released);
            assert_eq!(d.label, "host:42 with spaces");
        }
    }

    #[test]
    fn an_acquisitions_key_lies_in_its_names_range_and_no_other() {
        // The prefix may hold a terminator itself: the name part starts after it.
        let layout = Layout::new("a#b");
        let names = names();
        let keys: Vec<Vec<u8>> = names.iter().map(|n| layout.key(n)).collect();
        for (i, key) in keys.iter().enumerate() {
            let token = OwnerToken::random();
            let shared = owned_key(key, 0x0123_4567_89ab_cdef, None);
            assert_eq!(&shared[key.len()..], b"0123456789abcdef");
            let unique = owned_key(key, 7, Some(&token));
            assert_eq!(
                unique[key.len()..].to_vec(),
                format!("0000000000000007.{}", token.to_string().replace('-', "")).into_bytes()
            );
            for own in [&shared, &unique] {
                assert_eq!(layout.name_key_of(own), Some(key.as_slice()));
                for (j, other) in keys.iter().enumerate() {
                    let end = range_end(other);
                    let inside =
                        own.as_slice() >= other.as_slice() && own.as_slice() < end.as_slice();
                    assert_eq!(
                        inside,
                        i == j,
                        "{:?} in the range of {:?}",
                        names[i],
                        names[j]
                    );
                }
            }
            assert_eq!(layout.name_key_of(key), Some(key.as_slice()));
        }
        assert_eq!(layout.name_key_of(b"a#b/l/no-terminator"), None);
        assert_eq!(layout.name_key_of(b"elsewhere/l/x#"), None);
        assert_eq!(range_end(b"p/l/x#"), b"p/l/x$".to_vec());
    }

    #[test]
    fn garbage_values_are_rejected() {
        let token = OwnerToken::random();
        for bad in [
            b"".to_vec(),
            b"hello".to_vec(),
            vec![0xff, 0x00],
            format!("lease2\nheld\n{token}\nx").into_bytes(),
            format!("lease1\nmaybe\n{token}\nx").into_bytes(),
            b"lease1\nheld\nnot-a-uuid\nx".to_vec(),
            format!("lease1\nheld\n{token}\n").into_bytes(),
            format!("lease1\nheld\n{token}\na\nb").into_bytes(),
        ] {
            assert!(decode_value(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefixes_are_validated() {
        assert!(validate_prefix("lease").is_ok());
        assert!(validate_prefix("team/app").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("a b").is_err());
        assert!(validate_prefix("a\nb").is_err());
        assert!(validate_prefix(&"x".repeat(257)).is_err());
    }
}
