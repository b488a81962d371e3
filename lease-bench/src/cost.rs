//! What one acquire + release cycle costs, in figures that a noisy machine moves much less
//! than it moves wall-clock rates: CPU time of this process (the client) and of the
//! server's processes (from /proc), and the requests the server itself counted. Measured
//! apart from the timed rounds: one task, the cases one after another, the same number
//! of cycles each.

use std::collections::HashMap;
use std::time::Duration;

use crate::cycles::Case;
use crate::scale::{Counter, cpu_now};

/// Cycles per case.
pub const CYCLES: usize = 5_000;

/// Linux's `USER_HZ` (the unit of /proc's `cutime`), 100 on every architecture it runs on.
const USER_HZ: u64 = 100;

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
    /// The server's CPU time per cycle, µs.
    pub server_us: Option<f64>,
    /// Requests the server counted per cycle.
    pub requests: Option<f64>,
}

/// What was measured on one store.
#[derive(Clone, Debug, Default)]
pub struct Costs {
    /// One per case, in the cases' order.
    pub cases: Vec<CaseCost>,
    /// What the request counter counts (empty: no counter).
    pub requests_source: &'static str,
}

/// Runs [`CYCLES`] cycles of each case with one task and reads both sides' CPU and the
/// server's request count around each.
pub async fn per_cycle(cases: &[Case], meter: &ServerMeter) -> Costs {
    let n = CYCLES;
    let mut out = Vec::new();
    for case in cases {
        let requests0 = match &meter.requests {
            Some((count, _)) => Some(count().await),
            None => None,
        };
        let server0 = meter.pid.map(tree_cpu);
        let client0 = cpu_now();
        (case.run)(format!("cost-{}", uuid::Uuid::new_v4().simple()), n).await;
        let client = cpu_now() - client0;
        let server = meter.pid.map(tree_cpu);
        let requests = match &meter.requests {
            Some((count, _)) => Some(count().await),
            None => None,
        };
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        out.push(CaseCost {
            label: case.label.clone(),
            client_us: per(client),
            server_us: server0.zip(server).map(|(a, b)| {
                assert!(b >= a, "{}: the server's CPU time went down", case.label);
                per(b - a)
            }),
            requests: requests0.zip(requests).map(|(a, b)| {
                assert!(
                    b >= a,
                    "{}: the server's request count went down",
                    case.label
                );
                (b - a) as f64 / n as f64
            }),
        });
    }
    Costs {
        cases: out,
        requests_source: meter.requests.as_ref().map_or("", |(_, what)| what),
    }
}

/// CPU time of process `pid` and of every live descendant, plus what `pid`'s reaped
/// children used: `utime` + `stime` of each process from `/proc/PID/stat` (which keeps the
/// time of threads that have exited, as a JVM's compiler threads do) and `cutime` +
/// `cstime` of `pid`, in clock ticks (10 ms; over a case's 5,000 cycles that is a few
/// percent at most). PostgreSQL's per-connection processes count, whether they still run
/// or have exited.
pub fn tree_cpu(pid: u32) -> Duration {
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
    let ticks = |f: &[String], i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let mut total = 0u64;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        // utime and stime: fields 14 and 15 of stat, 11 and 12 after the name.
        if let Some(f) = stat_fields(p) {
            total += ticks(&f, 11) + ticks(&f, 12);
            if p == pid {
                // cutime and cstime: fields 16 and 17, 13 and 14 after the name.
                total += ticks(&f, 13) + ticks(&f, 14);
            }
        }
        if let Some(c) = children.get(&p) {
            todo.extend(c);
        }
    }
    Duration::from_millis(total * 1000 / USER_HZ)
}

/// CPU time of process `pid` itself (`utime` + `stime`, all its threads, in clock ticks of
/// 10 ms), without its children.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let f = stat_fields(pid)?;
    // utime and stime: fields 14 and 15 of stat, 11 and 12 after the name.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(Duration::from_millis(
        (ticks(11)? + ticks(12)?) * 1000 / USER_HZ,
    ))
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
        // Busy until the count moves (it moves in 10 ms ticks), for at most 10 s.
        let me = std::process::id();
        let before = tree_cpu(me);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        while tree_cpu(me) <= before {
            assert!(
                std::time::Instant::now() < until,
                "no CPU time counted in 10 s"
            );
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
    }
}
