//! The path a backend author takes, checked end to end: the example crate of
//! `docs/writing-a-backend.md` is written into a temporary directory outside this
//! workspace, with path dependencies on `lease-core` and `lease-conformance` only, built
//! with `PROTOC` pointing nowhere, and its tests (the whole suite, and the guide's
//! `FaultyBackend` test) must pass. Its dependency tree, dev-dependencies included, must
//! hold no store client and stay under 80 crates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Crates a backend author must not be made to build.
const FORBIDDEN: [&str; 6] = [
    "redis",
    "sqlx",
    "sqlx-core",
    "etcd-client",
    "tonic",
    "testcontainers",
];

/// The most crates the author's whole tree may hold.
const MAX_CRATES: usize = 80;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The guide's files: its `Cargo.toml` block (a `toml` block with `[package]`) and every
/// block whose first line is `// file: PATH`.
fn guide_files(guide: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut block: Option<(String, Vec<&str>)> = None;
    for line in guide.lines() {
        match (&mut block, line.strip_prefix("```")) {
            (None, Some(lang)) => block = Some((lang.to_owned(), Vec::new())),
            (Some(_), Some(_)) => {
                let (lang, lines) = block.take().expect("open block");
                let text = lines.join("\n") + "\n";
                if lang == "toml" && text.contains("[package]") {
                    files.push(("Cargo.toml".to_owned(), text));
                } else if let Some(path) = lines.first().and_then(|l| l.strip_prefix("// file: ")) {
                    files.push((path.trim().to_owned(), text));
                }
            }
            (Some((_, lines)), None) => lines.push(line),
            (None, None) => {}
        }
    }
    files
}

fn cargo(dir: &Path, target: &Path, args: &[&str]) -> Output {
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(args)
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        // etcd-client's build needs protoc: the author's tree must not.
        .env("PROTOC", "/nonexistent/protoc")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .output()
        .expect("cargo");
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_backend_outside_the_workspace_needs_only_core_and_conformance() {
    let ws = workspace();
    let guide = std::fs::read_to_string(ws.join("docs/writing-a-backend.md")).expect("guide");
    let files = guide_files(&guide);
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    for wanted in [
        "Cargo.toml",
        "src/lib.rs",
        "tests/conformance.rs",
        "tests/faults.rs",
    ] {
        assert!(
            names.contains(&wanted),
            "the guide has no {wanted}: {names:?}"
        );
    }
    let dir = std::env::temp_dir().join(format!("lease-external-backend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in &files {
        let text = if path == "Cargo.toml" {
            let core = ws.join("lease-core");
            let conformance = ws.join("lease-conformance");
            let replaced = text
                .replace(
                    "lease-core = \"0.1\"",
                    &format!("lease-core = {{ path = {:?} }}", core.display().to_string()),
                )
                .replace(
                    "lease-conformance = \"0.1\"",
                    &format!(
                        "lease-conformance = {{ path = {:?} }}",
                        conformance.display().to_string()
                    ),
                );
            assert_ne!(
                &replaced, text,
                "the guide's Cargo.toml names no lease crates"
            );
            // A workspace of its own: not part of any workspace above the temp dir.
            replaced + "\n[workspace]\n"
        } else {
            text.clone()
        };
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, text).expect("write");
    }
    // The versions this workspace is tested with (and has downloaded).
    std::fs::copy(ws.join("Cargo.lock"), dir.join("Cargo.lock")).expect("lock file");
    let target = ws.join("target").join("external-backend");

    let out = cargo(&dir, &target, &["test"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("test result: ok. 54 passed; 0 failed"),
        "the suite did not run in full:\n{report}"
    );
    assert!(
        report.contains("test result: ok. 1 passed; 0 failed"),
        "the guide's FaultyBackend test did not run:\n{report}"
    );

    let tree = cargo(
        &dir,
        &target,
        &["tree", "-e", "normal,build,dev", "--prefix", "none"],
    );
    // "name vX.Y.Z [(path)] [(*)]": one entry per crate and version.
    let crates: BTreeSet<(String, String)> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect();
    let forbidden: Vec<&str> = FORBIDDEN
        .iter()
        .copied()
        .filter(|f| crates.iter().any(|(name, _)| name == f))
        .collect();
    assert!(
        forbidden.is_empty(),
        "the author's tree holds {forbidden:?}"
    );
    eprintln!(
        "a backend crate outside the workspace: 54 checks passed without protoc; {} crates \
         in its tree, dev-dependencies included",
        crates.len()
    );
    assert!(
        crates.len() < MAX_CRATES,
        "{} crates in the author's tree: {crates:?}",
        crates.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
