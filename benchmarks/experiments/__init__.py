"""One-off measurements that take one part of a batch apart, outside the harness's tables.

Each module is run as `python -m benchmarks.experiments.<name>`; what each found is in
docs/performance.md. They share `broker.py` for their broker and their argument conventions.
"""
