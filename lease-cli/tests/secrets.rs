//! The `lease` binary never prints a password from the store URL, also when the password
//! has unencoded reserved characters (`/`, `?`, `#`, `@`: a base64 password has `/`).
//! Every URL points at a closed port, so no server is needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Stdio;

use tokio::process::Command;

const LEASE: &str = env!("CARGO_BIN_EXE_lease");

/// `lease [-vvv] status x` with `LEASE_BACKEND=url`, and what it printed.
async fn status_with(url: &str, verbose: Option<&str>) -> std::process::Output {
    let mut c = Command::new(LEASE);
    c.env("LEASE_BACKEND", url)
        .env_remove("LEASE_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c.args(verbose);
    c.args(["status", "x"]);
    c.output().await.unwrap()
}

/// Whether `text` contains `secret`, or any 4 characters in a row of it.
fn shows_part_of(text: &str, secret: &str) -> bool {
    let chars: Vec<char> = secret.chars().collect();
    chars
        .windows(4.min(chars.len()))
        .any(|w| text.contains(&w.iter().collect::<String>()))
}

#[tokio::test]
async fn passwords_with_reserved_characters_are_never_printed() {
    let cases = [
        ("etcd://u:se#cret@127.0.0.1:1", "se#cret"),
        (
            "etcds://u:Zm9v/YmFy+Q==@127.0.0.1:1,127.0.0.1:2/app",
            "Zm9v/YmFy+Q==",
        ),
        ("redis://:ab/cd@127.0.0.1:1", "ab/cd"),
        ("redis://app:pw?x7#q@127.0.0.1:1/0", "pw?x7#q"),
        ("rediss://:k3y/v@l@127.0.0.1:1", "k3y/v@l"),
        (
            "redis+sentinel://:snt1/nel@127.0.0.1:1/mymaster",
            "snt1/nel",
        ),
        ("redis+cluster://:cl/st@127.0.0.1:1,127.0.0.1:2", "cl/st"),
        ("postgres://u:pg/w0rd@127.0.0.1:1/db", "pg/w0rd"),
        ("postgresql://u:pg?w0rd#x@127.0.0.1:1/db", "pg?w0rd#x"),
        ("mysql://u:my/s3cr#t@127.0.0.1:1/db", "my/s3cr#t"),
        ("mariadb://u:ma?r1a@127.0.0.1:1/db", "ma?r1a"),
    ];
    let mut failures = Vec::new();
    for (url, secret) in cases {
        for verbose in [None, Some("-vvv")] {
            let out = status_with(url, verbose).await;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if shows_part_of(&stdout, secret) || shows_part_of(&stderr, secret) {
                failures.push(format!("{url} {verbose:?}: printed: {stdout}{stderr}"));
            }
            // Refused as a malformed URL (exit 64), saying what to do.
            if out.status.code() != Some(64) || !stderr.contains("percent-encode") {
                failures.push(format!("{url} {verbose:?}: {:?} {stderr}", out.status));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The same passwords percent-encoded are accepted and reach the store (a closed port):
/// neither the encoded nor the decoded password is printed, in the error or in the logs
/// (`-vvv`: the store clients' debug and trace lines).
#[tokio::test]
async fn encoded_passwords_are_never_printed_on_connection_errors() {
    let cases = [
        ("etcd://u:se%23cret@127.0.0.1:1", "se#cret"),
        ("redis://:ab%2Fcd@127.0.0.1:1", "ab/cd"),
        (
            "redis+sentinel://:snt1%2Fnel@127.0.0.1:1/mymaster",
            "snt1/nel",
        ),
        ("redis+cluster://:cl%2Fst@127.0.0.1:1", "cl/st"),
        ("postgres://u:pg%2Fw0rd@127.0.0.1:1/db", "pg/w0rd"),
        ("mysql://u:my%2Fs3cr%23t@127.0.0.1:1/db", "my/s3cr#t"),
    ];
    let mut failures = Vec::new();
    for (url, decoded) in cases {
        let encoded = url
            .split_once("://")
            .and_then(|(_, rest)| rest.split_once(':'))
            .and_then(|(_, rest)| rest.split_once('@'))
            .map(|(password, _)| password)
            .unwrap();
        for verbose in [None, Some("-vvv")] {
            let out = status_with(url, verbose).await;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if shows_part_of(&text, decoded) || shows_part_of(&text, encoded) {
                failures.push(format!("{url} {verbose:?}: printed: {text}"));
            }
            // Unreachable: exit 69.
            if out.status.code() != Some(69) {
                failures.push(format!("{url} {verbose:?}: {:?} {text}", out.status));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
