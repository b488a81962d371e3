//! The process tree of `lease exec`: the command never runs without `lease`.
//!
//! `lease exec` does not start the command itself. It starts a copy of its own binary
//! (`lease __supervise`), and that supervisor starts the command. `lease` and the
//! supervisor are both child subreapers (Linux `PR_SET_CHILD_SUBREAPER`): a process whose
//! parent exits is re-parented to the nearest of them rather than to init, so everything
//! the command starts (the grandchildren of `sh -c '...'`, processes that call `setsid` or
//! `setpgid` such as GNU `timeout`, daemons that fork twice) stays in the tree below
//! `lease`, and `lease` signals that tree as a whole. The command stays in `lease`'s
//! process group, so the terminal's signals (Ctrl-C, Ctrl-Z) and terminal reads work as
//! they would without `lease`.
//!
//! - The supervisor asks to be signalled when `lease` dies (`PR_SET_PDEATHSIG`): a
//!   `lease` killed with SIGKILL still takes the tree with it.
//! - SIGTERM to `lease` goes to every process of the tree. SIGINT too, except to the
//!   processes of `lease`'s own process group when that group is the terminal's
//!   foreground group (the terminal has sent them the same SIGINT already).
//! - If the lease is lost: SIGTERM to the tree, then SIGKILL after the grace period.
//! - When the command exits, what it left running is terminated (SIGTERM, then SIGKILL
//!   after the grace period) before `lease` releases the lease.
//!
//! The supervisor reports the command's exit code, or 128 + N if a signal N killed it.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getpgrp, getppid};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

/// The hidden subcommand `lease exec` runs its command through.
pub const SUBCOMMAND: &str = "__supervise";

/// Exit code of the supervisor when it could not start the command.
const CANNOT_START: u8 = 127;

/// Runs `command` under supervision; returns the exit code to exit with.
///
/// `parent` is the pid of the `lease` process that started the supervisor: if it is no
/// longer the parent (it died before the supervisor asked to be told), the command is
/// not started.
pub async fn run(parent: i32, grace: Duration, command: &[String]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("lease: no command given");
        return CANNOT_START;
    };
    // Handlers first: from here on none of these signals ends the supervisor (the
    // command gets the terminal's signals itself; `lease` signals it directly).
    let kinds = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ];
    let mut streams = Vec::new();
    for kind in kinds {
        match signal(kind) {
            Ok(s) => streams.push(s),
            Err(e) => {
                eprintln!("lease: cannot install signal handlers: {e}");
                return CANNOT_START;
            }
        }
    }
    if let Err(e) = become_subreaper().and_then(|()| notify_on_parent_death()) {
        eprintln!("lease: cannot keep the command's processes in check: {e}");
        return CANNOT_START;
    }
    if getppid().as_raw() != parent {
        // `lease` died before the request above: do not start the command.
        return CANNOT_START;
    }
    let mut child = match Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lease: cannot run {program}: {e}");
            return CANNOT_START;
        }
    };
    let me = own_pid();
    let status = loop {
        let any_signal = futures_any_signal(&mut streams);
        tokio::select! {
            status = child.wait() => break status,
            () = any_signal => {
                if getppid().as_raw() != parent {
                    // `lease` is gone: nothing may run on without it.
                    terminate_tree(me, Duration::ZERO).await;
                    return 128 + 9;
                }
            }
        }
    };
    let left = terminate_tree(me, grace).await;
    if left > 0 {
        eprintln!("lease: the command left {left} process(es) running; terminated them");
    }
    match status {
        Ok(status) => exit_code_of(status),
        Err(e) => {
            eprintln!("lease: waiting for the command: {e}");
            CANNOT_START
        }
    }
}

/// Completes when any of `streams` delivers a signal.
async fn futures_any_signal(streams: &mut [tokio::signal::unix::Signal]) {
    std::future::poll_fn(|cx| {
        for s in streams.iter_mut() {
            if s.poll_recv(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// This process's pid.
pub fn own_pid() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// Makes this process the one that orphans below it are re-parented to (Linux), so that
/// they stay in its tree.
#[cfg(target_os = "linux")]
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// Makes this process the one that orphans below it are re-parented to (Linux).
#[cfg(not(target_os = "linux"))]
pub fn become_subreaper() -> nix::Result<()> {
    Ok(())
}

#[cfg(target_os = "linux")]
fn notify_on_parent_death() -> nix::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
}

#[cfg(not(target_os = "linux"))]
fn notify_on_parent_death() -> nix::Result<()> {
    // No parent-death signal: a `lease` killed with SIGKILL leaves the command running.
    Ok(())
}

/// A live process below `root`, with its process group.
#[derive(Clone, Copy, Debug)]
pub struct Member {
    pid: Pid,
    pgrp: i32,
}

/// The live processes (not zombies) below `root`, found through their parents in /proc.
#[cfg(target_os = "linux")]
pub fn descendants(root: i32) -> Vec<Member> {
    use std::collections::HashMap;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // pid -> (ppid, pgrp, live)
    let mut children: HashMap<i32, Vec<(i32, i32, bool)>> = HashMap::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(ppid), Some(pgrp)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(ppid), Ok(pgrp)) = (ppid.parse::<i32>(), pgrp.parse::<i32>()) else {
            continue;
        };
        let live = state != "Z" && state != "X";
        children.entry(ppid).or_default().push((pid, pgrp, live));
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for &(pid, pgrp, live) in children.get(&parent).map_or(&[][..], |v| v) {
            if live {
                found.push(Member {
                    pid: Pid::from_raw(pid),
                    pgrp,
                });
            }
            queue.push(pid);
        }
    }
    found
}

/// The live processes below `root` (none where /proc is not available).
#[cfg(not(target_os = "linux"))]
pub fn descendants(root: i32) -> Vec<Member> {
    let _ = root;
    Vec::new()
}

/// Sends `sig` to every live process below `root`, except those in process group
/// `except_group`; returns how many it signalled.
pub fn signal_tree(root: i32, sig: Signal, except_group: Option<i32>) -> usize {
    let mut sent = 0;
    for m in descendants(root) {
        if Some(m.pgrp) != except_group && kill(m.pid, sig).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Terminates every process below `root`: SIGTERM and up to `grace` to exit (skipped when
/// `grace` is zero), then SIGKILL, repeated until none is left (one may fork while the
/// others are killed). Returns how many there were at first.
pub async fn terminate_tree(root: i32, grace: Duration) -> usize {
    let first = descendants(root).len();
    if first == 0 {
        return 0;
    }
    if !grace.is_zero() {
        signal_tree(root, Signal::SIGTERM, None);
        let until = tokio::time::Instant::now() + grace;
        while !descendants(root).is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Bounded: SIGKILL cannot be caught, so only processes forked in between remain,
    // and they are killed in the next round.
    for _ in 0..200 {
        if signal_tree(root, Signal::SIGKILL, None) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first
}

/// Whether this process's group is the foreground group of the terminal on stdin: then
/// the terminal's Ctrl-C has reached every process of the group already.
pub fn in_terminal_foreground() -> bool {
    nix::unistd::tcgetpgrp(std::io::stdin()).is_ok_and(|fg| fg == getpgrp())
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
