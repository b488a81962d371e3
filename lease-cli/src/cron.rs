//! `lease cron`: run a command on a cron schedule on every host, each firing on one host
//! only (see `ScheduledJob::on`).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use leasehold::CancellationToken;
use leasehold::{
    Error, HolderLabel, LeaseBackend, LeaseClient, LeaseOptions, MissedFirings, Schedule,
    ScheduledJob,
};
use tokio::process::Command;

use crate::{CronArgs, EXIT_SPAWN, Fail, Store};

/// Runs until SIGINT or SIGTERM; exits 0 then. Each firing runs the command with
/// LEASE_NAME, LEASE_FENCING_TOKEN and LEASE_FIRING (the firing's instant, Unix seconds)
/// in its environment; a run whose lease is lost is killed.
pub async fn cron(store: &Store, args: CronArgs) -> Result<u8, Fail> {
    let schedule = Schedule::cron_in(&args.schedule, &args.tz).map_err(Error::from)?;
    let opts = LeaseOptions::new(args.ttl).map_err(Error::from)?;
    let label = match &args.label {
        Some(l) => HolderLabel::new(l.clone()).map_err(Error::from)?,
        None => HolderLabel::default_for_process(),
    };
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Fail::usage("no command given after --"));
    };
    let backend: Arc<dyn LeaseBackend> = store.connect().await?;
    let client = LeaseClient::with_label(backend, label);
    let job = ScheduledJob::on(client, &args.name, schedule, opts)?
        .with_max_skew(args.max_skew)?
        .with_start_window(args.start_window)?
        .with_shutdown_grace(args.shutdown_grace)
        .with_missed_firings(if args.missed == "run-once" {
            MissedFirings::RunOnce
        } else {
            MissedFirings::Skip
        });
    let shutdown = shutdown_on_signals().map_err(|e| Fail {
        code: EXIT_SPAWN,
        message: format!("cannot install signal handlers: {e}"),
    })?;
    tracing::info!(lease = %args.name, schedule = %args.schedule, tz = %args.tz, "running on the schedule");
    let stats = job
        .run(shutdown, |ctx| {
            let mut command = Command::new(program);
            command
                .args(program_args)
                .env("LEASE_NAME", ctx.name.to_string_lossy())
                .env("LEASE_FENCING_TOKEN", ctx.fencing.get().to_string())
                .env(
                    "LEASE_FIRING",
                    ctx.firing
                        .and_then(|f| f.duration_since(UNIX_EPOCH).ok())
                        .unwrap_or(Duration::ZERO)
                        .as_secs()
                        .to_string(),
                )
                // A run whose lease is lost (or that shutdown drops) is killed, with every
                // process it started: the command leads a process group of its own.
                .kill_on_drop(true);
            #[cfg(unix)]
            command.process_group(0);
            async move {
                let mut child = match command.spawn() {
                    Ok(child) => child,
                    Err(e) => {
                        tracing::error!(error = %e, "the command could not be started");
                        return;
                    }
                };
                let mut group = GroupKill(child.id());
                match child.wait().await {
                    Ok(status) if status.success() => {}
                    Ok(status) => tracing::warn!(%status, "the command failed"),
                    Err(e) => tracing::error!(error = %e, "the command could not be waited for"),
                }
                // The command ended: its group id may be reused, so it is not signalled.
                group.0 = None;
            }
        })
        .await;
    tracing::info!(?stats, "stopped");
    Ok(0)
}

/// A token cancelled at the first SIGINT or SIGTERM (Ctrl-C elsewhere).
fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let cancel = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            tracing::info!(
                "signal: stopping after the run in progress (within the shutdown grace)"
            );
            cancel.cancel();
        });
    }
    #[cfg(not(unix))]
    {
        let cancel = token.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            cancel.cancel();
        });
    }
    Ok(token)
}

/// Kills the process group of a run's command when the run is dropped before the command
/// ended (the lease was lost, or shutdown dropped the run): processes the command started
/// die with it. Disarmed (`None`) once the command has ended.
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            use nix::sys::signal::{Signal, killpg};
            use nix::unistd::Pid;
            if let Err(e) = killpg(Pid::from_raw(pid), Signal::SIGKILL) {
                tracing::debug!(error = %e, "the command's process group was already gone");
            }
        }
    }
}
