//! The one error type of the crate family.
//!
//! Variants say *what happened*; [`Error::is_retryable`] answers the separate question
//! *may a retry help?* Backend crates keep their own error types private and convert into
//! [`Error`].

use std::time::Duration;

/// A boxed error from a store's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout the crate family.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when talking to a lease store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input was rejected before anything was sent to the store.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),

    /// The store could not be reached (connection refused, reset, DNS, TLS ...).
    #[error("{backend} store unreachable: {source}")]
    Unavailable {
        /// Short backend name (`redis`, `postgres`, `etcd`, `memory`, ...).
        backend: &'static str,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// A call to the store did not finish within its timeout.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// The primitive that timed out (`acquire`, `renew`, `release`, `inspect`, ...).
        operation: &'static str,
        /// The timeout that elapsed.
        after: Duration,
    },

    /// The store answered with something the backend does not understand: a bug in the
    /// backend or a store that is not what it claims to be. Retrying does not help.
    #[error("{backend} store sent an unexpected reply: {detail}")]
    UnexpectedReply {
        /// Short backend name.
        backend: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },

    /// The store refused the request (permissions, read-only replica,
    /// schema missing ...). Retrying the same call does not help.
    #[error("{backend} store rejected the request: {source}")]
    Rejected {
        /// Short backend name.
        backend: &'static str,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// A TLS connection could not be set up: a certificate or key file that is missing or
    /// not what it should be, a server certificate that fails verification (unknown CA,
    /// wrong host name, expired), a server that wants a client certificate, or a server
    /// that does not speak TLS. A configuration error: retrying does not help.
    #[error("{backend} TLS: {detail}")]
    Tls {
        /// Short backend name.
        backend: &'static str,
        /// What failed, naming the file or the check.
        detail: String,
    },

    /// The store refused the credentials (wrong user or password, no password given where
    /// one is required, no client certificate where the server authenticates by one).
    /// Retrying the same call does not help.
    #[error("{backend} store refused the credentials: {source}")]
    Auth {
        /// Short backend name.
        backend: &'static str,
        /// The store's answer (never the password).
        #[source]
        source: BoxError,
    },

    /// Any other store error. `retryable` says whether the backend believes a retry may help.
    #[error("{backend} store error: {source}")]
    Backend {
        /// Short backend name.
        backend: &'static str,
        /// Whether the backend believes a retry may help.
        retryable: bool,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// Waiting for a held lease ran out of time.
    #[error("lease {name} still held after waiting {waited:?}{}", holder_suffix(.holder))]
    StillHeld {
        /// The lease name (lossy UTF-8).
        name: String,
        /// How long the caller waited.
        waited: Duration,
        /// Who holds it, where the store can tell.
        holder: Option<String>,
    },

    /// A protected resource refused a write: its fencing token is below the highest
    /// token the resource has seen, so a newer holder has written since (this writer's
    /// lease was lost, or taken over while it was paused). Not retryable: the writer no
    /// longer holds the lease; its work must stop, and nothing of the write was applied.
    #[error("stale fencing token {token} for {resource}: token {highest} has been seen")]
    Fenced {
        /// The protected resource's name.
        resource: String,
        /// The token the write carried.
        token: u64,
        /// The highest token the resource had seen.
        highest: u64,
    },

    /// The operation needs a capability the backend does not have.
    #[error("{backend} backend does not support {what}")]
    Unsupported {
        /// Short backend name.
        backend: &'static str,
        /// What is not supported.
        what: &'static str,
    },

    /// A backend's future panicked: a bug in the backend. The client catches the panic so
    /// that it cannot take the heartbeat (and with it every other lease) down; a renewal
    /// that panics counts as a failed renewal and is retried until the safety deadline.
    #[error("the {backend} backend panicked in {operation}: {message}")]
    Panicked {
        /// Short backend name.
        backend: &'static str,
        /// The primitive that panicked.
        operation: &'static str,
        /// The panic's message, where it was a string.
        message: String,
    },

    /// No tokio runtime is running, so the client cannot start its heartbeat task.
    #[error("no tokio runtime: lease clients must be used inside a tokio runtime")]
    NoRuntime,

    /// The URL names a store this build does not include.
    #[error(
        "store {scheme}:// is not compiled in: enable the `{feature}` feature of the `leasehold` crate"
    )]
    NotCompiledIn {
        /// URL scheme.
        scheme: String,
        /// Cargo feature that adds it.
        feature: &'static str,
    },
}

fn holder_suffix(holder: &Option<String>) -> String {
    match holder {
        Some(h) => format!(" (held by {h})"),
        None => String::new(),
    }
}

impl Error {
    /// May retrying the same call later succeed?
    ///
    /// `true` for transient conditions (store unreachable, timeout, lease still held,
    /// transient backend errors); `false` for bad input, unexpected replies, rejections and
    /// missing capabilities.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::Timeout { .. } | Error::StillHeld { .. } => true,
            Error::Backend { retryable, .. } => *retryable,
            Error::InvalidInput(_)
            | Error::UnexpectedReply { .. }
            | Error::Rejected { .. }
            | Error::Tls { .. }
            | Error::Auth { .. }
            | Error::Unsupported { .. }
            | Error::Fenced { .. }
            | Error::Panicked { .. }
            | Error::NoRuntime
            | Error::NotCompiledIn { .. } => false,
        }
    }

    /// What happened, as a short stable word: `invalid_input`, `unavailable`, `timeout`,
    /// `unexpected_reply`, `rejected`, `tls`, `auth`, `backend`, `still_held`,
    /// `fenced`, `unsupported`, `panicked`, `no_runtime` or `not_compiled_in`. Used as the
    /// `outcome` of metrics and spans; stable across releases.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidInput(_) => "invalid_input",
            Error::Unavailable { .. } => "unavailable",
            Error::Timeout { .. } => "timeout",
            Error::UnexpectedReply { .. } => "unexpected_reply",
            Error::Rejected { .. } => "rejected",
            Error::Tls { .. } => "tls",
            Error::Auth { .. } => "auth",
            Error::Backend { .. } => "backend",
            Error::StillHeld { .. } => "still_held",
            Error::Fenced { .. } => "fenced",
            Error::Unsupported { .. } => "unsupported",
            Error::Panicked { .. } => "panicked",
            Error::NoRuntime => "no_runtime",
            Error::NotCompiledIn { .. } => "not_compiled_in",
        }
    }

    /// Whether the store may have applied the call that failed with this error, so that
    /// something it took must be given back: `false` only for errors raised before
    /// anything was sent (bad input, a missing capability or runtime).
    pub(crate) fn may_have_reached_the_store(&self) -> bool {
        !matches!(
            self,
            Error::InvalidInput(_)
                | Error::Unsupported { .. }
                | Error::NoRuntime
                | Error::NotCompiledIn { .. }
        )
    }

    /// Shorthand for an [`Error::UnexpectedReply`].
    pub fn unexpected(backend: &'static str, detail: impl Into<String>) -> Self {
        Error::UnexpectedReply {
            backend,
            detail: detail.into(),
        }
    }

    /// Shorthand for an [`Error::Tls`].
    pub fn tls(backend: &'static str, detail: impl Into<String>) -> Self {
        Error::Tls {
            backend,
            detail: detail.into(),
        }
    }

    /// Shorthand for an [`Error::Auth`].
    pub fn auth(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Auth {
            backend,
            source: source.into(),
        }
    }

    /// Shorthand for an [`Error::Unavailable`].
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            source: source.into(),
        }
    }
}

/// Why an input was rejected. Every variant is checked before any call to a store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// A lease name must not be empty.
    #[error("lease name is empty")]
    EmptyName,
    /// A lease name is longer than [`crate::LeaseName::MAX_LEN`] bytes.
    #[error("lease name is {len} bytes, more than the maximum of {max}")]
    NameTooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A lease name must not contain a NUL byte.
    #[error("lease name contains a NUL byte at offset {offset}")]
    NameContainsNul {
        /// Byte offset of the first NUL.
        offset: usize,
    },
    /// A holder label is empty, too long or contains control characters.
    #[error("invalid holder label: {0}")]
    HolderLabel(String),
    /// The TTL is zero.
    #[error("ttl must be greater than zero")]
    TtlZero,
    /// The TTL (or keep-for) exceeds the maximum.
    #[error("{what} of {value:?} exceeds the maximum of {max:?}")]
    TooLarge {
        /// Which option.
        what: &'static str,
        /// The rejected value.
        value: Duration,
        /// The maximum.
        max: Duration,
    },
    /// The renewal period must be greater than zero and below the TTL.
    #[error("renewal period {renew_every:?} must be greater than zero and below the ttl {ttl:?}")]
    RenewPeriod {
        /// The rejected renewal period.
        renew_every: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// The safety margin must leave room for at least one renewal retry: a renewal sent
    /// one period after the last one, failing at the call timeout, must be retried (after
    /// the shortest backoff) before the safety deadline, TTL - margin.
    #[error(
        "safety margin {margin:?} leaves no room for a renewal retry: renewal period \
         {renew_every:?} + call timeout {call_timeout:?} + backoff minimum {backoff_min:?} \
         must be below ttl {ttl:?} minus the margin"
    )]
    SafetyMargin {
        /// The rejected margin.
        margin: Duration,
        /// The TTL.
        ttl: Duration,
        /// The renewal period.
        renew_every: Duration,
        /// The per-call timeout.
        call_timeout: Duration,
        /// The lower bound of the retry backoff.
        backoff_min: Duration,
    },
    /// The per-call timeout must be greater than zero and below the TTL.
    #[error("call timeout {timeout:?} must be greater than zero and below the ttl {ttl:?}")]
    CallTimeout {
        /// The rejected timeout.
        timeout: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// Backoff bounds must satisfy `0 < min <= max`.
    #[error("backoff must satisfy 0 < min ({min:?}) <= max ({max:?})")]
    Backoff {
        /// Lower bound.
        min: Duration,
        /// Upper bound.
        max: Duration,
    },
    /// A period for a scheduled job must be greater than zero.
    #[error("period must be greater than zero")]
    PeriodZero,
    /// A scheduled job's keep-for (lockAtLeastFor) must be below its period: the lease of
    /// one run must be free again by the next tick.
    #[error(
        "keep-for {keep_for:?} must be below the period {period:?}: with keep-for at or \
         above the period, the instance that ran finds its own lease still held at its \
         next tick (set it a little below the period, or leave it zero to derive it)"
    )]
    KeepForNotBelowPeriod {
        /// The rejected keep-for.
        keep_for: Duration,
        /// The job's period.
        period: Duration,
    },
    /// A scheduled job's keep-for is below its period, but not by the store's minimum TTL:
    /// a run released just before its keep-for ends keeps its lease for at least that
    /// minimum (etcd: 2 s), past the next tick.
    #[error(
        "keep-for {keep_for:?} plus the store's minimum TTL {min_ttl:?} must be below the \
         period {period:?}: a run released shortly before its keep-for ends keeps the lease \
         for at least the minimum TTL, and the next tick would find it still held (lower \
         keep_for, lengthen the period, or leave keep_for zero to derive it)"
    )]
    KeepForTooLongForStore {
        /// The rejected keep-for.
        keep_for: Duration,
        /// The job's period.
        period: Duration,
        /// The store's minimum TTL.
        min_ttl: Duration,
    },
    /// A scheduled job's period is too short to derive a keep-for below it on this store.
    #[error(
        "period {period:?} is not above the store's TTL granularity {granularity:?}: no \
         keep-for below the period can be derived (use a longer period, or set keep_for)"
    )]
    PeriodTooShort {
        /// The job's period.
        period: Duration,
        /// The store's TTL granularity.
        granularity: Duration,
    },
    /// A cron expression could not be parsed.
    #[error(
        "cron expression {expression:?}: {reason} (expected five fields, minute to day of \
         week, or six with seconds first as Spring's @Scheduled(cron) writes them, e.g. \
         \"0 * * * * *\" for every minute)"
    )]
    Cron {
        /// The expression as given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A time zone name is not in the IANA database.
    #[error("unknown time zone {0:?} (give an IANA name such as Europe/Berlin, or UTC)")]
    TimeZone(String),
    /// A schedule's settings do not fit together (a period of zero, a window that does
    /// not fit between firings, ...).
    #[error("schedule: {0}")]
    Schedule(String),
    /// A store URL or endpoint could not be parsed. The message never contains credentials.
    #[error("malformed store address: {0}")]
    MalformedUrl(String),
    /// A renewal batch is larger than the backend accepts in one call.
    #[error("batch of {len} exceeds the backend's maximum of {max}")]
    BatchTooLarge {
        /// Batch size.
        len: usize,
        /// Maximum.
        max: usize,
    },
    /// Some other input was rejected.
    #[error("{0}")]
    Other(String),
}
