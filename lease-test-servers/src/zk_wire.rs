//! What the ZooKeeper harnesses share, local processes (`zookeeper.rs`) and containers
//! (`docker.rs`): the four-letter words that tell whether a server serves and in which
//! mode, and a container's settings. Apart from both so that neither imports the other
//! for them.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// The environment of a container, for the official image (the project's writes its own
/// zoo.cfg with the same settings).
pub(crate) const CONTAINER_ENV: [(&str, &str); 6] = [
    ("ZOO_TICK_TIME", "200"),
    ("ZOO_4LW_COMMANDS_WHITELIST", "ruok,srvr,stat"),
    ("ZOO_ADMINSERVER_ENABLED", "false"),
    (
        "ZOO_CFG_EXTRA",
        "maxSessionTimeout=600000 extendedTypesEnabled=true",
    ),
    ("JVMFLAGS", "-Xmx256m -Dznode.container.checkIntervalMs=100"),
    ("ZOO_DATA_DIR", "/zookeeper-data"),
];

/// Whether the server serves requests: `srvr` says its mode (`ruok` answers `imok` before
/// the server is ready to serve).
pub(crate) fn serving(port: u16) -> bool {
    four_letter(port, "srvr").is_some_and(|a| a.contains("Mode:"))
}

/// Sends a four-letter word (`srvr`, `stat`, `ruok`) to the server on local `port` and
/// returns the answer, or `None` if it does not answer. Blocking, with short timeouts.
pub fn four_letter(port: u16, word: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The mode a server reports (`leader`, `follower`, `standalone`), if it serves.
pub(crate) fn mode(port: u16) -> Option<String> {
    let answer = four_letter(port, "srvr")?;
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}
