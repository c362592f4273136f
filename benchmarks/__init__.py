"""Benchmark suite (issue 7): ``python -m benchmarks.run``; see docs/benchmarks.md."""
