//! The command's supervisor: `lease exec` never leaves its command running without it.
//!
//! `lease exec` does not start the command itself. It starts a copy of its own binary
//! (`lease __supervise`) as the leader of a new process group, and that supervisor starts
//! the command inside the group, so the command and everything it starts (the
//! grandchildren of `sh -c '...'`) share one group that `lease` signals as a whole.
//!
//! - The supervisor asks the kernel for a signal when `lease` dies (Linux
//!   `PR_SET_PDEATHSIG`), so a `lease` killed with SIGKILL still takes the whole group
//!   with it: on that signal the supervisor sends SIGKILL to the group.
//! - Signals `lease` forwards (SIGINT, SIGTERM, and SIGTERM/SIGKILL when the lease is
//!   lost) go to the whole group. The supervisor, a member too, ignores them unless its
//!   parent is gone; the command and its children get them.
//! - When the command exits, whatever it left running in the group is terminated (SIGTERM,
//!   then SIGKILL after the grace period) before `lease` releases the lease.
//!
//! The supervisor reports the command's exit code, or 128 + N if a signal N killed it.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, getppid};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

/// The hidden subcommand `lease exec` runs its command through.
pub const SUBCOMMAND: &str = "__supervise";

/// Runs `command` under supervision; returns the exit code to exit with.
///
/// `parent` is the pid of the `lease` process that started the supervisor: if it is no
/// longer the parent (it died before the supervisor asked to be told), the command is
/// not started.
pub async fn run(parent: i32, grace: Duration, command: &[String]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("lease: no command given");
        return 64;
    };
    // Handlers first: from here on SIGINT/SIGTERM/SIGHUP no longer kill the supervisor.
    let (Ok(mut sigint), Ok(mut sigterm), Ok(mut sighup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("lease: cannot install signal handlers");
        return 69;
    };
    if let Err(e) = notify_on_parent_death() {
        eprintln!("lease: cannot ask to be told when lease dies: {e}");
        return 69;
    }
    if getppid().as_raw() != parent {
        // `lease` died before the request above: do not start the command.
        return 69;
    }
    let mut child = match Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lease: cannot run {program}: {e}");
            return 127;
        }
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = sigint.recv() => on_signal(parent),
            _ = sigterm.recv() => on_signal(parent),
            _ = sighup.recv() => on_signal(parent),
        }
    };
    terminate_leftovers(grace).await;
    match status {
        Ok(status) => exit_code_of(status),
        Err(e) => {
            eprintln!("lease: waiting for the command: {e}");
            69
        }
    }
}

/// A signal reached the supervisor: sent by `lease` to the whole group (the command got
/// it too; nothing to do), or the parent-death signal. If `lease` is gone, kill the group,
/// the supervisor included.
fn on_signal(parent: i32) {
    if getppid().as_raw() != parent {
        let _ = killpg(getpgrp(), Signal::SIGKILL);
    }
}

#[cfg(target_os = "linux")]
fn notify_on_parent_death() -> nix::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
}

#[cfg(not(target_os = "linux"))]
fn notify_on_parent_death() -> nix::Result<()> {
    // No parent-death signal: a `lease` killed with SIGKILL leaves the group running.
    Ok(())
}

/// Terminates every other process still in the supervisor's group: SIGTERM, then SIGKILL
/// to those still there after `grace`.
async fn terminate_leftovers(grace: Duration) {
    let leftovers = group_members();
    if leftovers.is_empty() {
        return;
    }
    eprintln!(
        "lease: the command left {} process(es) running; terminating them",
        leftovers.len()
    );
    for pid in &leftovers {
        let _ = nix::sys::signal::kill(*pid, Signal::SIGTERM);
    }
    let until = tokio::time::Instant::now() + grace;
    loop {
        let left = group_members();
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= until {
            for pid in left {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The live processes (not zombies) in this process's group, itself excluded.
#[cfg(target_os = "linux")]
fn group_members() -> Vec<Pid> {
    let me = std::process::id();
    let group = getpgrp().as_raw();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        if pid == me {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?;
        let _ppid = fields.next()?;
        let pgrp: i32 = fields.next()?.parse().ok()?;
        let live = state != "Z" && state != "X";
        (pgrp == group && live).then_some(Pid::from_raw(i32::try_from(pid).ok()?))
    })
    .collect()
}

#[cfg(not(target_os = "linux"))]
fn group_members() -> Vec<Pid> {
    Vec::new()
}

/// The exit code `lease` reports for a command's status: its own code, or 128 + N when a
/// signal N killed it.
pub fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    match status.signal() {
        Some(sig) => u8::try_from((128 + sig) & 0xff).unwrap_or(1),
        None => 1,
    }
}
