//! Benchmark: routing.
fn main() {}
