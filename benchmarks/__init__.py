"""The txstream benchmark suite: `python -m benchmarks --help`."""
