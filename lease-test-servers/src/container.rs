//! The container source: a store in a Docker container through testcontainers, tried
//! when a Docker engine answers (feature `containers`, on by default).
//!
//! - `LEASE_TEST_CONTAINERS=0` skips this source (local processes are then used).
//! - The engine is looked for where testcontainers looks (`DOCKER_HOST`, the default
//!   sockets); without `DOCKER_HOST` and without any of those sockets it is not even
//!   asked, so machines without Docker pay nothing.
//! - The answer is probed once per process, with a 3 s bound, and why the source was
//!   skipped is printed once.
//! - A container start (the image pull included) is bounded (4 min); an image whose
//!   container did not start is not tried again by the same process (on a machine
//!   without a registry, each image's pull fails once per test binary, not once per
//!   test).
//! - A container is removed when its handle drops, also outside a tokio runtime, and
//!   when the test process exits in any way (a cleanup watcher process, see
//!   `docker.rs`). Containers carry the labels `lease-test=1` and
//!   `lease-test.pid=<pid>`; the first start of a process removes those of processes
//!   that no longer run.
//! - These containers cannot be stopped, killed, paused or restarted (their ports
//!   could change across a restart); tests that inject faults into a container use
//!   [`crate::docker`].

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

/// What to run.
pub(crate) struct Spec {
    /// The official image, the project's own (built from Debian's packages by
    /// `scripts/build-test-images.sh`), and the environment variable that names the one
    /// image to use instead of both. The one the engine has is tried first (the official
    /// one if it has both or neither), the other when it does not start.
    pub(crate) images: &'static super::engine::Images,
    pub(crate) port: u16,
    /// Lines the server prints when it is ready, and whether each goes to stderr (all
    /// must appear).
    pub(crate) ready: Vec<(&'static str, bool)>,
    pub(crate) env: Vec<(&'static str, String)>,
    pub(crate) cmd: Vec<String>,
    /// A path in the container mounted as a tmpfs (memory), for a store's data.
    pub(crate) tmpfs: Option<&'static str>,
}

/// A running container; removed on drop.
pub(crate) struct Running {
    #[cfg(feature = "containers")]
    container: Option<testcontainers::ContainerAsync<testcontainers::GenericImage>>,
    /// Removes the container when this handle drops or the test process exits.
    _cleanup: super::engine::Cleanup,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) description: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        // testcontainers removes a container in an async drop that asks for the current
        // tokio runtime and panics without one (a handle kept in a static, or dropped
        // after its test's runtime). There the handle is forgotten instead: the cleanup
        // watcher removes the container when `_cleanup` drops just after.
        #[cfg(feature = "containers")]
        if let Some(container) = self.container.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                drop(container);
            } else {
                std::mem::forget(container);
            }
        }
    }
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("container", &self.description)
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

/// Runs `spec` if the container source is usable; `None` (after saying why, once) when it
/// is not or the container did not start.
pub(crate) async fn try_start(spec: Spec) -> Option<Running> {
    if let Err(why) = engine().await {
        skipped_once(&why);
        return None;
    }
    // Containers of test processes that no longer run (interrupted runs), once.
    let _ = tokio::task::spawn_blocking(super::engine::remove_stale).await;
    let candidates: Vec<String> = match std::env::var(spec.images.var) {
        Ok(image) if !image.trim().is_empty() => vec![image.trim().to_owned()],
        _ => {
            // The image the engine has first (official, else the project's build); the
            // other one if that does not start.
            let first = super::engine::image_for(spec.images).await;
            let other = if first == spec.images.official {
                spec.images.local
            } else {
                spec.images.official
            };
            vec![first, other.to_owned()]
        }
    };
    for image in candidates {
        if let Some(running) = try_image(&spec, &image).await {
            return Some(running);
        }
    }
    None
}

/// Whether the container source is forced (`LEASE_TEST_SOURCE=containers`): then a
/// container that does not start fails the test instead of falling back to a local
/// process.
pub(crate) fn forced() -> bool {
    std::env::var("LEASE_TEST_SOURCE").is_ok_and(|v| v.trim() == "containers")
}

/// The error of a forced container source that could not start `what`.
pub(crate) fn forced_failure(what: &str) -> super::HarnessError {
    super::HarnessError::Start(format!(
        "LEASE_TEST_SOURCE=containers, and no {what} container started (see the lines above; \
         build the images with scripts/build-test-images.sh)"
    ))
}

/// Runs `spec` on `image` (`name:tag`), unless it failed before in this process.
async fn try_image(spec: &Spec, image: &str) -> Option<Running> {
    // Until an image has started once, its starts go one at a time: the tests of a
    // binary that all begin at once then wait for the first attempt instead of each
    // pulling the image.
    let _first = if listed(&PROVEN, image) {
        None
    } else {
        Some(FIRST_START.lock().await)
    };
    // An image that could not be started once (most often: it is not on the engine and
    // cannot be pulled, as on machines without a registry) is not tried again by this
    // process: every test would otherwise pay for the attempt and print its error.
    if listed(&FAILED, image) {
        return None;
    }
    START_ATTEMPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let started = tokio::time::timeout(START_BOUND, start(spec, image))
        .await
        .unwrap_or_else(|_| Err(format!("no container within {START_BOUND:?}")));
    match started {
        Ok(r) => {
            add(&PROVEN, image);
            Some(r)
        }
        Err(why) => {
            add(&FAILED, image);
            super::announce(format_args!(
                "lease test server: a {image} container did not start ({why}); not tried \
                 again by this test binary"
            ));
            None
        }
    }
}

/// Bound of one container start, the image pull included.
const START_BOUND: Duration = Duration::from_secs(240);

/// How many container starts this process attempted (for the harness's own tests).
static START_ATTEMPTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Images whose container did not start in this process.
static FAILED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Images whose container started in this process.
static PROVEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Held by the start of an image not proven yet.
static FIRST_START: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn listed(list: &std::sync::Mutex<Vec<String>>, image: &str) -> bool {
    list.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|i| i == image)
}

fn add(list: &std::sync::Mutex<Vec<String>>, image: &str) {
    let mut images = list.lock().unwrap_or_else(|p| p.into_inner());
    if !images.iter().any(|i| i == image) {
        images.push(image.to_owned());
    }
}

fn skipped_once(why: &str) {
    static SAID: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| {
        super::announce(format_args!(
            "lease test server: no containers ({why}); local processes are used"
        ));
    });
}

/// Whether a Docker engine answers (probed once per process).
async fn engine() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    if let Some(a) = ANSWER.get() {
        return a.clone();
    }
    let answer = probe().await;
    ANSWER.get_or_init(|| answer).clone()
}

async fn probe() -> Result<(), String> {
    if std::env::var("LEASE_TEST_CONTAINERS").is_ok_and(|v| v.trim() == "0") {
        return Err("LEASE_TEST_CONTAINERS=0".into());
    }
    let host = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.trim().is_empty());
    if host.is_none() && !default_sockets().iter().any(|p| p.exists()) {
        return Err(
            "no Docker engine: DOCKER_HOST is unset and no Docker socket exists (/var/run/docker.sock, \
             $XDG_RUNTIME_DIR/.docker/run/docker.sock, ~/.docker/run/docker.sock, \
             ~/.docker/desktop/docker.sock)"
                .into(),
        );
    }
    ping().await
}

/// Where testcontainers looks for the engine's socket without `DOCKER_HOST`.
fn default_sockets() -> Vec<std::path::PathBuf> {
    let mut v = vec![std::path::PathBuf::from("/var/run/docker.sock")];
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR") {
        v.push(std::path::Path::new(&run).join(".docker/run/docker.sock"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        let home = std::path::Path::new(&home);
        v.push(home.join(".docker/run/docker.sock"));
        v.push(home.join(".docker/desktop/docker.sock"));
    }
    v
}

#[cfg(feature = "containers")]
async fn ping() -> Result<(), String> {
    let asked = async {
        let docker = testcontainers::core::client::docker_client_instance()
            .await
            .map_err(|e| format!("no Docker client: {e}"))?;
        docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| format!("the Docker engine did not answer a ping: {e}"))
    };
    match tokio::time::timeout(Duration::from_secs(3), asked).await {
        Ok(r) => r,
        Err(_) => Err("the Docker engine did not answer a ping within 3 s".into()),
    }
}

#[cfg(not(feature = "containers"))]
async fn ping() -> Result<(), String> {
    Err("lease-test-servers was built without its `containers` feature".into())
}

#[cfg(feature = "containers")]
async fn start(spec: &Spec, image_ref: &str) -> Result<Running, String> {
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};

    let (name, tag) = image_ref.rsplit_once(':').unwrap_or((image_ref, "latest"));
    let mut image = GenericImage::new(name, tag).with_exposed_port(spec.port.tcp());
    for &(line, stderr) in &spec.ready {
        image = image.with_wait_for(if stderr {
            WaitFor::message_on_stderr(line)
        } else {
            WaitFor::message_on_stdout(line)
        });
    }
    let mut request = image
        .with_startup_timeout(Duration::from_secs(180))
        .with_label("lease-test", "1")
        .with_label("lease-test.pid", std::process::id().to_string());
    for (k, v) in &spec.env {
        request = request.with_env_var(*k, v.clone());
    }
    if !spec.cmd.is_empty() {
        request = request.with_cmd(spec.cmd.clone());
    }
    if let Some(path) = spec.tmpfs {
        request = request.with_mount(testcontainers::core::Mount::tmpfs_mount(path));
    }
    let container = request.start().await.map_err(|e| e.to_string())?;
    let port = container
        .get_host_port_ipv4(spec.port)
        .await
        .map_err(|e| format!("no host port for {}: {e}", spec.port))?;
    let host = container
        .get_host()
        .await
        .map_err(|e| format!("no host: {e}"))?
        .to_string();
    // Tests parse addresses as socket addresses (the network-cut relay): resolve a host
    // name (`localhost`, or `docker` for an engine reached over TCP) to an IPv4 address.
    let host = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.find(std::net::SocketAddr::is_ipv4))
            .map_or(host.clone(), |a| a.ip().to_string()),
    };
    let description = format!("{image_ref} {}", container.id());
    let cleanup = super::engine::Cleanup::container(container.id()).map_err(|e| e.to_string())?;
    Ok(Running {
        container: Some(container),
        _cleanup: cleanup,
        host,
        port,
        description,
    })
}

#[cfg(not(feature = "containers"))]
async fn start(_spec: &Spec, _image: &str) -> Result<Running, String> {
    Err("lease-test-servers was built without its `containers` feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image that cannot be started (here: one that exists nowhere) is tried once per
    /// process: a later request does not ask the engine to start it again. The count of
    /// start attempts shows it; the time the later request takes does not (it still asks
    /// the engine which image it has, which a loaded machine can make take 100 ms and
    /// more: CI failed a bound of 100 ms on it while clippy ran beside the tests).
    #[tokio::test]
    async fn a_failed_image_is_tried_once() {
        if engine().await.is_err() {
            eprintln!("no Docker engine: nothing to check");
            return;
        }
        static NONE: super::super::engine::Images = super::super::engine::Images {
            official: "lease-test.invalid/no-such-image:0",
            local: "lease-test.invalid/no-such-image:1",
            var: "LEASE_TEST_NO_SUCH_IMAGE",
        };
        let spec = || Spec {
            images: &NONE,
            port: 1,
            ready: Vec::new(),
            env: Vec::new(),
            cmd: Vec::new(),
            tmpfs: None,
        };
        let before = START_ATTEMPTS.load(std::sync::atomic::Ordering::Relaxed);
        // Eight at once, as the tests of a binary begin: one attempt.
        let all = futures::future::join_all((0..8).map(|_| try_start(spec()))).await;
        assert!(all.iter().all(Option::is_none));
        assert!(try_start(spec()).await.is_none());
        // One attempt per image (the official one and the project's own), none for the
        // request after the first eight.
        assert_eq!(
            START_ATTEMPTS.load(std::sync::atomic::Ordering::Relaxed),
            before + 2
        );
    }

    /// Without an engine (or with the source switched off) the source is skipped, fast.
    #[tokio::test]
    async fn skipped_without_an_engine() {
        let engine_here = std::env::var_os("DOCKER_HOST").is_some()
            || default_sockets().iter().any(|p| p.exists());
        if engine_here {
            eprintln!("a Docker engine may be present; nothing to check");
            return;
        }
        let started = std::time::Instant::now();
        let r = try_start(Spec {
            images: &super::super::engine::REDIS_IMAGES,
            port: 6379,
            ready: vec![("Ready to accept connections", false)],
            env: Vec::new(),
            cmd: Vec::new(),
            tmpfs: None,
        })
        .await;
        assert!(r.is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(engine().await.is_err());
    }
}
