//! A network namespace with two links to this machine, for cutting one holder off its
//! store while it still reaches the fenced resource (root only).
//!
//! Addresses are the project's own test hosts inside the namespace this test creates:
//! `10.231.K.1` (here) ↔ `10.231.K.2` (namespace) carries store traffic and is the link that
//! gets cut; `10.232.K.1` ↔ `10.232.K.2` carries resource traffic and stays up. Store
//! traffic reaches the real server through a TCP relay listening on `10.231.K.1`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;

use tokio::net::{TcpListener, TcpStream};

/// A namespace with its two links; deleted on drop.
#[derive(Debug)]
pub struct TestNetns {
    name: String,
    store_link: String,
    k: u8,
    relays: Vec<tokio::task::JoinHandle<()>>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl TestNetns {
    /// Creates the namespace and links, or says why it cannot (not root, no `ip`, no
    /// namespace support).
    pub fn create() -> Result<Self, String> {
        if !nix::unistd::Uid::effective().is_root() {
            return Err("needs root to create a network namespace".into());
        }
        // Distinct per process (pid) and per namespace within it (counter).
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let k = u8::try_from((std::process::id() % 60 * 4 + n % 4) % 250 + 1).unwrap_or(1);
        let name = format!("leasecut{k}");
        let (s_host, s_ns) = (format!("lcs{k}h"), format!("lcs{k}n"));
        let (r_host, r_ns) = (format!("lcr{k}h"), format!("lcr{k}n"));
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let me = TestNetns {
            name: name.clone(),
            store_link: s_host.clone(),
            k,
            relays: Vec::new(),
        };
        for (host, ns, net) in [(&s_host, &s_ns, 231), (&r_host, &r_ns, 232)] {
            ip(&["link", "add", host, "type", "veth", "peer", "name", ns])?;
            ip(&["link", "set", ns, "netns", &name])?;
            ip(&["addr", "add", &format!("10.{net}.{k}.1/30"), "dev", host])?;
            ip(&["link", "set", host, "up"])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("10.{net}.{k}.2/30"),
                "dev",
                ns,
            ])?;
            ip(&["-n", &name, "link", "set", ns, "up"])?;
        }
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(me)
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This machine's end of the store link.
    pub fn store_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 231, self.k, 1))
    }

    /// This machine's end of the resource link.
    pub fn resource_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 232, self.k, 1))
    }

    /// Relays connections to `store_ip():port` to `target`; returns the port.
    pub async fn relay(&mut self, target: SocketAddr) -> std::io::Result<u16> {
        let listener = TcpListener::bind((self.store_ip(), 0)).await?;
        let port = listener.local_addr()?.port();
        self.relays.push(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
        Ok(port)
    }

    /// Cuts the store link (packets are dropped; connections hang, as in a partition).
    pub fn cut(&self) -> Result<(), String> {
        ip(&["link", "set", &self.store_link, "down"])
    }

    /// Heals the store link.
    pub fn heal(&self) -> Result<(), String> {
        ip(&["link", "set", &self.store_link, "up"])
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        for r in &self.relays {
            r.abort();
        }
        // Deleting the namespace deletes its ends of the links, and with them the peers.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.store_link]);
        let _ = ip(&["link", "del", &format!("lcr{}h", self.k)]);
    }
}
