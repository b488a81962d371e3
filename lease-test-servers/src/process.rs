//! A server process the harness spawned and owns: signals, restart, reaping.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::HarnessError;

/// A child process with its command line kept for restarts and its output appended to a
/// log file. Dropping it kills (SIGKILL) and reaps the process.
#[derive(Debug)]
pub(crate) struct ChildProcess {
    binary: PathBuf,
    args: Vec<OsString>,
    log_path: PathBuf,
    /// Extra environment variables of the process.
    env: Vec<(OsString, OsString)>,
    child: Option<Child>,
}

impl ChildProcess {
    /// Spawns `binary args...` with stdout and stderr appended to `log_path`.
    pub(crate) fn spawn(
        binary: PathBuf,
        args: Vec<OsString>,
        log_path: PathBuf,
    ) -> Result<Self, HarnessError> {
        Self::spawn_with_env(binary, args, log_path, Vec::new())
    }

    /// [`ChildProcess::spawn`] with extra environment variables (kept for `respawn`).
    pub(crate) fn spawn_with_env(
        binary: PathBuf,
        args: Vec<OsString>,
        log_path: PathBuf,
        env: Vec<(OsString, OsString)>,
    ) -> Result<Self, HarnessError> {
        let mut p = ChildProcess {
            binary,
            args,
            log_path,
            env,
            child: None,
        };
        p.respawn()?;
        Ok(p)
    }

    /// Starts the same command again. The previous process must have been reaped.
    pub(crate) fn respawn(&mut self) -> Result<(), HarnessError> {
        if self.is_running() {
            return Err(HarnessError::Start(format!(
                "{} is still running (pid {:?}); stop or kill it first",
                self.binary.display(),
                self.pid()
            )));
        }
        let open_log = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)
                .map_err(|e| {
                    HarnessError::io(format!("opening log {}", self.log_path.display()), e)
                })
        };
        let stdout = open_log()?;
        let stderr = open_log()?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawning {}", self.binary.display()), e))?;
        self.child = Some(child);
        Ok(())
    }

    /// The process id while the process has not been reaped.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (a stopped process counts as alive). Reaps it if it
    /// exited.
    pub(crate) fn is_running(&mut self) -> bool {
        self.try_exit_status().is_none() && self.child.is_some()
    }

    /// The exit status if the process has exited (and reaps it), else `None`.
    pub(crate) fn try_exit_status(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status)
            }
            Ok(None) => None,
            Err(_) => None,
        }
    }

    /// Sends `signal` to the (unreaped, so not recycled) pid.
    pub(crate) fn signal(&self, signal: Signal) -> Result<(), HarnessError> {
        let pid = self.pid().ok_or_else(|| {
            HarnessError::Start(format!(
                "cannot send {signal}: {} is not running",
                self.binary.display()
            ))
        })?;
        let pid = i32::try_from(pid)
            .map_err(|_| HarnessError::Start(format!("pid {pid} out of range")))?;
        kill(Pid::from_raw(pid), signal).map_err(|errno| {
            HarnessError::io(format!("sending {signal} to pid {pid}"), errno.into())
        })
    }

    /// SIGSTOP, then waits (up to 5 s) until every thread of the process has stopped. A
    /// stop takes effect asynchronously: the thread the kernel picks to take the signal
    /// stops the others only once it runs, and until then they go on. A JVM's network
    /// thread answered a ZooKeeper `srvr` sent right after the signal (1 of 10 runs
    /// beside a busy loop) without this wait.
    pub(crate) fn stop(&self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGSTOP)?;
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let tasks = PathBuf::from(format!("/proc/{pid}/task"));
        if !tasks.exists() {
            // No /proc: nothing to wait on.
            return Ok(());
        }
        let started = Instant::now();
        loop {
            let running = std::fs::read_dir(&tasks)
                .map_err(|e| HarnessError::io(format!("reading {}", tasks.display()), e))?
                .filter_map(|t| t.ok())
                .filter(|t| {
                    // The state follows the last ')' of `tid (comm) S ...`.
                    std::fs::read_to_string(t.path().join("stat"))
                        .ok()
                        .and_then(|st| {
                            st.rsplit_once(')')
                                .and_then(|(_, rest)| rest.trim_start().chars().next())
                        })
                        .is_some_and(|state| !matches!(state, 'T' | 't' | 'Z' | 'X'))
                })
                .count();
            if running == 0 {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(5) {
                return Err(HarnessError::Start(format!(
                    "{running} thread(s) of pid {pid} not stopped 5 s after SIGSTOP"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGTERM (plus SIGCONT, in case it is paused), then waits up to `grace` for it to
    /// exit, then SIGKILL. Always reaps.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Result<(), HarnessError> {
        if !self.is_running() {
            return Ok(());
        }
        self.signal(Signal::SIGTERM)?;
        // A stopped process only acts on SIGTERM once continued.
        let _ = self.signal(Signal::SIGCONT);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.try_exit_status().is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.kill()
    }

    /// SIGKILL and reap.
    pub(crate) fn kill(&mut self) -> Result<(), HarnessError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // Fails only if it already exited; wait() reaps it either way.
        let _ = child.kill();
        child
            .wait()
            .map_err(|e| HarnessError::io(format!("reaping {}", self.binary.display()), e))?;
        Ok(())
    }

    /// The last `lines` lines of the log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        match std::fs::read(&self.log_path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(e) => format!("(no log at {}: {e})", self.log_path.display()),
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Kills every process whose command line mentions `$1` (other than the watcher itself)
/// and removes `$1`, once stdin reaches EOF.
const DIR_WATCHER_SCRIPT: &str = r#"
read -r _ignored
# Only ever a harness temp dir: an empty or broad pattern would match other processes.
case "$1" in */lease-?*) ;; *) exit 0 ;; esac
for pid in $(pgrep -f -- "$1"); do
  [ "$pid" != "$$" ] && kill -KILL "$pid" 2>/dev/null
done
rm -rf -- "$1"
"#;

/// Cleans up after a test process that dies without running its destructors (SIGKILL,
/// abort): a small `sh` holds a pipe from the test process; when the pipe closes (the
/// handle dropped, or the process died), it SIGKILLs every process started with the
/// temp directory in its arguments and removes the directory.
#[derive(Debug)]
pub(crate) struct DirWatcher {
    child: Child,
    pipe: Option<std::process::ChildStdin>,
}

impl DirWatcher {
    pub(crate) fn spawn(dir: &std::path::Path) -> Result<Self, HarnessError> {
        let (child, pipe) = spawn_watcher(
            DIR_WATCHER_SCRIPT,
            "lease-dir-watcher",
            &[dir.as_os_str()],
            "the cleanup watcher",
        )?;
        Ok(DirWatcher { child, pipe })
    }
}

/// Spawns a watcher: `/bin/sh -c SCRIPT NAME ARGS...` (NAME is `$0`, ARGS are `$1`...)
/// with a pipe on its standard input that the test process holds. The script's first
/// `read` returns when the pipe closes: when the handle drops, or when the test process
/// dies in any way. It runs in its own process group, so a Ctrl-C to the test run does
/// not kill it before it has cleaned up. `what` names it in errors.
pub(crate) fn spawn_watcher(
    script: &str,
    name: &str,
    args: &[&std::ffi::OsStr],
    what: &str,
) -> Result<(Child, Option<std::process::ChildStdin>), HarnessError> {
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(script)
        .arg(name)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .map_err(|e| HarnessError::io(format!("spawning {what} (/bin/sh)"), e))?;
    let pipe = child.stdin.take();
    Ok((child, pipe))
}

impl Drop for DirWatcher {
    fn drop(&mut self) {
        self.pipe.take();
        let _ = self.child.wait();
    }
}
