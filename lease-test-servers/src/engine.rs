//! The Docker engine through its command line, below both kinds of containers of the
//! harness (`container.rs`, started through testcontainers; `docker.rs`, controllable):
//! the images of each store, bounded `docker` calls, the labels, the cleanup watchers and
//! the removal of what dead test processes left behind.

use std::fmt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::HarnessError;

/// Bound of one `docker` call (a pull included, for the first start of an image).
pub const CALL_BOUND: Duration = Duration::from_secs(240);

/// The images of one kind of store.
#[derive(Debug)]
pub(crate) struct Images {
    /// The official image (`name:tag`).
    pub(crate) official: &'static str,
    /// The project's own build (`scripts/build-test-images.sh`).
    pub(crate) local: &'static str,
    /// The environment variable that names the one image to use instead.
    pub(crate) var: &'static str,
}

/// Redis 7.
pub(crate) const REDIS_IMAGES: Images = Images {
    official: "redis:7.2",
    local: "lease-test/redis:7",
    var: "LEASE_TEST_REDIS_IMAGE",
};
/// PostgreSQL 15.
pub(crate) const POSTGRES_IMAGES: Images = Images {
    official: "postgres:15",
    local: "lease-test/postgres:15",
    var: "LEASE_TEST_POSTGRES_IMAGE",
};
/// etcd (3.5 official; the Debian build is 3.4).
pub(crate) const ETCD_IMAGES: Images = Images {
    official: "quay.io/coreos/etcd:v3.5.17",
    local: "lease-test/etcd:3.4",
    var: "LEASE_TEST_ETCD_IMAGE",
};

/// ZooKeeper 3.8 (the project's image has the harness's settings: tick 200 ms, sessions
/// up to 600 s, TTL nodes; the official one gets them from its environment).
pub(crate) const ZOOKEEPER_IMAGES: Images = Images {
    official: "zookeeper:3.8",
    local: "lease-test/zookeeper:3.8",
    var: "LEASE_TEST_ZOOKEEPER_IMAGE",
};

/// MariaDB 10.11 (the MySQL protocol).
pub(crate) const MARIADB_IMAGES: Images = Images {
    official: "mariadb:10.11",
    local: "lease-test/mariadb:10.11",
    var: "LEASE_TEST_MYSQL_IMAGE",
};

/// The image to run for a store: the variable's; else the official one if the engine has
/// it; else the project's build if the engine has it; else the official one (pulled by
/// the start). Asking the engine first spares a machine without a registry a failed pull
/// (a name lookup that fails, and a misleading line in the test output) when the
/// project's build is there.
pub(crate) async fn image_for(images: &Images) -> String {
    if let Some(v) = super::env_nonempty(images.var) {
        return v.trim().to_owned();
    }
    for candidate in [images.official, images.local] {
        if docker(strings(&[
            "image", "inspect", "--format", "{{.Id}}", candidate,
        ]))
        .await
        .is_ok()
        {
            return candidate.to_owned();
        }
    }
    images.official.to_owned()
}

/// Whether a Docker engine answers the command line (asked once per process).
pub fn available() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            if std::env::var("LEASE_TEST_CONTAINERS").is_ok_and(|v| v.trim() == "0") {
                return Err("LEASE_TEST_CONTAINERS=0".into());
            }
            docker_blocking(
                &["version", "--format", "{{.Server.Version}}"],
                Duration::from_secs(10),
            )
            .map(|_| ())
            .map_err(|e| format!("no Docker engine answers the docker command: {e}"))
        })
        .clone()
}

/// Runs `docker ARGS` and returns its standard output; blocking, bounded by `bound`. The
/// output is read while the command runs (a large listing must not fill the pipe).
pub(crate) fn docker_blocking(args: &[&str], bound: Duration) -> Result<String, String> {
    let child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("docker: {e}"))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(bound) {
        Ok(out) => out.map_err(|e| format!("docker: {e}"))?,
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(format!("docker {} took over {bound:?}", args.join(" ")));
        }
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "docker {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `docker ARGS` without blocking the runtime; bounded by [`CALL_BOUND`].
pub(crate) async fn docker(args: Vec<String>) -> Result<String, HarnessError> {
    let what = args.join(" ");
    let mut command = tokio::process::Command::new("docker");
    command
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(CALL_BOUND, command.output())
        .await
        .map_err(|_| HarnessError::Start(format!("docker {what} took over {CALL_BOUND:?}")))?
        .map_err(|e| HarnessError::io(format!("running docker {what}"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(HarnessError::Start(format!(
            "docker {what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// The labels every container and network of the harness carries.
pub(crate) fn labels() -> [String; 2] {
    [
        "lease-test=1".to_owned(),
        format!("lease-test.pid={}", std::process::id()),
    ]
}

/// [`remove_stale_now`], once per process (the first container start calls it).
pub fn remove_stale() -> usize {
    static DONE: OnceLock<usize> = OnceLock::new();
    *DONE.get_or_init(remove_stale_now)
}

/// Removes the containers and networks of test processes that no longer run (labels
/// `lease-test=1` with a `lease-test.pid` that is gone, or none): what an interrupted
/// run left when its cleanup watchers could not run. Returns how many were removed.
pub fn remove_stale_now() -> usize {
    {
        let bound = Duration::from_secs(30);
        let stale = |listing: Result<String, String>| -> Vec<String> {
            listing
                .unwrap_or_default()
                .lines()
                .filter_map(|line| {
                    let (id, pid) = line.split_once(' ').unwrap_or((line, ""));
                    let alive = pid
                        .trim()
                        .parse::<u32>()
                        .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
                    (!id.is_empty() && !alive).then(|| id.to_owned())
                })
                .collect()
        };
        let containers = stale(docker_blocking(
            &[
                "ps",
                "-a",
                "--filter",
                "label=lease-test=1",
                "--format",
                "{{.ID}} {{.Label \"lease-test.pid\"}}",
            ],
            bound,
        ));
        let mut removed = 0;
        for id in &containers {
            if docker_blocking(&["rm", "-f", "-v", id], bound).is_ok() {
                removed += 1;
            }
        }
        let networks = stale(docker_blocking(
            &[
                "network",
                "ls",
                "--filter",
                "label=lease-test=1",
                "--format",
                "{{.ID}} {{.Label \"lease-test.pid\"}}",
            ],
            bound,
        ));
        for id in &networks {
            if docker_blocking(&["network", "rm", id], bound).is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            super::announce(format_args!(
                "lease test server: removed {removed} container(s) and network(s) left by test \
                 processes that no longer run"
            ));
        }
        removed
    }
}

/// A watcher process that runs a cleanup command when its pipe closes: when the handle
/// drops, or when the test process exits in any way.
pub(crate) struct Cleanup {
    child: Option<Child>,
    pipe: Option<ChildStdin>,
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cleanup")
    }
}

impl Cleanup {
    /// Removes container `id` at the end.
    pub(crate) fn container(id: &str) -> Result<Cleanup, HarnessError> {
        Self::spawn("read -r _; docker rm -f -v \"$1\" >/dev/null 2>&1", id)
    }

    /// Removes network `id` at the end (retried while its containers are still being
    /// removed).
    pub(crate) fn network(id: &str) -> Result<Cleanup, HarnessError> {
        Self::spawn(
            "read -r _; i=0; while [ $i -lt 80 ]; do docker network rm \"$1\" >/dev/null 2>&1 && exit 0; \
             sleep 0.25; i=$((i+1)); done",
            id,
        )
    }

    fn spawn(script: &str, arg: &str) -> Result<Cleanup, HarnessError> {
        let (child, pipe) = super::process::spawn_watcher(
            script,
            "lease-docker-cleanup",
            &[std::ffi::OsStr::new(arg)],
            "a container cleanup watcher",
        )?;
        Ok(Cleanup {
            child: Some(child),
            pipe,
        })
    }

    /// Closes the pipe and waits until the cleanup has run.
    pub(crate) fn run_now(&mut self) {
        self.pipe.take();
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // EOF: the watcher removes what it guards; a thread reaps it, so a drop does not
        // wait for the removal.
        self.pipe.take();
        if let Some(mut child) = self.child.take() {
            std::thread::spawn(move || {
                let _ = child.wait();
            });
        }
    }
}
