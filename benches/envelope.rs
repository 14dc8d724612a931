//! Benchmark: envelope.
fn main() {}
