//! Benchmark: h1.
fn main() {}
