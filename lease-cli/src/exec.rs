//! `lease exec` (Unix): the lease, the command's process group, the signals.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{
    Error, HolderLabel, LeaseBackend, LeaseClient, LeaseGuard, LeaseName, LeaseOptions, Semaphore,
};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use crate::supervise;
use crate::{EXIT_HELD, EXIT_LOST, EXIT_SPAWN, EXIT_STORE, ExecArgs, Fail, Store, round_ms};

/// Takes the lease `name`, or with `permits` one permit of the semaphore `name`: the guard
/// and the permit's slot. `Ok(None)`: held (all permits held) until the wait ran out.
async fn take(
    client: &LeaseClient,
    name: &LeaseName,
    permits: Option<u32>,
    opts: &LeaseOptions,
) -> Result<Option<(LeaseGuard, Option<u32>)>, Fail> {
    let taken = match permits {
        None => client.acquire(name, opts).await.map(|g| (g, None)),
        Some(n) => {
            let sem = Semaphore::new(client.clone(), name, n)?;
            sem.acquire(opts).await.map(|p| {
                let slot = p.slot();
                (p.into_guard(), Some(slot))
            })
        }
    };
    match taken {
        Ok(t) => Ok(Some(t)),
        Err(Error::StillHeld { holder, waited, .. }) => {
            let what = match permits {
                None => format!(
                    "{name} is held by {}",
                    holder.as_deref().unwrap_or("another holder")
                ),
                Some(n) => format!("all {n} permits of {name} are held"),
            };
            eprintln!(
                "lease: {what}{}; not running the command",
                if waited.is_zero() {
                    String::new()
                } else {
                    format!(" (waited {})", humantime::format_duration(round_ms(waited)))
                }
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// `lease exec`: takes the lease, runs the command under a supervisor in a process group
/// of its own (see `supervise.rs`), renews while it runs, releases when it exits.
pub async fn exec(store: &Store, args: ExecArgs) -> Result<u8, Fail> {
    let name = LeaseName::new(&args.name).map_err(Error::from)?;
    let opts = LeaseOptions::builder(args.ttl)
        .wait(args.wait)
        .keep_for(args.keep_for)
        .build()
        .map_err(Error::from)?;
    let grace = args.grace.unwrap_or_else(|| default_grace(&opts));
    if grace >= opts.safety_margin() {
        eprintln!(
            "lease: warning: --grace {} is not shorter than the safety margin ({}): if the \
             lease is lost, the command may still run when the store lets another host take it",
            humantime::format_duration(round_ms(grace)),
            humantime::format_duration(round_ms(opts.safety_margin())),
        );
    }
    let label = match &args.label {
        Some(l) => HolderLabel::new(l.clone()).map_err(Error::from)?,
        None => HolderLabel::default_for_process(),
    };
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Fail::usage("no command given after --"));
    };
    let backend: Arc<dyn LeaseBackend> = store.connect().await?;
    let client = LeaseClient::with_label(backend, label.clone());
    let Some((guard, permit)) = take(&client, &name, args.permits, &opts).await? else {
        return Ok(EXIT_HELD);
    };
    tracing::info!(lease = %name, permit, fencing = guard.fencing().get(), holder = %label, "acquired; starting the command");
    // Orphans below us are re-parented to us (Linux), so the whole tree stays in reach
    // (see supervise.rs).
    if let Err(e) = supervise::become_subreaper() {
        let _ = guard.release().await;
        return Err(Fail {
            code: EXIT_SPAWN,
            message: format!("cannot keep the command's processes in check: {e}"),
        });
    }
    // The supervisor (this binary) starts the command. It is spawned from the main
    // thread, which lives as long as this process (the parent-death signal follows the
    // thread that spawned).
    let exe = std::env::current_exe()
        .ok()
        .filter(|p| p.exists())
        .unwrap_or_else(|| "/proc/self/exe".into());
    let kinds = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::from_raw(Signal::SIGTSTP as i32),
        SignalKind::from_raw(Signal::SIGCONT as i32),
    ];
    let mut streams = Vec::new();
    for kind in kinds {
        match signal(kind) {
            Ok(s) => streams.push(s),
            Err(e) => {
                let _ = guard.release().await;
                return Err(Fail {
                    code: EXIT_SPAWN,
                    message: format!("cannot install signal handlers: {e}"),
                });
            }
        }
    }
    let [mut sigint, mut sigterm, mut sigtstp, mut sigcont] = match <[_; 4]>::try_from(streams) {
        Ok(s) => s,
        Err(_) => {
            let _ = guard.release().await;
            return Err(Fail {
                code: EXIT_SPAWN,
                message: "cannot install signal handlers".into(),
            });
        }
    };
    let hand_over = supervise::should_hand_over_terminal();
    let mut command = Command::new(exe);
    if let Some(slot) = permit {
        command
            .env("LEASE_PERMIT", slot.to_string())
            .env("LEASE_PERMIT_NAME", guard.name().to_string_lossy());
    }
    // The command group: the supervisor leads it, the command inherits it.
    command.process_group(0).arg(supervise::SUBCOMMAND);
    if hand_over {
        command.arg("--foreground");
    }
    let spawned = command
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--grace")
        .arg(humantime::format_duration(grace).to_string())
        .arg("--")
        .arg(program)
        .args(program_args)
        .env("LEASE_NAME", name.to_string_lossy())
        .env("LEASE_FENCING_TOKEN", guard.fencing().to_string())
        .env("LEASE_HOLDER", label.as_str())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            return Err(Fail {
                code: EXIT_SPAWN,
                message: format!("cannot run {program} in a process group of its own: {e}"),
            });
        }
    };
    let me = supervise::own_pid();
    // The command group's id is the supervisor's pid. That the supervisor leads it is
    // checked where it cannot race: `spawn` fails if the child's `setpgid` does, and the
    // supervisor refuses to start the command unless it leads its own group. (A check
    // here, with `getpgid`, raced the supervisor: a command as short as `true` may have
    // ended, and the supervisor moved itself back to our group, before it ran.)
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let Some(group) = group else {
        let _ = child.kill().await;
        supervise::terminate(me, None, Duration::ZERO).await;
        let _ = guard.release().await;
        return Err(Fail {
            code: EXIT_SPAWN,
            message: format!(
                "cannot find the process group of {program}'s supervisor, so it could not \
                 be stopped if the lease were lost; not running it"
            ),
        });
    };
    // Whatever happens from here, the terminal goes back to our group at the end.
    let terminal = hand_over.then_some(TerminalBack(group));
    let status = loop {
        tokio::select! {
            status = child.wait() => break Some(status),
            _ = sigint.recv() => supervise::signal_command(me, group, Signal::SIGINT),
            _ = sigterm.recv() => supervise::signal_command(me, group, Signal::SIGTERM),
            _ = sigtstp.recv() => supervise::stop_command_and_self(me, group),
            _ = sigcont.recv() => supervise::continue_command(me, group, hand_over),
            reason = guard.lost() => {
                eprintln!("lease: lost {name} while the command ran ({reason}); terminating it");
                supervise::signal_command(me, group, Signal::SIGTERM);
                // SIGCONT too: a stopped command would not see the SIGTERM.
                supervise::signal_command(me, group, Signal::SIGCONT);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    eprintln!("lease: the command did not exit within {}; killing it", humantime::format_duration(grace));
                    supervise::signal_command(me, group, Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                // The supervisor has been waited for: if the group still has members,
                // they keep its id from being reused; if it has none, the id (the
                // supervisor's pid) could only have been handed to a new group in the
                // moment since if the system's pids had wrapped around just then.
                supervise::terminate(me, Some(group), Duration::ZERO).await;
                break None;
            }
        }
    };
    if let Some(Ok(st)) = &status {
        // The supervisor terminates what the command leaves behind before it exits; if it
        // did not exit normally itself, that is left to do here.
        use std::os::unix::process::ExitStatusExt;
        let grace = if st.signal().is_some() {
            eprintln!(
                "lease: the command's supervisor was killed ({st}); terminating what is left"
            );
            grace
        } else {
            Duration::ZERO
        };
        supervise::terminate(me, Some(group), grace).await;
    }
    // The command group is gone: the terminal is ours again.
    drop(terminal);
    let Some(status) = status else {
        // Lost: nothing of ours is left to release (the store said so, or it is not
        // answering and frees the lease at its TTL). Exit at once.
        guard.disarm();
        return Ok(EXIT_LOST);
    };
    let released = guard.release().await;
    if let Err(e) = released {
        tracing::warn!(lease = %name, error = %e, "release failed; the lease lapses at its ttl");
    }
    let status = status.map_err(|e| Fail {
        code: EXIT_STORE,
        message: format!("waiting for the command: {e}"),
    })?;
    Ok(supervise::exit_code_of(status))
}

/// Gives the terminal back to our process group when dropped, if the command group
/// (the pid it holds) still has it.
struct TerminalBack(Pid);

impl Drop for TerminalBack {
    fn drop(&mut self) {
        supervise::take_terminal_back(self.0);
    }
}

/// The default `--grace`: half the safety margin.
///
/// A lost lease is reported at the safety deadline, a safety margin before the store can
/// free it (counted from the send time of the last successful renewal, which the store
/// received no earlier). SIGTERM goes out then and SIGKILL `grace` later; with the whole
/// margin as grace, SIGKILL would land at the very moment another host can be granted the
/// lease, so a timer firing late or a process taking a moment to die would overlap. Half
/// the margin leaves the other half as slack.
pub fn default_grace(opts: &LeaseOptions) -> Duration {
    opts.safety_margin() / 2
}
