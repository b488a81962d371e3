//! Test servers: real stores for tests (environment address, testcontainers, or a
//! throwaway local process).
//!
//! Each kind of store has a handle ([`RedisServer`], ...) whose `start()` takes the first
//! source that works:
//!
//! 1. an address from the environment (`LEASE_TEST_REDIS_URL`, ...);
//! 2. a container through testcontainers where a Docker engine answers (feature
//!    `containers`, on by default; `LEASE_TEST_CONTAINERS=0` skips it; see
//!    `container.rs` for the details and limits);
//! 3. a throwaway server started from the local binary on a free loopback port in a temp
//!    directory, killed and cleaned up when the handle drops.
//!
//! Fault injection (stop, kill, pause, restart) on these handles needs the local-process
//! source; on a server from the environment or a container those operations return
//! [`HarnessError::NotOwned`]. Tests that inject faults ask for a local process
//! (`start_local` and the like), or for a container they control ([`docker`]: pause,
//! stop and start, kill, disconnect from its network). The PostgreSQL server shared by a
//! test binary ([`PostgresServer::shared`]) is a container where the engine answers, and
//! a local cluster elsewhere; either is removed when the test process exits.
//!
//! Every start prints one `lease test server: ...` line naming the source, also for
//! tests that pass.

use std::fmt;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};

pub mod clock;
mod container;
pub mod docker;
mod engine;
pub mod netns;
pub mod pgbouncer;
mod process;
pub mod proxy;
pub mod redis;
pub mod tls;

pub use self::etcd::{EtcdCluster, EtcdServer};
pub use self::mariadb::MariaDbServer;
pub use self::pgbouncer::{PgBouncer, PoolMode};
pub use self::postgres::PostgresServer;
pub use self::redis::{RedisCluster, RedisSentinels, RedisServer};
pub use self::tls::TestCerts;
pub use self::zookeeper::{ZooKeeperEnsemble, ZooKeeperServer};

/// Where a test server came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// An address from the environment (`LEASE_TEST_*`); the harness does not own it.
    Env,
    /// A container started through testcontainers.
    Container,
    /// A process the harness spawned from a local binary and owns.
    LocalProcess,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Env => "environment",
            Source::Container => "container",
            Source::LocalProcess => "local process",
        })
    }
}

/// Why a test server could not be provided or controlled.
#[derive(Debug)]
#[non_exhaustive]
pub enum HarnessError {
    /// No source could provide a server. The message says what to install or set.
    Unavailable(String),
    /// The server process did not start or did not become ready; the message includes
    /// the tail of its log.
    Start(String),
    /// The operation needs a server process the harness owns.
    NotOwned {
        /// The operation (`stop`, `kill`, `pause`, ...).
        operation: &'static str,
        /// Where the server came from.
        source: Source,
    },
    /// An operating-system call failed.
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Unavailable(m) => write!(f, "no test server available: {m}"),
            HarnessError::Start(m) => write!(f, "test server did not start: {m}"),
            HarnessError::NotOwned { operation, source } => write!(
                f,
                "cannot {operation} a test server from the {source}: only servers the harness \
                 started as local processes can be controlled"
            ),
            HarnessError::Io { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for HarnessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HarnessError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl HarnessError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io {
            context: context.into(),
            source,
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
/// Another process may take it before the server binds it; callers retry on "address in
/// use".
pub fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| HarnessError::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| HarnessError::io("reading the bound port", e))?
        .port();
    Ok(port)
}

/// `n` distinct TCP ports on 127.0.0.1 that were free a moment ago: all are held bound
/// until all are chosen, so that one server never gets the same port twice (the OS may
/// hand out a port again as soon as it is released). Others may still take them before
/// the server binds them; callers retry on "address in use".
pub fn free_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
    let mut held = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..n {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| HarnessError::io("binding 127.0.0.1:0 to find a free port", e))?;
        ports.push(
            listener
                .local_addr()
                .map_err(|e| HarnessError::io("reading the bound port", e))?
                .port(),
        );
        held.push(listener);
    }
    Ok(ports)
}

/// How many times a server is started on new free ports when another process took one
/// of them between probing and binding.
pub(crate) const PORT_ATTEMPTS: usize = 5;

/// The one policy for starting a server on free ports, shared by every store's harness:
/// up to [`PORT_ATTEMPTS`] tries, each on new ports, going on only while the last failure
/// says that a port was taken meanwhile (one of `in_use` in the server's log); the error
/// names the last failure.
///
/// ```ignore
/// let mut attempts = PortAttempts::new(&["Address already in use"]);
/// while let Some(ports) = attempts.next(1)? {
///     match start_on(ports[0]) {
///         Ok(server) => return Ok(server),
///         Err((why, log_tail)) => attempts.failed(why, &log_tail),
///     }
/// }
/// Err(attempts.into_error())
/// ```
pub(crate) struct PortAttempts {
    in_use: &'static [&'static str],
    tried: usize,
    again: bool,
    last: String,
}

impl PortAttempts {
    pub(crate) fn new(in_use: &'static [&'static str]) -> Self {
        PortAttempts {
            in_use,
            tried: 0,
            again: true,
            last: String::new(),
        }
    }

    /// `n` distinct free ports for the next try, or `None` when no try is left (or the
    /// last failure was not a port taken).
    pub(crate) fn next(&mut self, n: usize) -> Result<Option<Vec<u16>>, HarnessError> {
        if !self.again || self.tried >= PORT_ATTEMPTS {
            return Ok(None);
        }
        self.tried += 1;
        self.again = false;
        free_ports(n).map(Some)
    }

    /// Records a failed try: `why`, and the server's log tail, which tells whether a port
    /// was taken (then the next call to [`next`](Self::next) gives new ports).
    pub(crate) fn failed(&mut self, why: String, log_tail: &str) {
        self.again = self.in_use.iter().any(|m| log_tail.contains(m));
        self.last = format!("{why}; log tail:\n{log_tail}");
    }

    /// The error after the last try.
    pub(crate) fn into_error(self) -> HarnessError {
        HarnessError::Start(self.last)
    }
}

/// Finds an executable: each directory of `PATH`, then `extra_dirs`.
pub fn find_binary(name: &str, extra_dirs: &[&str]) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain(extra_dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Says which server a test got (the "lease test server: ..." lines), ending with
/// `[test NAME]` when the test is known (scripts/count-test-servers.sh counts tests per
/// source from it). Written to the process's standard error directly: the test runner
/// captures only `print!`/`eprint!` output, so the line shows for passing tests too.
pub(crate) fn announce(line: fmt::Arguments<'_>) {
    use std::io::Write;
    // One write of the whole line: output of other threads (the test runner's "test ...
    // ok") must not land inside it, or the count script misses it.
    let text = match current_test() {
        Some(test) => format!("{line} [test {test}]\n"),
        None => format!("{line}\n"),
    };
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

std::thread_local! {
    /// The test a blocking helper thread works for (see [`for_test`]).
    static TEST: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The running test's name: the test runner names each test's thread after it; a
/// helper thread inherits it through [`for_test`].
pub(crate) fn current_test() -> Option<String> {
    TEST.with(|t| t.borrow().clone()).or_else(|| {
        std::thread::current()
            .name()
            .filter(|n| *n != "main" && !n.starts_with("tokio-"))
            .map(str::to_owned)
    })
}

/// Runs `f` on this (helper) thread as part of `test`.
pub(crate) fn for_test<T>(test: Option<String>, f: impl FnOnce() -> T) -> T {
    let before = TEST.with(|t| t.replace(test));
    let out = f();
    TEST.with(|t| *t.borrow_mut() = before);
    out
}

/// The value of an environment variable, if set and not blank.
pub(crate) fn env_nonempty(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}
pub mod etcd;
pub mod mariadb;
pub mod postgres;
mod zk_wire;
pub mod zookeeper;

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        for _ in 0..50 {
            let mut ports = free_ports(6).unwrap();
            ports.sort_unstable();
            ports.dedup();
            assert_eq!(ports.len(), 6);
        }
    }
}
