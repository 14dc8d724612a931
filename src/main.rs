//! The `sortie` command line.
fn main() {}
