//! The suite's checks are written as functions in `src/suite/` and listed again in
//! `conformance_suite!` (a macro cannot find functions by itself). This test keeps the
//! two in step: every `pub async fn NAME(backend: Arc<dyn LeaseBackend>)` of the suite is
//! in the macro's list exactly once, and the list names nothing else, so that a new
//! check cannot be left out of every backend's run by a forgotten line; and every name
//! in `LOAD_CHECKS` is a check of that list.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn every_check_is_in_the_macro_list_once() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let start = lib
        .find("@checks $factory;")
        .expect("the macro's list of checks");
    let end = start + lib[start..].find(");").expect("the end of the list");
    let listed: Vec<&str> = lib[start + "@checks $factory;".len()..end]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut seen = BTreeSet::new();
    for name in &listed {
        assert!(seen.insert(*name), "{name} is listed twice");
    }

    let mut defined = BTreeSet::new();
    for entry in std::fs::read_dir(root.join("src/suite")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("pub async fn ")
                && let Some(name) = rest.strip_suffix("(backend: Arc<dyn LeaseBackend>) {")
            {
                assert!(defined.insert(name.to_owned()), "{name} is defined twice");
            }
        }
    }
    let listed: BTreeSet<String> = seen.into_iter().map(str::to_owned).collect();
    let missing: Vec<_> = defined.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&defined).collect();
    assert!(
        missing.is_empty(),
        "checks not in conformance_suite!'s list: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "listed but not defined as checks: {unknown:?}"
    );
    assert!(defined.len() >= 50, "only {} checks found", defined.len());
    // The checks that run alone are named by string: a renamed one would silently run
    // alongside the others again.
    for check in lease_conformance::LOAD_CHECKS {
        assert!(
            listed.contains(*check),
            "LOAD_CHECKS names {check}, which is not a check of the macro's list"
        );
    }
}
