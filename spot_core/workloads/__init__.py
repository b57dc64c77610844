"""Small, real training workloads the demo, tests and benchmarks run as spot jobs."""
