//! End-to-end tests of the real `lease` binary against real Redis and PostgreSQL servers
//! started by the harness.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lease_conformance::server::RedisServer;
use tokio::process::{Child, Command};

const LEASE: &str = env!("CARGO_BIN_EXE_lease");

fn lease(url: &str) -> Command {
    let mut c = Command::new(LEASE);
    c.env("LEASE_BACKEND", url)
        .env_remove("LEASE_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

async fn output(mut c: Command) -> (i32, String, String) {
    let out = c.output().await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("lease-cli-{}", std::process::id()))
        .join(format!("{:?}", Instant::now()).replace(|c: char| !c.is_ascii_alphanumeric(), ""));
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn wait_for_file(path: &std::path::Path, within: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            start.elapsed() < within,
            "{} did not appear",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn redis() -> RedisServer {
    RedisServer::start().await.unwrap_or_else(|e| panic!("{e}"))
}

async fn child_sees_name_and_fencing_token_and_its_exit_code_is_passed_on(url: &str) {
    let mut c = lease(url);
    c.args([
        "exec",
        "job-a",
        "--",
        "sh",
        "-c",
        "echo \"$LEASE_NAME $LEASE_FENCING_TOKEN\"; exit 3",
    ]);
    let (code, out, _) = output(c).await;
    assert_eq!(code, 3);
    let first: u64 = out.trim().strip_prefix("job-a ").unwrap().parse().unwrap();
    let mut c = lease(url);
    c.args([
        "exec",
        "job-a",
        "--",
        "sh",
        "-c",
        "echo $LEASE_FENCING_TOKEN",
    ]);
    let (code, out, _) = output(c).await;
    assert_eq!(code, 0);
    let second: u64 = out.trim().parse().unwrap();
    assert!(second > first, "fencing token grows per acquisition");
}

async fn two_at_once_run_the_command_exactly_once(url: &str) {
    let dir = tempdir();
    let marker = dir.join("runs");
    let script = format!("echo ran >> {}; sleep 1", marker.display());
    let mut a = lease(url);
    a.args(["exec", "once", "--", "sh", "-c", &script]);
    let mut b = lease(url);
    b.args(["exec", "once", "--", "sh", "-c", &script]);
    let (ra, rb) = tokio::join!(output(a), output(b));
    let mut codes = [ra.0, rb.0];
    codes.sort();
    assert_eq!(codes, [0, 75], "one ran, one skipped: {ra:?} {rb:?}");
    let skipped = if ra.0 == 75 { &ra.2 } else { &rb.2 };
    assert!(skipped.contains("held by"), "{skipped}");
    assert_eq!(
        skipped.trim().lines().count(),
        1,
        "one-line message: {skipped}"
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n");
}

fn kill(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

async fn holder_killed_then_waiting_exec_runs_after_the_ttl(url: &str) {
    let dir = tempdir();
    let pidfile = dir.join("pid");
    let mut a = lease(url);
    a.args([
        "exec",
        "--ttl",
        "2s",
        "crashy",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pidfile.display()),
    ]);
    let mut a: Child = a.spawn().unwrap();
    let child_pid: u32 = wait_for_file(&pidfile, Duration::from_secs(10))
        .await
        .trim()
        .parse()
        .unwrap();
    // The holder process dies without releasing (and its command with it).
    kill(a.id().unwrap(), nix::sys::signal::Signal::SIGKILL);
    kill(child_pid, nix::sys::signal::Signal::SIGKILL);
    let _ = a.wait().await;
    let killed_at = Instant::now();
    let mut b = lease(url);
    b.args([
        "exec",
        "--ttl",
        "2s",
        "--wait",
        "20s",
        "crashy",
        "--",
        "sh",
        "-c",
        "echo $LEASE_FENCING_TOKEN",
    ]);
    let (code, out, err) = output(b).await;
    let took = killed_at.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(!out.trim().is_empty());
    // Free after the rest of the TTL: at most ttl (2 s) after the kill, plus tolerance for
    // Redis's expiry cycle and process start-up on a loaded machine.
    assert!(took <= Duration::from_millis(2000 + 1500), "took {took:?}");
    eprintln!("waiting exec ran {took:?} after the holder was killed (ttl 2 s)");
}

async fn force_release_terminates_the_command_with_the_lost_code(url: &str) {
    let dir = tempdir();
    let pidfile = dir.join("pid");
    let mut a = lease(url);
    a.args([
        "exec",
        "--ttl",
        "3s",
        "--grace",
        "2s",
        "victim",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pidfile.display()),
    ]);
    a.stderr(Stdio::piped());
    let a = a.spawn().unwrap();
    wait_for_file(&pidfile, Duration::from_secs(10)).await;
    let mut status = lease(url);
    status.args(["status", "victim", "--json"]);
    let (code, out, _) = output(status).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("\"held\":true") && out.contains("\"fencing_token\":"),
        "{out}"
    );
    let mut refuse = lease(url);
    refuse.args(["release", "victim"]);
    assert_eq!(
        output(refuse).await.0,
        64,
        "release without --force must refuse"
    );
    let mut force = lease(url);
    force.args(["release", "--force", "victim"]);
    let (code, out, _) = output(force).await;
    assert_eq!(code, 0);
    assert!(out.contains("released"));
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), a.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Noticed at the next renewal (every ttl/3 = 1 s).
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

async fn store_stopped_terminates_the_command_with_the_lost_code(
    url: &str,
    stop: impl AsyncFnOnce(),
) {
    let dir = tempdir();
    let pidfile = dir.join("pid");
    let mut a = lease(url);
    a.args([
        "exec",
        "--ttl",
        "2s",
        "--grace",
        "1s",
        "outage",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pidfile.display()),
    ]);
    a.stderr(Stdio::piped());
    let a = a.spawn().unwrap();
    wait_for_file(&pidfile, Duration::from_secs(10)).await;
    stop().await;
    let stopped = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), a.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Lost at the safety deadline: within the TTL of the stop.
    assert!(
        stopped.elapsed() < Duration::from_millis(2000 + 500),
        "{:?}",
        stopped.elapsed()
    );
}

#[tokio::test]
async fn bad_urls_and_stores_give_one_line_errors_and_documented_codes() {
    let cases = [
        ("redis://127.0.0.1:notaport", 64),
        ("gopher://127.0.0.1", 64),
        ("no-scheme", 64),
        ("redis://127.0.0.1:1", 69),
    ];
    for (url, expected) in cases {
        let mut c = lease(url);
        c.args(["exec", "x", "--", "true"]);
        let (code, _, err) = output(c).await;
        assert_eq!(code, expected, "{url}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{url}: one line expected: {err}"
        );
    }
    let mut c = lease("redis://user:s3cret@127.0.0.1:1");
    c.args(["status", "x"]);
    let (code, _, err) = output(c).await;
    assert_eq!(code, 69);
    assert!(!err.contains("s3cret"), "{err}");
    let mut c = lease("memory://");
    c.args(["exec", "--ttl", "soon", "x", "--", "true"]);
    assert_eq!(output(c).await.0, 64);
}

macro_rules! store_tests {
    ($store:ident, $start:expr, $start_owned:expr) => {
        mod $store {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test]
            async fn child_sees_name_and_fencing_token() {
                let s = $start.await;
                super::child_sees_name_and_fencing_token_and_its_exit_code_is_passed_on(&s.url())
                    .await;
            }

            #[tokio::test]
            async fn two_at_once_run_exactly_once() {
                let s = $start.await;
                super::two_at_once_run_the_command_exactly_once(&s.url()).await;
            }

            #[tokio::test]
            async fn holder_killed_then_waiter_runs_after_ttl() {
                let s = $start.await;
                super::holder_killed_then_waiting_exec_runs_after_the_ttl(&s.url()).await;
            }

            #[tokio::test]
            async fn force_release_gives_the_lost_code() {
                let s = $start.await;
                super::force_release_terminates_the_command_with_the_lost_code(&s.url()).await;
            }

            #[tokio::test]
            async fn store_stopped_gives_the_lost_code() {
                let s = $start_owned.await;
                if !s.owns_process() {
                    eprintln!("skipped: needs a server the harness owns");
                    return;
                }
                let url = s.url();
                let s = tokio::sync::Mutex::new(s);
                super::store_stopped_terminates_the_command_with_the_lost_code(&url, async || {
                    s.lock().await.stop().await.unwrap()
                })
                .await;
            }
        }
    };
}

store_tests!(redis_store, redis(), async {
    RedisServer::start_owned()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
});
store_tests!(
    postgres_store,
    async {
        lease_conformance::server::PostgresServer::shared()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    },
    async {
        lease_conformance::server::PostgresServer::start_fast()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
);
store_tests!(
    etcd_store,
    async {
        lease_conformance::server::EtcdServer::start()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    },
    async {
        lease_conformance::server::EtcdServer::start_local()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
);
