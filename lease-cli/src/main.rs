//! Placeholder for the `lease` command-line tool.
fn main() {}
