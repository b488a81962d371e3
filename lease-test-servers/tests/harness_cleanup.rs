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
