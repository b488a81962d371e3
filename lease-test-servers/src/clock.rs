//! [`SteppedClock`]: a wall clock for a server process that a test can step, as an NTP
//! step or an operator's `date -s` steps a real host's clock.
//!
//! A small `LD_PRELOAD` library (`step_clock.c`, compiled here with the system's C
//! compiler on first use) adds an offset, read from a file at most every 5 ms, to
//! `clock_gettime(CLOCK_REALTIME)`, `gettimeofday` and `time`. The monotonic clock does
//! not move, as on a real host. (libfaketime would do the same, but its Debian 12 build
//! aborts redis-server at start with "unexpected recursive calls to clock_gettime()".)
//! It works on dynamically linked programs (redis-server, postgres), not on statically
//! linked Go binaries (etcd).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use super::HarnessError;

const SOURCE: &str = include_str!("step_clock.c");

/// A steppable wall clock: an offset in whole seconds in a file that the server's clock
/// calls read. Starts at the true time.
#[derive(Debug)]
pub struct SteppedClock {
    library: PathBuf,
    file: PathBuf,
    offset_s: i64,
    _dir: tempfile::TempDir,
}

impl SteppedClock {
    /// A clock at offset zero. Compiles the library with `cc`; errors name the package to
    /// install when there is no C compiler.
    pub fn new() -> Result<SteppedClock, HarnessError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("lease-clock-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a temp dir for the clock", e))?;
        // Readable by a server that runs as another user (postgres).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| HarnessError::io("chmod of the clock dir", e))?;
        let source = dir.path().join("step_clock.c");
        std::fs::write(&source, SOURCE).map_err(|e| HarnessError::io("writing step_clock.c", e))?;
        let library = dir.path().join("libstep_clock.so");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .map_err(|e| {
                HarnessError::Unavailable(format!(
                    "no C compiler to build the stepped clock (install the Debian package \
                     gcc): {e}"
                ))
            })?;
        if !out.status.success() {
            return Err(HarnessError::Start(format!(
                "compiling the stepped clock failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let clock = SteppedClock {
            library,
            file: dir.path().join("offset"),
            offset_s: 0,
            _dir: dir,
        };
        clock.write()?;
        let _ = std::fs::set_permissions(&clock.file, std::fs::Permissions::from_mode(0o644));
        Ok(clock)
    }

    fn write(&self) -> Result<(), HarnessError> {
        // Written whole under another name, then renamed: a reader never sees half.
        let tmp = self.file.with_extension("new");
        std::fs::write(&tmp, format!("{}\n", self.offset_s))
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
            })
            .and_then(|()| std::fs::rename(&tmp, &self.file))
            .map_err(|e| HarnessError::io("writing the clock offset", e))
    }

    /// Steps the clock by `seconds` (forward when positive). Servers see it within 5 ms.
    pub fn step(&mut self, seconds: i64) -> Result<(), HarnessError> {
        self.offset_s += seconds;
        self.write()?;
        std::thread::sleep(std::time::Duration::from_millis(10));
        Ok(())
    }

    /// The current offset from the true time, in seconds.
    pub fn offset_s(&self) -> i64 {
        self.offset_s
    }

    /// The environment a server process needs to run on this clock.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("LD_PRELOAD".into(), self.library.clone().into_os_string()),
            (
                "LEASE_CLOCK_FILE".into(),
                self.file.clone().into_os_string(),
            ),
        ]
    }
}
