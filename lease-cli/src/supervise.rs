//! The process tree of `lease exec`: the command never runs without `lease`.
//!
//! `lease exec` does not start the command itself. It starts a copy of its own binary
//! (`lease __supervise`) in a new process group, and that supervisor starts the command,
//! which inherits the group: the command and everything it starts run in a process group
//! of their own (the *command group*), whose id is the supervisor's pid. Every signal
//! `lease` sends goes to that group with one `kill(-group)`, on every Unix system. If
//! the group cannot be made, `lease exec` refuses to run the command.
//!
//! A process that leaves the group (`setsid`, `setpgid`, as GNU `timeout` and daemons
//! do) escapes a signal sent to the group. On Linux, `lease` and the supervisor are also
//! child subreapers (`PR_SET_CHILD_SUBREAPER`): a process whose parent exits is
//! re-parented to the nearest of them rather than to init, so everything the command
//! starts stays in the process tree below `lease`, which `lease` finds through /proc and
//! signals as well. On other Unix systems, processes that leave the group are out of
//! reach.
//!
//! - If the lease is lost: SIGTERM to the group (and the tree), then SIGKILL after the
//!   grace period.
//! - SIGINT, SIGTERM, SIGTSTP and SIGCONT to `lease` are forwarded to the group (and the
//!   tree); on SIGTSTP `lease` then stops itself, as it would without handling it.
//! - When the command exits, what it left running is terminated (SIGTERM, then SIGKILL
//!   after the grace period) before `lease` releases the lease.
//! - If `lease` dies, even by SIGKILL, the supervisor kills the group (and its tree): on
//!   Linux at once through a parent-death signal (`PR_SET_PDEATHSIG`), elsewhere within
//!   [`PARENT_CHECK`] as it polls for its parent.
//!
//! The terminal: when `lease` runs in the foreground of the terminal on its stdin, and
//! its stdout is not a pipe, the supervisor makes the command group the terminal's
//! foreground group before it starts the command (as a shell does for a job), so the
//! command reads from the terminal and gets Ctrl-C from it as it would without `lease`;
//! `lease` gives the terminal back to its own group when the command is done. A Ctrl-Z
//! stops the command group; the supervisor then stops `lease` (SIGSTOP), so the shell
//! sees its job stopped and takes the terminal back; on `fg` `lease` gets SIGCONT, gives
//! the terminal to the command group again and continues it. When stdout is a pipe (`lease
//! exec ... | less`), the terminal stays with `lease`'s group, where the pipe's reader may
//! need it; Ctrl-C and Ctrl-Z then reach `lease`, which forwards them.
//!
//! The supervisor reports the command's exit code, or 128 + N if a signal N killed it.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpgrp, getppid, setpgid, tcgetpgrp, tcsetpgrp};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

/// The hidden subcommand `lease exec` runs its command through.
pub const SUBCOMMAND: &str = "__supervise";

/// Exit code of the supervisor when it could not start the command.
const CANNOT_START: u8 = 127;

/// How often the supervisor checks that `lease` is still its parent.
pub const PARENT_CHECK: Duration = Duration::from_millis(100);

/// Environment variable: set to `1`, `lease exec` on Linux uses only what every Unix
/// system offers, as on other systems (no /proc scan, no subreaper, no parent-death
/// signal). For the tests of that path.
#[cfg(target_os = "linux")]
pub const PORTABLE_VAR: &str = "LEASE_EXEC_PORTABLE";

/// Whether the Linux-only means (the /proc scan, subreapers, the parent-death signal)
/// are used: unless [`PORTABLE_VAR`] is `1`.
#[cfg(target_os = "linux")]
pub fn linux_means() -> bool {
    std::env::var_os(PORTABLE_VAR).is_none_or(|v| v != "1")
}

/// Runs `command` under supervision; returns the exit code to exit with.
///
/// `parent` is the pid of the `lease` process that started the supervisor: if it is no
/// longer the parent (it died before the supervisor asked to be told), the command is
/// not started. The supervisor must lead a process group of its own (`lease` starts it
/// so); with `foreground`, it makes that group the terminal's foreground group first.
pub async fn run(parent: i32, grace: Duration, foreground: bool, command: &[String]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("lease: no command given");
        return CANNOT_START;
    };
    // Handlers first: from here on none of these signals ends the supervisor (they are
    // meant for the command, which is in the same group).
    let kinds = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ];
    let mut streams = Vec::new();
    let mut stops = None;
    for kind in kinds {
        match signal(kind) {
            Ok(s) => streams.push(s),
            Err(e) => {
                eprintln!("lease: cannot install signal handlers: {e}");
                return CANNOT_START;
            }
        }
    }
    match signal(SignalKind::from_raw(Signal::SIGTSTP as i32)) {
        Ok(s) => stops = Some(s),
        Err(e) => eprintln!("lease: Ctrl-Z will not stop lease itself: {e}"),
    }
    if let Err(e) = become_subreaper().and_then(|()| notify_on_parent_death()) {
        eprintln!("lease: cannot keep the command's processes in check: {e}");
        return CANNOT_START;
    }
    if getppid().as_raw() != parent {
        // `lease` died before the request above: do not start the command.
        return CANNOT_START;
    }
    let me = own_pid();
    let group = Pid::from_raw(me);
    if getpgrp() != group {
        eprintln!(
            "lease: the command's supervisor is not in a process group of its own; \
             not running the command"
        );
        return CANNOT_START;
    }
    if foreground {
        give_terminal_to(group).unwrap_or_else(|e| {
            eprintln!("lease: cannot give the terminal to the command: {e}");
        });
    }
    let mut child = match Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lease: cannot run {program}: {e}");
            return CANNOT_START;
        }
    };
    let mut check = tokio::time::interval(PARENT_CHECK);
    let status = loop {
        let any_signal = futures_any_signal(&mut streams);
        let stop = async {
            match stops.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => break status,
            () = any_signal => {}
            _ = stop => {
                // A Ctrl-Z at the terminal whose foreground group this is: the command
                // has stopped; stop `lease` too, so that the shell sees its job stopped
                // and takes the terminal back. (A SIGTSTP that `lease` forwarded is not
                // relayed: `lease` stops itself then.)
                if terminal_foreground() == Some(group) {
                    let _ = kill(Pid::from_raw(parent), Signal::SIGSTOP);
                }
            }
            _ = check.tick() => {}
        }
        if getppid().as_raw() != parent {
            // `lease` is gone: nothing may run on without it. This ends the supervisor
            // too (it is in the group).
            kill_all(me, group);
            return 128 + 9;
        }
    };
    let parent_group = getpgid(Some(Pid::from_raw(parent)));
    let left = match parent_group.and_then(|g| setpgid(Pid::from_raw(0), g)) {
        // Out of the command group, the supervisor can kill what is left in it.
        Ok(()) => terminate(me, Some(group), grace).await,
        // Left to `lease` (see `exec`): it checks the group once the supervisor is gone.
        Err(_) => terminate(me, None, grace).await,
    };
    match left {
        Left::None => {}
        Left::Counted(n) => {
            eprintln!("lease: the command left {n} process(es) running; terminated them");
        }
        Left::Some => {
            eprintln!("lease: the command left processes running in its group; terminated them");
        }
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
    if !linux_means() {
        return Ok(());
    }
    nix::sys::prctl::set_child_subreaper(true)
}

/// Makes this process the one that orphans below it are re-parented to: Linux only;
/// elsewhere nothing (orphans go to init; those that stay in the command group are still
/// reached through the group).
#[cfg(not(target_os = "linux"))]
pub fn become_subreaper() -> nix::Result<()> {
    Ok(())
}

#[cfg(target_os = "linux")]
fn notify_on_parent_death() -> nix::Result<()> {
    if !linux_means() {
        return Ok(());
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
}

#[cfg(not(target_os = "linux"))]
fn notify_on_parent_death() -> nix::Result<()> {
    // No parent-death signal: the supervisor polls for its parent (PARENT_CHECK).
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
    if !linux_means() {
        return Vec::new();
    }
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

/// The live processes below `root`: none where there is no /proc to find them in (the
/// command group is reached through the group instead).
#[cfg(not(target_os = "linux"))]
pub fn descendants(root: i32) -> Vec<Member> {
    let _ = root;
    Vec::new()
}

/// Sends `sig` to every live process below `root` that is not in process group
/// `except_group` (found through /proc on Linux; none elsewhere); returns how many it
/// signalled.
fn signal_tree(root: i32, sig: Signal, except_group: Option<Pid>) -> usize {
    let mut sent = 0;
    for m in descendants(root) {
        if Some(m.pgrp) != except_group.map(Pid::as_raw) && kill(m.pid, sig).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Whether process group `group` has members (zombies count until reaped).
fn group_exists(group: Pid) -> bool {
    // EPERM: members exist but may not be signalled (not ours; cannot happen for the
    // command group, whose id is the supervisor's pid while it lives).
    matches!(killpg(group, None), Ok(()) | Err(Errno::EPERM))
}

/// Sends `sig` to the command group `group` and to every process below `root` outside
/// it (those that left the group; found on Linux only).
pub fn signal_command(root: i32, group: Pid, sig: Signal) {
    let _ = killpg(group, sig);
    signal_tree(root, sig, Some(group));
}

/// SIGKILL to every process below `root` outside `group`, then to `group`: used when
/// there is no time to lose (the caller may be in `group` and die with it).
fn kill_all(root: i32, group: Pid) {
    signal_tree(root, Signal::SIGKILL, Some(group));
    let _ = killpg(group, Signal::SIGKILL);
}

/// Reaps the zombies of orphans re-parented to this process (a subreaper) once the
/// command itself has been waited for, so that they do not keep the group in existence.
/// Only for a process that has no other children to wait for.
fn reap_orphans() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// What [`terminate`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// Nothing was left.
    None,
    /// This many processes were left (counted through /proc).
    Counted(usize),
    /// Processes were left in the group; how many is not known.
    Some,
}

/// Terminates what is left below `root` and in the process group `group` (if given; the
/// caller must not be in it): SIGTERM and up to `grace` to exit (skipped when `grace` is
/// zero), then SIGKILL, repeated until none is left (one may fork while the others are
/// killed). Reaps orphans re-parented to this process, so call it only when the command
/// (or the supervisor) has been waited for.
pub async fn terminate(root: i32, group: Option<Pid>, grace: Duration) -> Left {
    reap_orphans();
    let anything = |group: Option<Pid>| {
        reap_orphans();
        group.is_some_and(group_exists) || !descendants(root).is_empty()
    };
    let counted = descendants(root).len();
    if !anything(group) {
        return Left::None;
    }
    let signal_all = |sig: Signal| {
        let mut sent = signal_tree(root, sig, group);
        if group.is_some_and(|g| killpg(g, sig).is_ok()) {
            sent += 1;
        }
        sent
    };
    if !grace.is_zero() {
        signal_all(Signal::SIGTERM);
        let until = tokio::time::Instant::now() + grace;
        while anything(group) && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Bounded: SIGKILL cannot be caught, so only processes forked in between remain,
    // and they are killed in the next round.
    for _ in 0..200 {
        if signal_all(Signal::SIGKILL) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        reap_orphans();
    }
    if counted > 0 {
        Left::Counted(counted)
    } else {
        Left::Some
    }
}

/// The foreground process group of the terminal on stdin, if stdin is a terminal.
fn terminal_foreground() -> Option<Pid> {
    tcgetpgrp(std::io::stdin()).ok()
}

/// Whether `lease exec` should give the terminal to the command group: `lease` is in the
/// foreground of the terminal on its stdin, and its stdout is not a pipe (whose reader,
/// such as `less`, is in `lease`'s group and may need the terminal itself).
pub fn should_hand_over_terminal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    if terminal_foreground() != Some(getpgrp()) {
        return false;
    }
    let stdout_is_pipe = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.file_type().is_fifo());
    !stdout_is_pipe
}

/// Makes `group` the foreground process group of the terminal on stdin. The caller need
/// not be in the foreground group: SIGTTOU, which would stop it, is blocked meanwhile
/// (in this thread).
pub fn give_terminal_to(group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    ttou.thread_block()?;
    let done = tcsetpgrp(std::io::stdin(), group);
    let _ = ttou.thread_unblock();
    done
}

/// Gives the terminal back to this process's group if `group` has it.
pub fn take_terminal_back(group: Pid) {
    if terminal_foreground() == Some(group) {
        let _ = give_terminal_to(getpgrp());
    }
}

/// After a SIGCONT to `lease` (the shell's `fg` or `bg`): if `lease` is in the terminal's
/// foreground and the command group had the terminal (`handed_over`), give it back to the
/// command group; then continue the command group.
pub fn continue_command(root: i32, group: Pid, handed_over: bool) {
    if handed_over && terminal_foreground() == Some(getpgrp()) {
        let _ = give_terminal_to(group);
    }
    signal_command(root, group, Signal::SIGCONT);
}

/// After a SIGTSTP to `lease`: stops the command group and, unless the command group has
/// the terminal (then its supervisor stops `lease`, see `run`), `lease` itself.
pub fn stop_command_and_self(root: i32, group: Pid) {
    signal_command(root, group, Signal::SIGTSTP);
    if terminal_foreground() != Some(group) {
        let _ = nix::sys::signal::raise(Signal::SIGSTOP);
    }
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
