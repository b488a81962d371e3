//! Where the client's and the server's threads run, for the one-task rounds on one CPU.
//!
//! With one task a cycle is a chain of round trips, each of which puts the client to sleep
//! until the server answers and the server to sleep until the next request. On a virtual
//! machine, waking a thread on an idle virtual CPU takes tens of microseconds, far more
//! than a cycle's work: a Redis cycle took 26 to 33 µs with the client and the server on
//! one CPU and 145 to 166 µs with them on two (`lease-bench count-cycles redis URL CASE
//! 10000 1` under `taskset`, 2026-12-07). Left to the scheduler, the share of a slice's
//! round trips that happen to run on one CPU then decides a one-task rate more than the
//! code does, and it differs between cases whose code differs in when it goes to sleep.
//! [`Pinned`] puts both on one CPU, so that a cycle's time is the client's work plus the
//! server's, one after the other: what the code costs, without the wake-ups.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// This process's threads and a server's process tree, each thread pinned to one CPU
/// until this is dropped; then every thread of this process, and of the server's tree as
/// it is then (processes it started meanwhile included, such as PostgreSQL's connection
/// processes, which inherit the pin), gets back the CPUs it had before.
pub struct Pinned {
    cpu: usize,
    own: CpuSet,
    server: u32,
    server_before: CpuSet,
}

impl Pinned {
    /// Pins this process's threads and those of `server` and its descendants to the last
    /// CPU this process may run on. Fails where the affinity of a thread cannot be read
    /// or set (a server in another PID namespace, a container's); what it pinned by then
    /// is given back.
    pub fn one_cpu(server: u32) -> Result<Pinned, String> {
        let own =
            sched_getaffinity(pid(std::process::id())).map_err(|e| format!("our CPUs: {e}"))?;
        let server_before =
            sched_getaffinity(pid(server)).map_err(|e| format!("CPUs of {server}: {e}"))?;
        let cpu = (0..CpuSet::count())
            .rev()
            .find(|&c| own.is_set(c).unwrap_or(false))
            .ok_or("this process may run on no CPU")?;
        let mut target = CpuSet::new();
        target.set(cpu).map_err(|e| format!("CPU {cpu}: {e}"))?;
        // From here on, a failure gives everything back (the drop).
        let pinned = Pinned {
            cpu,
            own,
            server,
            server_before,
        };
        set_threads(std::process::id(), &target)?;
        for p in crate::cost::tree(server) {
            set_threads(p, &target)?;
        }
        Ok(pinned)
    }

    /// The CPU everything runs on.
    pub fn cpu(&self) -> usize {
        self.cpu
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut give_back = vec![(std::process::id(), &self.own)];
        give_back.extend(
            crate::cost::tree(self.server)
                .into_iter()
                .map(|p| (p, &self.server_before)),
        );
        for (p, mask) in give_back {
            if let Err(e) = set_threads(p, mask) {
                eprintln!("lease-bench: giving process {p} its CPUs back: {e}");
            }
        }
    }
}

fn pid(p: u32) -> Pid {
    Pid::from_raw(i32::try_from(p).unwrap_or(i32::MAX))
}

/// Sets the CPUs of every thread of process `p` (a thread that ended meanwhile is skipped).
fn set_threads(p: u32, mask: &CpuSet) -> Result<(), String> {
    let tids = match crate::cost::threads(p) {
        Ok(tids) => tids,
        // The process ended meanwhile (a connection process closed): nothing to set.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("threads of {p}: {e}")),
    };
    let mut failed = None;
    for tid in tids {
        match sched_setaffinity(pid(tid), mask) {
            // ESRCH: the thread ended meanwhile.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => failed = Some(format!("thread {tid} of {p}: {e}")),
        }
    }
    failed.map_or(Ok(()), Err)
}
