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
        shared.connections.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(connection(client, shared.clone()));
    }
}

/// One client connection: a pump each way until either side closes or the connection
/// is cut.
async fn connection(client: TcpStream, shared: Arc<Shared>) {
    let (target, fault, generation) = {
        let st = shared.state();
        (st.target, st.fault, st.generation)
    };
    if fault == ProxyFault::Reset {
        let _ = client.set_zero_linger();
        return;
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
