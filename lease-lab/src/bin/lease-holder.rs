//! A holder process for fault tests: acquires a lease through the library and, while it
//! believes it holds it, does numbered writes carrying its fencing token to a fenced
//! resource (see `lease_lab::fenced`). Tests spawn several and kill, pause or
//! cut them off.
//!
//! ```text
//! lease-holder --backend URL --name NAME --writer ID --resource HOST:PORT
//!              [--ttl-ms 1000] [--write-every-ms 20] [--write-after-loss 1]
//! ```
//!
//! `--write-after-loss 1` makes a careless writer: after each lost lease it writes once
//! more with the lost lease's token (a write delayed past the loss, as a process paused
//! between its check and its write does), which the resource's fence must refuse when a
//! newer holder has written.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test tool: failures should be loud

use std::time::Duration;

use std::sync::Arc;

use lease_conformance::TimedBackend;
use leasehold::{HolderLabel, LeaseClient, LeaseOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Args {
    backend: String,
    name: String,
    writer: String,
    resource: String,
    ttl: Duration,
    write_every: Duration,
    write_after_loss: bool,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut backend, mut name, mut writer, mut resource) = (None, None, None, None);
    let mut ttl = Duration::from_millis(1000);
    let mut write_every = Duration::from_millis(20);
    let mut write_after_loss = false;
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let ms = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--backend" => backend = Some(value.clone()),
            "--name" => name = Some(value.clone()),
            "--writer" => writer = Some(value.clone()),
            "--resource" => resource = Some(value.clone()),
            "--ttl-ms" => ttl = ms()?,
            "--write-every-ms" => write_every = ms()?,
            "--write-after-loss" => write_after_loss = value == "1",
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        backend: backend.ok_or("--backend is required")?,
        name: name.ok_or("--name is required")?,
        writer: writer.ok_or("--writer is required")?,
        resource: resource.ok_or("--resource is required")?,
        ttl,
        write_every,
        write_after_loss,
    })
}

struct Resource {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl Resource {
    async fn send(&mut self, line: String) -> String {
        self.w
            .write_all(line.as_bytes())
            .await
            .expect("resource write");
        self.lines
            .next_line()
            .await
            .expect("resource read")
            .unwrap_or_default()
    }
}

async fn report_overruns(timed: &TimedBackend, res: &mut Resource, writer: &str) {
    for o in timed.take_overruns() {
        println!("overrun {} {:?}", o.operation, o.took);
        res.send(format!(
            "T {writer} {} {}\n",
            o.operation,
            o.took.as_millis()
        ))
        .await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lease-holder: {e}");
            std::process::exit(64);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let sock = TcpStream::connect(&args.resource)
        .await
        .expect("connect to the resource");
    let (r, w) = sock.into_split();
    let mut res = Resource {
        lines: BufReader::new(r).lines(),
        w,
    };
    let backend = loop {
        match leasehold::connect(&args.backend).await {
            Ok(b) => break b,
            Err(e) if e.is_retryable() => {
                println!("connect-error {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                eprintln!("lease-holder: {e}");
                std::process::exit(64);
            }
        }
    };
    let opts = LeaseOptions::builder(args.ttl)
        .wait(Duration::from_secs(3600))
        .build()
        .unwrap();
    // Every store call is measured until it returns or is cancelled; one that outlives
    // its timeout by more than 200 ms (timer and scheduling slack on a loaded 2-core
    // machine) is reported to the resource.
    let timed = Arc::new(TimedBackend::new(
        backend,
        opts.call_timeout() + Duration::from_millis(200),
    ));
    let client = LeaseClient::with_label(
        timed.clone(),
        HolderLabel::new(args.writer.clone()).unwrap(),
    );
    let mut seq = 0u64;
    loop {
        report_overruns(&timed, &mut res, &args.writer).await;
        let guard = match client.acquire(&args.name, &opts).await {
            Ok(g) => g,
            Err(e) => {
                println!("acquire-error retryable={} {e}", e.is_retryable());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let token = guard.fencing().get();
        res.send(format!("B {} {token} start\n", args.writer)).await;
        println!("acquired {token}");
        // Write while the lease is ours; stop at the first sign of loss.
        while guard.is_held() {
            seq += 1;
            let reply = res.send(format!("W {} {token} {seq}\n", args.writer)).await;
            if reply.starts_with("STALE") {
                println!("stale-write {token} {seq} {reply}");
            }
            report_overruns(&timed, &mut res, &args.writer).await;
            tokio::select! {
                _ = tokio::time::sleep(args.write_every) => {}
                _ = guard.lost() => {}
            }
        }
        let reason = guard.loss_reason();
        res.send(format!("B {} {token} end\n", args.writer)).await;
        println!("lost {token} {reason:?}");
        if args.write_after_loss {
            seq += 1;
            let reply = res.send(format!("W {} {token} {seq}\n", args.writer)).await;
            println!("write-after-loss {token} {seq} {}", reply.trim());
        }
        let _ = guard.release().await;
    }
}
