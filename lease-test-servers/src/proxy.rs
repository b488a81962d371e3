//! [`FaultProxy`]: a TCP proxy in front of a test server that loses replies, cuts,
//! blackholes, delays or resets connections on demand, so that a client library meets the
//! failures of a real network against a real store.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyFault {
    /// Forward both ways.
    #[default]
    Pass,
    /// Forward the client's bytes, then drop the first bytes the server sends back on a
    /// connection that has sent something since this was set, and cut that connection:
    /// the server applied the request, the client never hears of it. Back to `Pass`
    /// afterwards.
    LoseNextReply,
    /// As `LoseNextReply`, then `Reset` from that moment on (every open connection cut,
    /// new ones refused) until another fault is set: the store applied a call, its reply
    /// was lost, and the store stays unreachable (so that a cleanup sent at once fails
    /// too).
    LoseNextReplyThenReset,
    /// As `LoseNextReply`, but only the client's side of that connection is cut: the
    /// server's side stays open (and silent) until the proxy is dropped or every
    /// connection is cut. The server applied the request and never learns that its client
    /// has gone, as when the network fails after a request and no close gets through.
    LoseNextReplyServerUnaware,
    /// Read what the client sends and forward nothing either way (a black hole).
    Blackhole,
    /// Accept new connections and read what their clients send, but never connect them
    /// to the server, for as long as they live (also after another fault is set); open
    /// connections are forwarded as under `Pass`. A server that accepts a connection
    /// while it starts and never answers on it, as ZooKeeper 3.8 does with some of the
    /// connections made in the moment it starts listening.
    SwallowNew,
    /// Hold every chunk this long, both ways.
    Delay(Duration),
    /// Cut every connection at once, and new ones as they come.
    Reset,
}

#[derive(Debug)]
struct State {
    fault: ProxyFault,
    target: SocketAddr,
    /// Bumped to cut every open connection.
    generation: u64,
    /// Bumped whenever `LoseNextReply` is set: a connection may lose a reply only if it
    /// sent something after the latest arming.
    armed_at: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cut: watch::Sender<u64>,
    replies_lost: AtomicU64,
    connections: AtomicU64,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A TCP proxy on a free loopback port in front of `target`. Stopped when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy for `target` on a free loopback port.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (cut, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                fault: ProxyFault::Pass,
                target,
                generation: 0,
                armed_at: 0,
            }),
            cut,
            replies_lost: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            accept,
        })
    }

    /// Starts a proxy in front of the server of `url` (`scheme://[user@]host:port[/...]`,
    /// the host an IP address, as the harness's URLs are) and returns it with `url`
    /// rewritten to go through it.
    pub async fn in_front_of(url: &str) -> io::Result<(Self, String)> {
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no host:port in {url}"),
            )
        };
        let rest = url.split_once("://").ok_or_else(bad)?.1;
        let authority = rest.split(['/', '?']).next().ok_or_else(bad)?;
        let host_port = authority.rsplit('@').next().ok_or_else(bad)?;
        let target: SocketAddr = host_port.parse().map_err(|_| bad())?;
        let proxy = Self::start(target).await?;
        let via = url.replacen(host_port, &proxy.addr().to_string(), 1);
        Ok((proxy, via))
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets what the proxy does from now on.
    pub fn set(&self, fault: ProxyFault) {
        let mut st = self.shared.state();
        if matches!(
            fault,
            ProxyFault::LoseNextReply
                | ProxyFault::LoseNextReplyThenReset
                | ProxyFault::LoseNextReplyServerUnaware
        ) {
            st.armed_at += 1;
        }
        st.fault = fault;
        if fault == ProxyFault::Reset {
            st.generation += 1;
            let _ = self.shared.cut.send(st.generation);
        }
    }

    /// The fault in force (`LoseNextReply` turns back to `Pass` once a reply was lost,
    /// `LoseNextReplyThenReset` into `Reset`).
    pub fn fault(&self) -> ProxyFault {
        self.shared.state().fault
    }

    /// Sends new connections to `target` (a failover behind a stable address); open
    /// connections stay with the old server until cut.
    pub fn set_target(&self, target: SocketAddr) {
        self.shared.state().target = target;
    }

    /// Cuts every open connection.
    pub fn cut_all(&self) {
        let mut st = self.shared.state();
        st.generation += 1;
        let _ = self.shared.cut.send(st.generation);
    }

    /// How many replies `LoseNextReply` has dropped.
    pub fn replies_lost(&self) -> u64 {
        self.shared.replies_lost.load(Ordering::SeqCst)
    }

    /// How many connections clients have opened through the proxy.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        // What the proxy does to this connection is settled when it is accepted (counted
        // after, so that a caller who sees the count knows which fault it got).
        let at_accept = {
            let st = shared.state();
            (st.target, st.fault, st.generation)
        };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(connection(client, shared.clone(), at_accept));
    }
}

/// One client connection: a pump each way until either side closes or the connection
/// is cut. `at_accept`: the target, fault and generation when it was accepted.
async fn connection(
    client: TcpStream,
    shared: Arc<Shared>,
    at_accept: (SocketAddr, ProxyFault, u64),
) {
    let (target, fault, generation) = at_accept;
    if fault == ProxyFault::Reset {
        let _ = client.set_zero_linger();
        return;
    }
    if fault == ProxyFault::SwallowNew {
        let mut cut = shared.cut.subscribe();
        let mut client = client;
        let mut buf = vec![0u8; 4096];
        loop {
            tokio::select! {
                read = client.read(&mut buf) => {
                    if matches!(read, Ok(0) | Err(_)) {
                        return;
                    }
                }
                _ = cut.wait_for(|g| *g > generation) => return,
            }
        }
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // The arming this connection last sent bytes after (0: none).
    let sent_after = Arc::new(AtomicU64::new(0));
    let mut cut = shared.cut.subscribe();
    let up = pump(
        &mut client_read,
        &mut server_write,
        shared.clone(),
        Direction::Up(sent_after.clone()),
    );
    let down = pump(
        &mut server_read,
        &mut client_write,
        shared.clone(),
        Direction::Down(sent_after),
    );
    let ended = tokio::select! {
        _ = up => Ended::Closed,
        ended = down => ended,
        _ = cut.wait_for(|g| *g > generation) => Ended::Closed,
    };
    if ended == Ended::ServerLeftOpen {
        // The client's side is cut; the server's stays open until every connection is.
        drop((client_read, client_write));
        let _ = cut.wait_for(|g| *g > generation).await;
    }
}

/// How a pump ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// A side closed, or the connection is to be cut.
    Closed,
    /// A reply was lost by `LoseNextReplyServerUnaware`: cut the client's side only.
    ServerLeftOpen,
}

enum Direction {
    /// Client to server; records which arming the client has sent bytes after.
    Up(Arc<AtomicU64>),
    /// Server to client; may lose a reply.
    Down(Arc<AtomicU64>),
}

async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    shared: Arc<Shared>,
    direction: Direction,
) -> Ended {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return Ended::Closed,
            Ok(n) => n,
        };
        let fault = shared.state().fault;
        match fault {
            ProxyFault::Blackhole => continue,
            ProxyFault::Delay(d) => tokio::time::sleep(d).await,
            ProxyFault::Reset => return Ended::Closed,
            ProxyFault::Pass
            | ProxyFault::SwallowNew
            | ProxyFault::LoseNextReply
            | ProxyFault::LoseNextReplyThenReset
            | ProxyFault::LoseNextReplyServerUnaware => {}
        }
        match &direction {
            Direction::Up(sent_after) => {
                let armed_at = shared.state().armed_at;
                sent_after.store(armed_at, Ordering::SeqCst);
            }
            Direction::Down(sent_after) => {
                let mut st = shared.state();
                let then_reset = st.fault == ProxyFault::LoseNextReplyThenReset;
                let unaware = st.fault == ProxyFault::LoseNextReplyServerUnaware;
                if (st.fault == ProxyFault::LoseNextReply || then_reset || unaware)
                    && st.armed_at > 0
                    && sent_after.load(Ordering::SeqCst) == st.armed_at
                {
                    // The request went through after the arming: its reply is lost, and
                    // the connection with it.
                    shared.replies_lost.fetch_add(1, Ordering::SeqCst);
                    if then_reset {
                        st.fault = ProxyFault::Reset;
                        st.generation += 1;
                        let _ = shared.cut.send(st.generation);
                    } else {
                        st.fault = ProxyFault::Pass;
                    }
                    return if unaware {
                        Ended::ServerLeftOpen
                    } else {
                        Ended::Closed
                    };
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return Ended::Closed;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
    use super::*;

    /// An echo server on a free loopback port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// A connection made under `SwallowNew` is never answered, also after `Pass`; one
    /// made after `Pass` is. The absence of an answer is the subject: 300 ms of silence
    /// (the echo answers within a millisecond).
    #[tokio::test]
    async fn a_swallowed_connection_stays_swallowed() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        proxy.set(ProxyFault::SwallowNew);
        let mut swallowed = TcpStream::connect(proxy.addr()).await.unwrap();
        swallowed.write_all(b"a").await.unwrap();
        // Accepted (and its fault settled) before the fault changes.
        while proxy.connections() == 0 {
            tokio::task::yield_now().await;
        }
        proxy.set(ProxyFault::Pass);
        swallowed.write_all(b"b").await.unwrap();
        let mut buf = [0u8; 8];
        let heard =
            tokio::time::timeout(Duration::from_millis(300), swallowed.read(&mut buf)).await;
        assert!(
            heard.is_err(),
            "a swallowed connection was answered: {heard:?}"
        );
        let mut passed = TcpStream::connect(proxy.addr()).await.unwrap();
        passed.write_all(b"c").await.unwrap();
        let n = passed.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"c");
    }
}
