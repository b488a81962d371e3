//! The client's instructions per acquire + release cycle, counted by callgrind in the
//! report's own run: the stable figure beside the rates and CPU times. Each case runs as
//! `lease-bench count-cycles STORE URL CASE N` (one task, one connection, a
//! current-thread runtime) under `valgrind --tool=callgrind`, once with N cycles and once
//! with 2N; the difference over N is one cycle's instructions without start-up and
//! connection set-up. Instructions are counted, not timed: the same binary against the
//! same server gives the same count whatever else the machine is doing (on Redis,
//! PostgreSQL and MySQL within a few instructions; etcd's and ZooKeeper's counts move by
//! about 1% between runs, with how often a connection's thread parks). The pair is
//! counted three times (once with `--quick`) and the median shown with the range.
//! `scripts/client-instructions.sh` does the same by hand, on throwaway servers.

use std::time::Duration;

/// One case to count.
pub struct Case {
    /// The `count-cycles` case.
    pub case: &'static str,
    /// The row's label in the report.
    pub label: &'static str,
    /// The `count-cycles` case this one is compared with, if any.
    pub against: Option<&'static str>,
}

/// One counted case.
pub struct Row {
    /// The `count-cycles` case.
    pub case: &'static str,
    /// The row's label.
    pub label: &'static str,
    /// Instructions per cycle: median, lowest, highest of the repeats.
    pub per_cycle: (f64, f64, f64),
    /// The compared case's label and this case's median over its median.
    pub against: Option<(&'static str, f64)>,
}

/// The counts of one store.
pub struct Instructions {
    /// N: the runs take N and 2N cycles.
    pub cycles: usize,
    /// How many times each pair ran.
    pub repeats: usize,
    /// The rows, in the order asked.
    pub rows: Vec<Row>,
}

impl Instructions {
    /// The median ratio of `case` to the case it is compared with.
    pub fn ratio_of(&self, case: &str) -> Option<(&'static str, f64)> {
        self.rows
            .iter()
            .find(|r| r.case == case)
            .and_then(|r| r.against)
    }
}

/// The cases counted on each store, and N: the floor, the library's commands sent raw
/// where the report has that row, the backend against the floor, `LeaseClient` against
/// the peer, and the peers.
pub fn cases(store: &str) -> (Vec<Case>, usize) {
    let c = |case, label, against| Case {
        case,
        label,
        against,
    };
    let floor = |label| c("bare", label, None);
    let raw = |label| c("raw", label, Some("bare"));
    let library = |peer| {
        [
            c("backend", "library backend acquire + release", Some("bare")),
            c(
                "client",
                "library LeaseClient try_acquire + release",
                Some(peer),
            ),
        ]
    };
    let shedlock = || c("shedlock", "ShedLock's statements (usingDbTime)", None);
    let (mut rows, n) = match store {
        "redis" => (
            vec![
                floor("bare floor (SET NX PX + compare-and-delete script)"),
                raw("the library's commands sent raw"),
            ],
            1000,
        ),
        "etcd" => (
            vec![floor("bare floor (put-if-absent + compare-and-delete)")],
            300,
        ),
        "postgres" | "mysql" => (vec![floor("bare floor (table statements)")], 1000),
        "zookeeper" => (
            vec![
                floor("bare floor (create ephemeral + delete)"),
                raw("the library's requests sent raw"),
            ],
            1000,
        ),
        _ => return (Vec::new(), 0),
    };
    let peer = if matches!(store, "postgres" | "mysql") {
        "shedlock"
    } else {
        "peer"
    };
    rows.extend(library(peer));
    rows.extend(match store {
        "redis" => vec![c("peer", "rslock lock + unlock", None)],
        "etcd" => vec![c("peer", "etcd lock service Lock + Unlock", None)],
        "postgres" => vec![
            shedlock(),
            c(
                "advisory",
                "library advisory mode acquire + release",
                Some("peer"),
            ),
            c("peer", "sqlx PgAdvisoryLock acquire + release", None),
        ],
        "mysql" => vec![shedlock()],
        _ => vec![c(
            "peer",
            "Curator InterProcessMutex requests sent raw",
            None,
        )],
    });
    (rows, n)
}

/// Counts `store`'s cases against the server at `url`. An error says why nothing was
/// counted (valgrind missing, a run that failed); the URL is never part of it.
pub async fn count(store: &str, url: &str, quick: bool) -> Result<Instructions, String> {
    let (cases, n) = cases(store);
    if cases.is_empty() {
        return Err(format!("no cases for {store}"));
    }
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let repeats = if quick { 1 } else { 3 };
    let out = std::env::temp_dir().join(format!("lease-bench-callgrind-{}", std::process::id()));
    let mut counted: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    // Repeats go over all cases in turn, so that a drift of the server touches all alike.
    for _ in 0..repeats {
        for (i, c) in cases.iter().enumerate() {
            let one = run(&exe, &out, store, url, c.case, n).await?;
            let two = run(&exe, &out, store, url, c.case, 2 * n).await?;
            counted[i].push((two as f64 - one as f64) / n as f64);
        }
    }
    let _ = std::fs::remove_file(&out);
    let stats: Vec<(f64, f64, f64)> = counted
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            let mid = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
            let lo = v.first().copied().unwrap_or(f64::NAN);
            let hi = v.last().copied().unwrap_or(f64::NAN);
            (mid, lo, hi)
        })
        .collect();
    let rows = cases
        .iter()
        .zip(&stats)
        .map(|(c, &per_cycle)| {
            let against = c.against.and_then(|a| {
                let j = cases.iter().position(|k| k.case == a)?;
                Some((cases[j].label, per_cycle.0 / stats[j].0))
            });
            Row {
                case: c.case,
                label: c.label,
                per_cycle,
                against,
            }
        })
        .collect();
    Ok(Instructions {
        cycles: n,
        repeats,
        rows,
    })
}

/// One `count-cycles` run under callgrind: the instructions it collected.
async fn run(
    exe: &std::path::Path,
    out: &std::path::Path,
    store: &str,
    url: &str,
    case: &str,
    n: usize,
) -> Result<u64, String> {
    let mut cmd = tokio::process::Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(["count-cycles", store, url, case, &n.to_string()])
        // One task on a current-thread runtime, whatever this process was given.
        .env_remove("LEASE_BENCH_WORKERS")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .map_err(|_| format!("count-cycles {store} {case} {n}: no end within 600 s"))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                "valgrind is not installed (Debian: valgrind)".to_owned()
            }
            _ => format!("valgrind: {e}"),
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let collected = stderr.lines().find_map(|l| {
        let (_, rest) = l.split_once("Collected : ")?;
        rest.trim().parse::<u64>().ok()
    });
    match (output.status.success(), collected) {
        (true, Some(n)) => Ok(n),
        _ => {
            // The last lines say why; lines naming the URL are left out.
            let why: Vec<&str> = stderr
                .lines()
                .filter(|l| !l.starts_with("==") && !l.contains(url))
                .rev()
                .take(3)
                .collect();
            Err(format!(
                "count-cycles {store} {case} {n} under callgrind failed ({}): {}",
                output.status,
                why.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ))
        }
    }
}
