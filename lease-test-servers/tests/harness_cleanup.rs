//! Servers started by the harness do not outlive a test process that is SIGKILLed (no
//! destructors run): their watcher kills them and removes their directories.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lease_test_servers::{EtcdServer, RedisServer};

const CHILD: &str = "LEASE_HARNESS_CLEANUP_CHILD";

/// Runs in a child test process only: starts servers, prints their pids, then waits to be
/// killed.
#[tokio::test]
async fn child_starts_servers_and_waits() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let redis = RedisServer::start_persistent().await.unwrap();
    let etcd = EtcdServer::start_local().await.unwrap();
    println!("PIDS {} {}", redis.pid().unwrap(), etcd.pid().unwrap());
    tokio::time::sleep(Duration::from_secs(60)).await;
}

fn alive(pid: u32) -> bool {
    // A zombie (not yet reaped by init) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) != Some("Z"))
        .unwrap_or(false)
}

#[test]
fn servers_die_with_a_killed_test_process() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_starts_servers_and_waits", "--nocapture"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut pids = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("PIDS ") {
            pids = rest.split(' ').map(|p| p.parse::<u32>().unwrap()).collect();
            break;
        }
    }
    assert_eq!(pids.len(), 2, "the child did not start its servers");
    assert!(pids.iter().all(|p| alive(*p)));
    child.kill().unwrap(); // SIGKILL: no destructor runs in the child
    child.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < until,
            "servers {pids:?} outlived the killed test process"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Container ids carrying the label `lease-test.pid=<pid>`.
fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=lease-test.pid={pid}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

const CONTAINER_CHILD: &str = "LEASE_HARNESS_CONTAINER_CHILD";

/// Runs in a child test process only: starts a container of each kind of handle (one
/// through testcontainers, one controllable), says so, then waits to be killed.
#[tokio::test]
async fn child_starts_containers_and_waits() {
    if std::env::var_os(CONTAINER_CHILD).is_none() {
        return;
    }
    let redis = RedisServer::start().await.unwrap();
    assert_eq!(redis.source(), lease_test_servers::Source::Container);
    let net = lease_test_servers::docker::DockerNetwork::create()
        .await
        .unwrap();
    let _store = lease_test_servers::docker::DockerStore::start(
        lease_test_servers::docker::StoreKind::Redis,
        &net,
    )
    .await
    .unwrap();
    println!("READY");
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// Containers do not outlive a test process that is SIGKILLed: their cleanup watchers
/// remove them (testcontainers alone leaves them running).
#[test]
fn containers_die_with_a_killed_test_process() {
    if let Err(why) = lease_test_servers::docker::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_starts_containers_and_waits",
            "--nocapture",
        ])
        .env(CONTAINER_CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l == "READY");
    assert!(ready, "the child did not start its containers");
    let pid = child.id();
    assert_eq!(containers_of(pid).len(), 2, "{:?}", containers_of(pid));
    child.kill().unwrap(); // SIGKILL: no destructor runs in the child
    child.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !containers_of(pid).is_empty() {
        assert!(
            Instant::now() < until,
            "containers {:?} outlived the killed test process",
            containers_of(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A container handle kept past its runtime (in a static, or dropped after the test's
/// runtime) drops without a panic, and its container is removed.
#[test]
fn a_container_handle_dropped_outside_a_runtime() {
    if let Err(why) = lease_test_servers::docker::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(RedisServer::start()).unwrap();
    assert_eq!(server.source(), lease_test_servers::Source::Container);
    let port = server
        .url()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let mine = || {
        let out = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--filter",
                &format!("label=lease-test.pid={}", std::process::id()),
                "--filter",
                &format!("publish={port}"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert!(!mine().is_empty());
    drop(rt);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(server)));
    assert!(
        dropped.is_ok(),
        "dropping the handle outside a runtime panicked"
    );
    let until = Instant::now() + Duration::from_secs(20);
    while !mine().is_empty() {
        assert!(Instant::now() < until, "the container was not removed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Containers and networks left by a test process that no longer runs are removed by
/// the next one (here: made by hand with the labels of a process that has exited).
#[test]
fn stale_containers_are_removed() {
    if let Err(why) = lease_test_servers::docker::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let labels = ["--label", "lease-test=1", "--label"];
    let pid_label = format!("lease-test.pid={dead}");
    let image = std::env::var("LEASE_TEST_REDIS_IMAGE").unwrap_or("lease-test/redis:7".into());
    let made = Command::new("docker")
        .arg("create")
        .args(labels)
        .arg(&pid_label)
        .arg(&image)
        .output()
        .unwrap();
    if !made.status.success() {
        eprintln!(
            "skipped: no {image} image here: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        return;
    }
    assert_eq!(containers_of(dead).len(), 1);
    assert!(lease_test_servers::docker::remove_stale_now() >= 1);
    assert!(containers_of(dead).is_empty());
}
