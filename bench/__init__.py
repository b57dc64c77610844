"""Benchmarks: `make bench`. Figures are ratios measured side by side in one run."""
