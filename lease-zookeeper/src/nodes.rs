//! The nodes of one lease name and what they hold.
//!
//! ```text
//! {prefix}/clock                    written to read the server's clock (its mtime)
//! {prefix}/leases/{enc(name)}       the name node: persistent; data = state, owner token,
//!                                   holder label; its data version changes with every
//!                                   acquisition, release and forced release
//! {prefix}/leases/{enc(name)}/holder
//!                                   the holder node: ephemeral on the holder's session
//!                                   while held; after a release with keep-for, a TTL
//!                                   node (data = keep-for in ms, fencing token)
//! ```
//!
//! The name node's version is what makes every conditional write safe: a release, a
//! sweep or a takeover of an expired keep-for node names the version it read, and any
//! change of holder since has changed it (a fixed path's holder node would be version 0
//! in every incarnation, so its own version could not tell two holders apart).

use lease_core::{LeaseName, OwnerToken};

/// The name node's state byte: nobody holds the name (never acquired, or forced free).
pub(crate) const FREE: u8 = 0;
/// Held by the token in the data (while the holder node is ephemeral).
pub(crate) const HELD: u8 = 1;
/// Released by the token in the data (a keep-for node may still stand).
pub(crate) const RELEASED: u8 = 2;

const FORMAT: u8 = 1;

/// `ephemeralOwner` of a TTL node: the top byte set (ZooKeeper's `EphemeralType`), the
/// TTL in the low 40 bits.
const EXTENDED_MASK: u64 = 0xff00_0000_0000_0000;
const TTL_MASK: u64 = 0x0000_00ff_ffff_ffff;
/// `ephemeralOwner` of a container node.
const CONTAINER: i64 = i64::MIN;

/// The paths of the backend's nodes.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    prefix: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn leases(&self) -> String {
        format!("{}/leases", self.prefix)
    }

    pub(crate) fn clock(&self) -> String {
        format!("{}/clock", self.prefix)
    }

    /// The name node of `name`.
    pub(crate) fn name_node(&self, name: &LeaseName) -> String {
        let mut p = String::with_capacity(self.prefix.len() + 8 + name.as_bytes().len() * 3);
        p.push_str(&self.prefix);
        p.push_str("/leases/");
        encode_into(name.as_bytes(), &mut p);
        p
    }
}

/// The directory of a name node: the leases node (an encoded name holds no `/`).
pub(crate) fn parent(name_node: &str) -> &str {
    name_node.rsplit_once('/').map_or("/", |(dir, _)| dir)
}

/// The holder node under a name node.
pub(crate) fn holder_node(name_node: &str) -> String {
    let mut p = String::with_capacity(name_node.len() + 7);
    p.push_str(name_node);
    p.push_str("/holder");
    p
}

/// Every byte outside `[A-Za-z0-9_-]` as `%XX`: injective, never `/`, `.` or `..`, no
/// character ZooKeeper refuses in a path.
fn encode_into(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let mut rest = bytes;
    while !rest.is_empty() {
        // A run of plain bytes in one copy (they are ASCII, so always a `str`).
        let run = rest.iter().position(|&b| !plain(b)).unwrap_or(rest.len());
        let (head, tail) = rest.split_at(run);
        if let Ok(head) = std::str::from_utf8(head) {
            out.push_str(head);
        }
        let Some((&b, tail)) = tail.split_first() else {
            break;
        };
        out.push('%');
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
        rest = tail;
    }
}

/// What the name node says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NameData {
    pub(crate) state: u8,
    pub(crate) token: OwnerToken,
    pub(crate) label: String,
}

pub(crate) fn encode_name(state: u8, token: &OwnerToken, label: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(18 + label.len());
    v.push(FORMAT);
    v.push(state);
    v.extend_from_slice(token.as_bytes());
    v.extend_from_slice(label.as_bytes());
    v
}

/// `None` for data this backend did not write (an empty name node counts as free).
pub(crate) fn decode_name(data: &[u8]) -> Option<NameData> {
    if data.is_empty() {
        return Some(NameData {
            state: FREE,
            token: OwnerToken::from_bytes([0; 16]),
            label: String::new(),
        });
    }
    let (&format, rest) = data.split_first()?;
    let (&state, rest) = rest.split_first()?;
    if format != FORMAT || state > RELEASED || rest.len() < 16 {
        return None;
    }
    let (token, label) = rest.split_at(16);
    let token = OwnerToken::from_bytes(token.try_into().ok()?);
    Some(NameData {
        state,
        token,
        label: String::from_utf8_lossy(label).into_owned(),
    })
}

/// A keep-for node's data: its TTL in ms and the released lease's fencing token.
pub(crate) fn encode_keep(ttl_ms: u64, fencing: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(17);
    v.push(FORMAT);
    v.extend_from_slice(&ttl_ms.to_be_bytes());
    v.extend_from_slice(&fencing.to_be_bytes());
    v
}

pub(crate) fn decode_keep(data: &[u8]) -> Option<(u64, u64)> {
    let (&format, rest) = data.split_first()?;
    if format != FORMAT || rest.len() != 16 {
        return None;
    }
    let (a, b) = rest.split_at(8);
    Some((
        u64::from_be_bytes(a.try_into().ok()?),
        u64::from_be_bytes(b.try_into().ok()?),
    ))
}

/// What kind of node an `ephemeralOwner` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Ephemeral, of this session.
    Ephemeral(i64),
    /// A TTL node with this TTL in ms (read as a keep-for node: releases write
    /// persistent ones, see `release_in_span`).
    Ttl(u64),
    /// Persistent (a keep-for node) or a container.
    Persistent,
}

pub(crate) fn kind(ephemeral_owner: i64) -> Kind {
    let bits = ephemeral_owner as u64;
    if ephemeral_owner == 0 || ephemeral_owner == CONTAINER {
        Kind::Persistent
    } else if bits & EXTENDED_MASK == EXTENDED_MASK {
        Kind::Ttl(bits & TTL_MASK)
    } else {
        Kind::Ephemeral(ephemeral_owner)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn names_map_to_distinct_safe_segments() {
        let l = Layout::new("/p");
        let a = l.name_node(&LeaseName::new("a/b").unwrap());
        let b = l.name_node(&LeaseName::new("a%2Fb").unwrap());
        assert_eq!(a, "/p/leases/a%2Fb");
        assert_eq!(b, "/p/leases/a%252Fb");
        assert_eq!(l.name_node(&LeaseName::new(".").unwrap()), "/p/leases/%2E");
        assert_eq!(
            l.name_node(&LeaseName::new([0xffu8, b'x']).unwrap()),
            "/p/leases/%FFx"
        );
    }

    /// The run-copying encoder gives what encoding byte by byte gives, for every byte
    /// alone, in runs and at either end.
    #[test]
    fn encoding_matches_the_bytewise_rule() {
        fn bytewise(bytes: &[u8]) -> String {
            bytes
                .iter()
                .map(|&b| {
                    if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                        char::from(b).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect()
        }
        let mut inputs: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        inputs.extend((0..=255u8).map(|b| vec![b'a', b, b'z', b'9', b, b]));
        inputs.push(b"svc/run-1/63".to_vec());
        inputs.push("날짜/é".as_bytes().to_vec());
        inputs.push(b"plain_name-only".to_vec());
        for bytes in inputs {
            let mut out = String::from("x");
            encode_into(&bytes, &mut out);
            assert_eq!(out, format!("x{}", bytewise(&bytes)), "{bytes:?}");
        }
    }

    #[test]
    fn data_round_trips() {
        let t = OwnerToken::random();
        let d = decode_name(&encode_name(HELD, &t, "host-1")).unwrap();
        assert_eq!((d.state, d.token, d.label.as_str()), (HELD, t, "host-1"));
        assert_eq!(decode_name(b"").unwrap().state, FREE);
        assert!(decode_name(b"junk").is_none());
        assert_eq!(decode_keep(&encode_keep(1500, 42)), Some((1500, 42)));
    }

    #[test]
    fn node_kinds() {
        assert_eq!(kind(0), Kind::Persistent);
        assert_eq!(kind(i64::MIN), Kind::Persistent);
        assert_eq!(
            kind(0x0100_0000_0000_0abc),
            Kind::Ephemeral(0x0100_0000_0000_0abc)
        );
        assert_eq!(kind((0xff00_0000_0000_1388u64) as i64), Kind::Ttl(5000));
    }
}
