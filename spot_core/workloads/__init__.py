"""Step code: small, real ML workloads (training, batch inference) the demo, example
pipelines, tests and benchmarks run as spot jobs. Engine-agnostic; runs on the node."""
