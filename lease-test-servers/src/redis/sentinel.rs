//! Redis Sentinel for tests: [`RedisSentinels`] watching a primary.

use super::*;

/// Redis Sentinel processes watching one primary under a service name, for tests of a
/// failover: local `redis-sentinel` processes (the Debian package; `redis-server
/// --sentinel` when that binary is missing) on free loopback ports, each with its config
/// file in a temp dir, killed when the handle drops.
///
/// They mark the primary down after 500 ms without a reply and need 2 of them to agree,
/// so a killed primary is replaced within about 2 s.
#[derive(Debug)]
pub struct RedisSentinels {
    service: String,
    ports: Vec<u16>,
    // Declared in drop order: the processes, the watcher, then the directory.
    processes: Vec<ChildProcess>,
    _watcher: DirWatcher,
    _dir: tempfile::TempDir,
}

impl RedisSentinels {
    /// Starts `count` sentinels (at least 3 makes a quorum of 2 meaningful) watching the
    /// primary on `127.0.0.1:primary_port` as `service`, and waits until each knows the
    /// primary and its replicas.
    pub async fn start(
        primary_port: u16,
        service: &str,
        count: usize,
    ) -> Result<RedisSentinels, HarnessError> {
        let (binary, extra) = match find_binary(
            "redis-sentinel",
            &["/usr/bin", "/usr/sbin", "/usr/local/bin"],
        ) {
            Some(b) => (b, None),
            None => (
                find_binary("redis-server", &["/usr/bin", "/usr/sbin", "/usr/local/bin"])
                    .ok_or_else(|| {
                        HarnessError::Unavailable(format!(
                            "no redis-sentinel or redis-server: install the Debian package \
                             `redis-sentinel` ({INSTALL_HINT})"
                        ))
                    })?,
                Some("--sentinel"),
            ),
        };
        let dir = tempfile::Builder::new()
            .prefix("lease-sentinel-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for redis-sentinel", e))?;
        let watcher = DirWatcher::spawn(dir.path())?;
        let ports = crate::free_ports(count)?;
        let mut processes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nset-proc-title no\ndir {dir}\n\
                 sentinel monitor {service} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {service} 500\n\
                 sentinel failover-timeout {service} 3000\n\
                 sentinel parallel-syncs {service} 1\n",
                dir = dir.path().display()
            );
            std::fs::write(&conf, text)
                .map_err(|e| HarnessError::io("writing a sentinel config", e))?;
            let mut args: Vec<OsString> = vec![conf.into_os_string()];
            if let Some(flag) = extra {
                args.push(flag.into());
            }
            let log = dir.path().join(format!("sentinel-{i}.log"));
            processes.push(spawn_ready(&binary, args, log, *port, "sentinel").await?);
        }
        crate::announce(format_args!(
            "lease test server: {count} redis sentinels for {service} (primary 127.0.0.1:{primary_port}) \
             on ports {ports:?} (local process {}, dir {})",
            binary.display(),
            dir.path().display()
        ));
        Ok(RedisSentinels {
            service: service.to_owned(),
            ports,
            processes,
            _watcher: watcher,
            _dir: dir,
        })
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,.../service`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.service)
    }

    /// The sentinels' ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The last lines of every sentinel's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.processes
            .iter()
            .enumerate()
            .map(|(i, p)| format!("sentinel {i}:\n{}", p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for p in &mut self.processes {
            let _ = p.kill();
        }
    }
}
