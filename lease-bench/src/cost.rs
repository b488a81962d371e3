//! What one acquire + release cycle costs, in figures that a noisy machine moves much less
//! than it moves wall-clock rates: CPU time of this process (the client) and of the
//! server's processes (from /proc), and the requests the server itself counted. Measured
//! apart from the timed rounds, with one task: each case's cycles run in [`SLICES`]
//! slices, interleaved with the other cases' slices and starting at a different case each
//! slice (as the rounds are), so that a drift of the machine's speed over the minutes of
//! the measurement moves every case alike instead of the ones measured last.

use std::collections::HashMap;
use std::time::Duration;

use crate::cycles::Case;
use crate::scale::{Counter, cpu_now};

/// Cycles per case.
pub const CYCLES: usize = 5_000;

/// Slices per case: [`CYCLES`] / `SLICES` cycles each, the cases in turn.
pub const SLICES: usize = 10;

/// How the server's side of a cycle is read.
pub struct ServerMeter {
    /// The server's main process; its descendants count too (PostgreSQL forks a process
    /// per connection). `None`: a server this process cannot see (a container's or
    /// another host's), whose CPU is not reported.
    pub pid: Option<u32>,
    /// The server's own count of requests received, and what it counts.
    pub requests: Option<(Counter, &'static str)>,
}

/// The cost of one case's cycle.
#[derive(Clone, Debug)]
pub struct CaseCost {
    /// The case's label.
    pub label: String,
    /// This process's CPU time per cycle, µs.
    pub client_us: f64,
    /// This process's CPU time per cycle in each slice, µs (in the slices' order).
    pub client_slices: Vec<f64>,
    /// The server's CPU time per cycle, µs.
    pub server_us: Option<f64>,
    /// Requests the server counted per cycle.
    pub requests: Option<f64>,
}

impl CaseCost {
    /// This case's client CPU per cycle against `other`'s: the median of the ratios
    /// slice by slice (each slice of the one next to the other's in time), with the
    /// lowest and highest; `None` without slices.
    pub fn client_ratio(&self, other: &CaseCost) -> Option<(f64, f64, f64)> {
        let mut r: Vec<f64> = self
            .client_slices
            .iter()
            .zip(&other.client_slices)
            .filter(|(_, b)| **b > 0.0)
            .map(|(a, b)| a / b)
            .collect();
        r.sort_by(|a, b| a.total_cmp(b));
        Some((*r.get(r.len() / 2)?, *r.first()?, *r.last()?))
    }
}

/// What was measured on one store.
#[derive(Clone, Debug, Default)]
pub struct Costs {
    /// One per case, in the cases' order.
    pub cases: Vec<CaseCost>,
    /// What the request counter counts (empty: no counter).
    pub requests_source: &'static str,
}

/// Runs [`CYCLES`] cycles of each case with one task, in [`SLICES`] interleaved slices,
/// and reads both sides' CPU and the server's request count around each slice.
pub async fn per_cycle(cases: &[Case], meter: &ServerMeter) -> Costs {
    let k = cases.len();
    let n = CYCLES / SLICES;
    let mut client = vec![Duration::ZERO; k];
    let mut client_slices = vec![Vec::with_capacity(SLICES); k];
    let mut server: Vec<Option<Duration>> = vec![meter.pid.map(|_| Duration::ZERO); k];
    let mut requests: Vec<Option<u64>> = vec![meter.requests.as_ref().map(|_| 0); k];
    // Each case cycles over the same names in every slice, taken once before the
    // slices: a name's first acquisition does more than the others (a Redis fencing
    // counter is seeded, a PostgreSQL row inserted), and fresh names in every slice
    // would count it once per slice.
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let prefix = |c: usize| format!("cost-{run_id}-{c}");
    for (c, case) in cases.iter().enumerate() {
        (case.run)(prefix(c), 64).await;
    }
    for slice in 0..SLICES {
        for i in 0..k {
            let c = (i + slice) % k;
            let case = &cases[c];
            // The request count is read outside the CPU windows: reading it is work for
            // the server (etcd renders its metrics page) and for this process.
            let requests0 = match &meter.requests {
                Some((count, _)) => Some(count().await),
                None => None,
            };
            let server0 = meter.pid.map(ThreadTimes::of_tree);
            let client0 = cpu_now();
            (case.run)(prefix(c), n).await;
            let spent = cpu_now().saturating_sub(client0);
            let server1 = meter.pid.map(ThreadTimes::of_tree);
            let requests1 = match &meter.requests {
                Some((count, _)) => Some(count().await),
                None => None,
            };
            client[c] += spent;
            client_slices[c].push(spent.as_secs_f64() * 1e6 / n as f64);
            if let (Some(total), Some(a), Some(b)) = (server[c].as_mut(), &server0, &server1) {
                *total += b.since(a);
            }
            if let (Some(total), Some(a), Some(b)) = (requests[c].as_mut(), requests0, requests1) {
                assert!(
                    b >= a,
                    "{}: the server's request count went down",
                    case.label
                );
                *total += b - a;
            }
        }
    }
    let cycles = (n * SLICES) as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / cycles;
    let out = (0..k)
        .map(|c| CaseCost {
            label: cases[c].label.clone(),
            client_us: per(client[c]),
            client_slices: std::mem::take(&mut client_slices[c]),
            server_us: server[c].map(per),
            requests: requests[c].map(|r| r as f64 / cycles),
        })
        .collect();
    Costs {
        cases: out,
        requests_source: meter.requests.as_ref().map_or("", |(_, what)| what),
    }
}

/// CPU time of every thread of a process and of its live descendants, from each thread's
/// `/proc/PID/task/TID/schedstat` (time on a CPU in nanoseconds, where `/proc/PID/stat`
/// counts 10 ms ticks, as coarse as a whole slice of cycles).
pub struct ThreadTimes(HashMap<u32, u64>);

impl ThreadTimes {
    /// The threads of `pid` and of every live descendant (PostgreSQL's per-connection
    /// processes).
    pub fn of_tree(pid: u32) -> ThreadTimes {
        let mut times = HashMap::new();
        for p in tree(pid) {
            let Ok(tids) = threads(p) else {
                continue;
            };
            for tid in tids {
                let ns = std::fs::read_to_string(format!("/proc/{p}/task/{tid}/schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
                if let Some(ns) = ns {
                    times.insert(tid, ns);
                }
            }
        }
        ThreadTimes(times)
    }

    /// CPU time spent between `before` and this reading by the threads alive at this
    /// reading (a thread started since counts in full; one that ended since, its time
    /// since `before` is lost: the servers measured keep their threads and connection
    /// processes while the cycles run).
    pub fn since(&self, before: &ThreadTimes) -> Duration {
        let ns: u64 = self
            .0
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(before.0.get(tid).copied().unwrap_or(0)))
            .sum();
        Duration::from_nanos(ns)
    }
}

/// The thread ids of process `pid`, from `/proc/PID/task` (an error of kind `NotFound`
/// once the process has ended).
pub fn threads(pid: u32) -> std::io::Result<Vec<u32>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        .collect())
}

/// `pid` and its live descendants.
pub fn tree(pid: u32) -> Vec<u32> {
    let children = children();
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        out.push(p);
        if let Some(c) = children.get(&p) {
            todo.extend(c);
        }
    }
    out
}

/// Every process's children, from the parent pid in `/proc/PID/stat`.
fn children() -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = stat_fields(p).and_then(|f| f.get(1)?.parse::<u32>().ok()) {
                children.entry(ppid).or_default().push(p);
            }
        }
    }
    children
}

/// The fields of `/proc/PID/stat` after the process name (which may hold spaces): `[0]`
/// is the state, `[1]` the parent's pid.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Commands a Redis server ran, from `INFO commandstats`, those that scripts ran included
/// (so the floor's `SET` + compare-and-delete script counts 4: `SET`, `EVALSHA`, `GET`,
/// `DEL`), without `INFO` itself (so that reading the count does not change it).
pub fn redis_commands(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            let calls = l.split_once("calls=")?.1;
            calls.split(',').next()?.trim().parse::<u64>().ok()
        })
        .sum()
}

/// Messages etcd's gRPC server received (unary requests and stream messages), summed
/// over methods from its Prometheus text (`grpc_server_msg_received_total`).
pub fn etcd_messages(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// `GET /metrics` of an etcd client URL (`http://host:port`), over plain HTTP/1.0;
/// panics when it cannot be read (a benchmark binary: a count read as 0 would pass for a
/// real one).
pub async fn etcd_metrics(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url
        .trim_start_matches("http://")
        .trim_start_matches("etcd://")
        .split(['/', ','])
        .next()
        .unwrap_or_default()
        .to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .unwrap_or_else(|e| panic!("etcd /metrics at {addr}: {e}"));
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("etcd /metrics at {addr}: {e}"));
    let mut body = Vec::new();
    s.read_to_end(&mut body)
        .await
        .unwrap_or_else(|e| panic!("etcd /metrics at {addr}: {e}"));
    let text = String::from_utf8_lossy(&body).into_owned();
    // A count read as 0 would pass for a real one: an answer without the series is loud.
    assert!(
        text.contains("grpc_server_msg_received_total{"),
        "etcd /metrics at {addr} has no grpc_server_msg_received_total"
    );
    text
}

/// Packets a ZooKeeper server received, from the `Received:` line of `srvr`; `None`
/// without one.
pub fn zookeeper_received(srvr: &str) -> Option<u64> {
    srvr.lines()
        .find_map(|l| l.strip_prefix("Received: "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_what_the_servers_print() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5,usec_per_call=0.5\r\n\
                    cmdstat_info:calls=3,usec=1\r\ncmdstat_hdel:calls=7,usec=2\r\n";
        assert_eq!(redis_commands(info), 17);
        let metrics = "# HELP x\ngrpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n\
                       grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 3\n\
                       grpc_server_msg_sent_total{grpc_method=\"Txn\"} 12\n";
        assert_eq!(etcd_messages(metrics), 15);
        assert_eq!(
            zookeeper_received(
                "Zookeeper version: 3.8.0\nLatency min/avg/max: 0/0.1/2\nReceived: 4521\nSent: 4520\n"
            ),
            Some(4521)
        );
        assert_eq!(zookeeper_received(""), None);
    }

    #[test]
    fn this_process_tree_counts_its_own_cpu() {
        // Busy for 100 ms of CPU (getrusage). A thread's schedstat leaves out the slice it
        // is running (it is brought up to date at each scheduler tick and switch), so the
        // reading taken while busy may miss up to one tick: 20 ms of tolerance.
        let me = std::process::id();
        let before = ThreadTimes::of_tree(me);
        let started = cpu_now();
        let mut x = 0u64;
        while cpu_now().saturating_sub(started) < Duration::from_millis(100) {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
        let spent = ThreadTimes::of_tree(me).since(&before);
        assert!(
            spent >= Duration::from_millis(80),
            "the threads' times counted {spent:?} of 100 ms"
        );
    }
}
