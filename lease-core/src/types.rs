//! Value types shared by the trait, the client and every backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::InvalidInput;

/// A validated lease name.
///
/// Any byte sequence of 1 to [`LeaseName::MAX_LEN`] bytes without a NUL byte is a legal
/// name. Backends must map every legal name to its own key: two different names never
/// collide, and no name can reach into another name's key space (braces, slashes, colons
/// and non-UTF-8 bytes included).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseName(Arc<[u8]>);

impl LeaseName {
    /// The longest legal name, in bytes.
    pub const MAX_LEN: usize = 1024;

    /// Validates `name`.
    ///
    /// ```
    /// use lease_core::{LeaseName, InvalidInput};
    /// assert!(LeaseName::new("nightly-report").is_ok());
    /// assert_eq!(LeaseName::new("").unwrap_err(), InvalidInput::EmptyName);
    /// ```
    pub fn new(name: impl AsRef<[u8]>) -> Result<Self, InvalidInput> {
        let bytes = name.as_ref();
        if bytes.is_empty() {
            return Err(InvalidInput::EmptyName);
        }
        if bytes.len() > Self::MAX_LEN {
            return Err(InvalidInput::NameTooLong {
                len: bytes.len(),
                max: Self::MAX_LEN,
            });
        }
        // `contains` on bytes is a word-at-a-time `memchr`; the byte-by-byte search for
        // the offset runs only for a name that has a NUL.
        if bytes.contains(&0) {
            let offset = bytes.iter().position(|b| *b == 0).unwrap_or_default();
            return Err(InvalidInput::NameContainsNul { offset });
        }
        Ok(LeaseName(Arc::from(bytes)))
    }

    /// The raw bytes of the name.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The name as UTF-8, with invalid bytes replaced (for logs and messages).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl AsRef<[u8]> for LeaseName {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Debug for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseName({:?})", String::from_utf8_lossy(&self.0))
    }
}

impl TryFrom<&str> for LeaseName {
    type Error = InvalidInput;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        LeaseName::new(value)
    }
}

/// The secret that identifies one acquisition. A fresh random UUID v4 for every
/// successful acquire; only its holder can renew or release the lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(uuid::Uuid);

impl OwnerToken {
    /// A fresh random token: 122 random bits from the thread's cryptographic generator
    /// (ChaCha12, seeded from the operating system), reseeded on its thread's first token
    /// and in a child process after `fork`, so that a forked child never repeats its
    /// parent's tokens.
    pub fn random() -> Self {
        OwnerToken(uuid::Builder::from_random_bytes(random_bytes()).into_uuid())
    }

    /// Rebuilds a token from its 16 bytes (as stored by a backend).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(uuid::Uuid::from_bytes(bytes))
    }

    /// Parses the hyphenated text form (as stored by a backend).
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        uuid::Uuid::parse_str(text)
            .map(OwnerToken)
            .map_err(|e| InvalidInput::Other(format!("owner token: {e}")))
    }

    /// The 16 bytes of the token.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// The UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix: enough to correlate logs, not enough to impersonate the owner.
        let s = self.0.simple().to_string();
        write!(f, "OwnerToken({}..)", &s[..8])
    }
}

/// A human-readable label of who holds a lease (default `hostname:pid`). Shown by
/// `inspect` and in "held by" messages; it carries no authority.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderLabel(Arc<str>);

impl HolderLabel {
    /// The longest legal label, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Validates a label: 1 to 256 bytes, no control characters.
    pub fn new(label: impl Into<String>) -> Result<Self, InvalidInput> {
        let label = label.into();
        if label.is_empty() {
            return Err(InvalidInput::HolderLabel("empty".into()));
        }
        if label.len() > Self::MAX_LEN {
            return Err(InvalidInput::HolderLabel(format!(
                "{} bytes, more than the maximum of {}",
                label.len(),
                Self::MAX_LEN
            )));
        }
        if label.chars().any(char::is_control) {
            return Err(InvalidInput::HolderLabel(
                "contains control characters".into(),
            ));
        }
        Ok(HolderLabel(Arc::from(label)))
    }

    /// `hostname:pid` of this process.
    pub fn default_for_process() -> Self {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        let host: String = host.chars().filter(|c| !c.is_control()).take(200).collect();
        let host = if host.is_empty() {
            "unknown".to_owned()
        } else {
            host
        };
        HolderLabel(Arc::from(format!("{host}:{}", std::process::id())))
    }

    /// The label text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderLabel({:?})", &*self.0)
    }
}

/// Who asks for a lease: the secret owner token and the readable label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Identifies this acquisition; required to renew or release.
    pub token: OwnerToken,
    /// Readable label stored alongside.
    pub label: HolderLabel,
}

impl Owner {
    /// A fresh owner token with the given label.
    pub fn new(label: HolderLabel) -> Self {
        Owner {
            token: OwnerToken::random(),
            label,
        }
    }
}

/// A number that grows with every successful acquisition of a name. A protected resource
/// accepts a write only if its token is not lower than the highest it has seen, which
/// makes a paused or partitioned former holder harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// How far a backend's fencing tokens can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// No fencing tokens: the returned token is meaningless (always 0).
    None,
    /// Strictly increasing per name while the store keeps its data; a restart without
    /// persistence may start the sequence again.
    Volatile,
    /// Strictly increasing per name, also across a store restart.
    Durable,
}

/// What a backend can do. The client and the conformance suite branch on it.
///
/// Construct with [`Capabilities::new`] and the `with_*` setters for what differs from
/// the defaults (volatile fencing, expiring leases, lost before taken, 1 ms minimum TTL and
/// granularity, holder labels, keep-for, no release notification, batches of 100,000):
///
/// ```
/// use std::time::Duration;
/// use lease_core::{Capabilities, Fencing};
/// let caps = Capabilities::new("my-store")
///     .with_fencing(Fencing::Durable)
///     .with_min_ttl(Duration::from_secs(1))
///     .with_release_notification(true);
/// assert_eq!(caps.backend, "my-store");
/// assert!(caps.keep_for);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Short backend name used in errors and logs.
    pub backend: &'static str,
    /// Fencing token guarantees.
    pub fencing: Fencing,
    /// Whether leases expire by TTL on the store. `false` for session-bound locks (a
    /// Postgres advisory lock), which are held until released or the session dies.
    pub expires: bool,
    /// Whether a holder that can no longer renew hears "lost" before anyone else can take
    /// the lease (the *lead time*): the store keeps a lease until its TTL from the last
    /// successful renewal, and the guard gives up earlier, at its safety deadline
    /// ([`LeaseGuard::lost`](crate::LeaseGuard::lost)). `true` for every store that frees
    /// a lease only by release or expiry (the default). `false` where the store frees it
    /// on its own before the holder's deadline: a Postgres advisory lock is free the
    /// moment the holder's session ends, while the guard learns at its next renewal, so
    /// for up to one renewal period two processes believe they hold the lease. An
    /// operator's `force_release` frees a lease early on every store and does not count.
    /// The conformance suite reports its lead-time checks as not applicable when this is
    /// `false`.
    pub lost_before_taken: bool,
    /// Smallest TTL the store honours; shorter TTLs are rounded up to it.
    pub min_ttl: Duration,
    /// TTL granularity on the store; TTLs are rounded up to a multiple of it.
    pub ttl_granularity: Duration,
    /// Whether `acquire` reports who holds a held lease.
    pub holder_info: bool,
    /// Whether `release` honours a non-zero keep-for.
    pub keep_for: bool,
    /// How long a lease released with a sliver of its keep-for left may still live past
    /// the keep-for, which a scheduled job's period must leave room for. `None` (the
    /// default): the minimum TTL where it exceeds the granularity, for a store that keeps
    /// the lease as a TTL'd record of its own (etcd grants at least 2 s); a store that
    /// ends keep-for to its granularity whatever is left (ZooKeeper's keep-for node,
    /// judged by the server's clock) sets zero. See [`Capabilities::keep_for_overrun`].
    pub keep_for_tail: Option<Duration>,
    /// Whether [`crate::LeaseBackend::wait_released`] is implemented by notification.
    pub release_notification: bool,
    /// Largest number of leases one `renew` call accepts; the client splits larger batches.
    pub max_renew_batch: usize,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            backend: "custom",
            fencing: Fencing::Volatile,
            expires: true,
            lost_before_taken: true,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            holder_info: true,
            keep_for: true,
            keep_for_tail: None,
            release_notification: false,
            max_renew_batch: 100_000,
        }
    }
}

impl Capabilities {
    /// The defaults (see [`Capabilities`]) for the backend named `backend` (short: used in
    /// errors, logs and metrics).
    pub fn new(backend: &'static str) -> Self {
        Capabilities {
            backend,
            ..Capabilities::default()
        }
    }

    /// Sets [`Capabilities::fencing`].
    #[must_use]
    pub fn with_fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`Capabilities::expires`].
    #[must_use]
    pub fn with_expires(mut self, expires: bool) -> Self {
        self.expires = expires;
        self
    }

    /// Sets [`Capabilities::lost_before_taken`].
    #[must_use]
    pub fn with_lost_before_taken(mut self, lost_before_taken: bool) -> Self {
        self.lost_before_taken = lost_before_taken;
        self
    }

    /// Sets [`Capabilities::min_ttl`].
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Sets [`Capabilities::ttl_granularity`].
    #[must_use]
    pub fn with_ttl_granularity(mut self, ttl_granularity: Duration) -> Self {
        self.ttl_granularity = ttl_granularity;
        self
    }

    /// Sets [`Capabilities::holder_info`].
    #[must_use]
    pub fn with_holder_info(mut self, holder_info: bool) -> Self {
        self.holder_info = holder_info;
        self
    }

    /// Sets [`Capabilities::keep_for`].
    #[must_use]
    pub fn with_keep_for(mut self, keep_for: bool) -> Self {
        self.keep_for = keep_for;
        self
    }

    /// Sets [`Capabilities::keep_for_tail`].
    #[must_use]
    pub fn with_keep_for_tail(mut self, tail: Duration) -> Self {
        self.keep_for_tail = Some(tail);
        self
    }

    /// How long past its keep-for a lease released with a sliver of it left may live:
    /// [`Capabilities::keep_for_tail`] where set, else the minimum TTL where it exceeds
    /// the TTL granularity, else zero.
    pub fn keep_for_overrun(&self) -> Duration {
        match self.keep_for_tail {
            Some(tail) => tail,
            None if self.min_ttl > self.ttl_granularity => self.min_ttl,
            None => Duration::ZERO,
        }
    }

    /// Sets [`Capabilities::release_notification`].
    #[must_use]
    pub fn with_release_notification(mut self, release_notification: bool) -> Self {
        self.release_notification = release_notification;
        self
    }

    /// Sets [`Capabilities::max_renew_batch`].
    #[must_use]
    pub fn with_max_renew_batch(mut self, max_renew_batch: usize) -> Self {
        self.max_renew_batch = max_renew_batch;
        self
    }

    /// The TTL the store will actually apply for a requested `ttl`: at least `min_ttl`,
    /// rounded up to `ttl_granularity`.
    pub fn effective_ttl(&self, ttl: Duration) -> Duration {
        let ttl = ttl.max(self.min_ttl);
        let g = self.ttl_granularity.as_nanos();
        if g <= 1 {
            return ttl;
        }
        let n = ttl.as_nanos();
        let rounded = n.div_ceil(g) * g;
        Duration::from_nanos(u64::try_from(rounded).unwrap_or(u64::MAX))
    }
}

/// Who holds a lease, as far as the store can tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldBy {
    /// The holder's label.
    pub holder: Option<String>,
    /// Time left before the lease lapses, by the store's clock.
    pub remaining: Option<Duration>,
}

impl fmt::Display for HeldBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.holder, self.remaining) {
            (Some(h), Some(r)) => write!(f, "{h} for another {r:?}"),
            (Some(h), None) => write!(f, "{h}"),
            (None, Some(r)) => write!(f, "unknown holder for another {r:?}"),
            (None, None) => write!(f, "unknown holder"),
        }
    }
}

/// Answer to [`crate::LeaseBackend::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is ours.
    Acquired {
        /// Greater than every token handed out before for this name.
        fencing: FencingToken,
        /// The TTL the store applied (after rounding).
        ttl: Duration,
    },
    /// Someone else holds it.
    Held(HeldBy),
}

/// One entry of a renewal batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewItem {
    /// Lease name.
    pub name: LeaseName,
    /// Owner token from the acquisition.
    pub token: OwnerToken,
}

/// Per-lease answer to [`crate::LeaseBackend::renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The lease is still ours and now lasts the requested TTL from the store's "now".
    Renewed,
    /// The lease is not ours any more (expired, released, taken over or never ours).
    Lost,
}

/// Answer to [`crate::LeaseBackend::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// We held it; it is released (or shortened to keep-for).
    Released,
    /// We did not hold it (it lapsed, someone else holds it, or it was released already).
    /// Nothing was changed.
    NotOwner,
}

/// What [`crate::LeaseBackend::inspect`] sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Holder label.
    pub holder: Option<String>,
    /// Fencing token of the current holder's acquisition.
    pub fencing: Option<FencingToken>,
    /// Time left before the lease lapses, by the store's clock (`None` for leases that do
    /// not expire).
    pub remaining: Option<Duration>,
}

/// Default maximum for TTLs and keep-for: seven days.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Options for one acquisition. Build with [`LeaseOptions::builder`]; invalid
/// combinations are rejected by [`LeaseOptionsBuilder::build`].
///
/// ```
/// use std::time::Duration;
/// use lease_core::LeaseOptions;
/// let opts = LeaseOptions::builder(Duration::from_secs(30))
///     .wait(Duration::from_secs(10))
///     .keep_for(Duration::from_secs(50))
///     .build()?;
/// assert_eq!(opts.renew_every(), Duration::from_secs(10));
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    ttl: Duration,
    renew_every: Duration,
    wait: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    keep_for: Duration,
    call_timeout: Duration,
    safety_margin: Duration,
}

impl LeaseOptions {
    /// Starts a builder with the given TTL (lockAtMostFor) and defaults for the rest.
    pub fn builder(ttl: Duration) -> LeaseOptionsBuilder {
        LeaseOptionsBuilder {
            ttl,
            renew_every: None,
            wait: Duration::ZERO,
            backoff_min: None,
            backoff_max: None,
            keep_for: Duration::ZERO,
            call_timeout: None,
            safety_margin: None,
        }
    }

    /// Options with `ttl` and all defaults.
    pub fn new(ttl: Duration) -> Result<Self, InvalidInput> {
        Self::builder(ttl).build()
    }

    /// How long the store keeps the lease without renewal (lockAtMostFor).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
    /// How often the heartbeat renews (default TTL/3).
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }
    /// How long `acquire` waits for a held lease (zero: do not wait).
    pub fn wait(&self) -> Duration {
        self.wait
    }
    /// Lower bound of the retry backoff.
    pub fn backoff_min(&self) -> Duration {
        self.backoff_min
    }
    /// Upper bound of the retry backoff.
    pub fn backoff_max(&self) -> Duration {
        self.backoff_max
    }
    /// How long after acquisition the lease stays taken even if released early
    /// (lockAtLeastFor).
    pub fn keep_for(&self) -> Duration {
        self.keep_for
    }
    /// The same options with another keep-for (validated by the caller).
    pub(crate) fn with_keep_for(mut self, keep_for: Duration) -> Self {
        self.keep_for = keep_for;
        self
    }
    /// Timeout of every single call to the store.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }
    /// How long before the TTL would run out (counted from the send time of the last
    /// successful renewal) the guard reports the lease lost.
    pub fn safety_margin(&self) -> Duration {
        self.safety_margin
    }
}

/// Builder for [`LeaseOptions`].
#[derive(Clone, Debug)]
pub struct LeaseOptionsBuilder {
    ttl: Duration,
    renew_every: Option<Duration>,
    wait: Duration,
    backoff_min: Option<Duration>,
    backoff_max: Option<Duration>,
    keep_for: Duration,
    call_timeout: Option<Duration>,
    safety_margin: Option<Duration>,
}

impl LeaseOptionsBuilder {
    /// Renewal period (default TTL/3). Must be below the TTL.
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.renew_every = Some(period);
        self
    }
    /// How long `acquire` waits for a held lease (default zero).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
    /// Retry backoff bounds; each wait is drawn with jitter between them, growing
    /// exponentially (defaults: min(10 ms, TTL/20) .. min(TTL/4, 1 s)).
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = Some(min);
        self.backoff_max = Some(max);
        self
    }
    /// lockAtLeastFor (default zero).
    pub fn keep_for(mut self, keep_for: Duration) -> Self {
        self.keep_for = keep_for;
        self
    }
    /// Per-call timeout (default min(5 s, TTL/3)).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }
    /// Safety margin (default TTL/10). Together with the renewal period, the call
    /// timeout and the shortest backoff it must leave room for one renewal retry before
    /// the deadline: `renew_every + call_timeout + backoff_min < ttl - margin`.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<LeaseOptions, InvalidInput> {
        let ttl = self.ttl;
        if ttl.is_zero() {
            return Err(InvalidInput::TtlZero);
        }
        if ttl > MAX_TTL {
            return Err(InvalidInput::TooLarge {
                what: "ttl",
                value: ttl,
                max: MAX_TTL,
            });
        }
        let renew_every = self.renew_every.unwrap_or(ttl / 3);
        if renew_every.is_zero() || renew_every >= ttl {
            return Err(InvalidInput::RenewPeriod { renew_every, ttl });
        }
        let safety_margin = self.safety_margin.unwrap_or(ttl / 10);
        let call_timeout = self
            .call_timeout
            .unwrap_or_else(|| (ttl / 3).min(Duration::from_secs(5)));
        if call_timeout.is_zero() || call_timeout >= ttl {
            return Err(InvalidInput::CallTimeout {
                timeout: call_timeout,
                ttl,
            });
        }
        let backoff_min = self
            .backoff_min
            .unwrap_or_else(|| (ttl / 20).min(Duration::from_millis(10)));
        let backoff_max = self.backoff_max.unwrap_or_else(|| {
            (ttl / 4).clamp(backoff_min, Duration::from_secs(1).max(backoff_min))
        });
        if backoff_min.is_zero() || backoff_min > backoff_max {
            return Err(InvalidInput::Backoff {
                min: backoff_min,
                max: backoff_max,
            });
        }
        // One retry must fit: the renewal sent `renew_every` after the last success may
        // fail only at its timeout, and its retry waits at least `backoff_min`; it must
        // still be sent before the deadline, `ttl - margin` after the last success.
        let retry_sent_by = renew_every
            .saturating_add(call_timeout)
            .saturating_add(backoff_min);
        if safety_margin >= ttl || retry_sent_by >= ttl - safety_margin {
            return Err(InvalidInput::SafetyMargin {
                margin: safety_margin,
                ttl,
                renew_every,
                call_timeout,
                backoff_min,
            });
        }
        if self.keep_for > MAX_TTL {
            return Err(InvalidInput::TooLarge {
                what: "keep_for",
                value: self.keep_for,
                max: MAX_TTL,
            });
        }
        if self.wait > MAX_TTL {
            return Err(InvalidInput::TooLarge {
                what: "wait",
                value: self.wait,
                max: MAX_TTL,
            });
        }
        Ok(LeaseOptions {
            ttl,
            renew_every,
            wait: self.wait,
            backoff_min,
            backoff_max,
            keep_for: self.keep_for,
            call_timeout,
            safety_margin,
        })
    }
}

thread_local! {
    /// The process whose generator state this thread's last token came from (0: none yet).
    static TOKENS_PID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// 16 random bytes for an owner token, without a system call for the randomness itself:
/// the operating system's generator (`getrandom`) was one system call per acquire, the
/// largest kernel cost of a client running many acquires at once. The thread's generator
/// is reseeded from the operating system when its process id is not the one it was
/// seeded in (a thread's first token, or a child after `fork`, whose copy of the state
/// would otherwise repeat its parent's tokens); reading the process id is a system call
/// too, but half the cost. If reseeding fails the bytes come from the operating system.
fn random_bytes() -> [u8; 16] {
    use rand::Rng as _;
    let mut bytes = [0u8; 16];
    let pid = std::process::id();
    let mut rng = rand::rng();
    if TOKENS_PID.with(|p| p.get()) != pid {
        if rng.reseed().is_err() {
            return *uuid::Uuid::new_v4().as_bytes();
        }
        TOKENS_PID.with(|p| p.set(pid));
    }
    rng.fill_bytes(&mut bytes);
    bytes
}

#[cfg(test)]
mod token_tests {
    use super::OwnerToken;
    use std::collections::HashSet;

    #[test]
    fn owner_tokens_are_random_v4_uuids_never_repeated() {
        let per_thread = 20_000;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|_| OwnerToken::random())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for token in t.join().unwrap_or_default() {
                assert_eq!(token.0.get_version_num(), 4, "{}", token.0);
                assert!(seen.insert(token), "token {} repeated", token.0);
            }
        }
        assert_eq!(seen.len(), 4 * per_thread);
    }
}
