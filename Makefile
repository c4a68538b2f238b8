# Two commands a new user runs on a fresh machine: `make demo` and `make test`.
# Everything else (virtual environment, Python packages, Kafka jars, Spark's class archive) is
# installed by them.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test test-fast lint soak install kafka-jars spark-archive host-tools bench bench-quick clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $@

install: $(VENV)/.installed

kafka-jars: install
	$(PY) -c "from txstream.local.cluster import kafka_libs; kafka_libs(print)"

# Spark's class-data-sharing archive in ~/.cache/txstream (TXSTREAM_CACHE_DIR moves it): about 5 s
# off every Spark start (see txstream/spark/session.py). Written once per virtual environment
# (~1 min); afterwards this only checks it is there, and removes the archives of environments that
# are gone (remove_abandoned).
spark-archive: install
	$(PY) -m txstream.spark.session

demo: kafka-jars spark-archive
	$(PY) scripts/demo.py

# The multi-host tests' tools (ip, unshare, nsenter): Debian's iproute2 and util-linux, installed
# when missing (as root; without root those tests say so in the summary, and fail under CI).
host-tools:
	@command -v ip >/dev/null && command -v nsenter >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && apt-get install -y --no-install-recommends iproute2 util-linux; } || true

# pytest exits 5 when no test ran; make then fails like on any other non-zero exit.
# TEST_WORKERS pytest-xdist workers (default 2), each its own pytest session (its own broker and
# Spark session); a test file's tests stay on one worker, and the chaos files that share the 3-node
# cluster are one work unit (tests/conftest.py _work_unit). Most of the suite waits (brokers
# restarting, runs making progress), which two workers overlap on 2 cores. 0 runs it in one process.
TEST_WORKERS ?= 2
test: kafka-jars spark-archive host-tools
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The unit tests only (no broker, no Spark, no subprocess; tests/conftest.py marks the others
# `integration` and `chaos`): seconds, no jars needed. Fails, like `test`, when nothing is selected.
test-fast: install
	$(PY) -m pytest -m "not integration and not chaos" $(PYTEST_ARGS)

# ruff's configuration is in pyproject.toml ([tool.ruff]).
lint: install
	$(PY) -m ruff check .

# The chaos soak at full size (issue 12): 1,000,000+ records, 56 processor bounces, 7 broker bounces
# on 3 nodes, a read_committed checker throughout; a progress line per step. About an hour here.
soak: kafka-jars spark-archive
	TXSTREAM_SOAK=1 $(PY) -m pytest tests/chaos/test_soak.py -s $(PYTEST_ARGS)

# The whole benchmark suite (benchmarks/README.md), one step after another; a step that exits non-zero
# stops make. Each step writes its own files under benchmarks/results/ and rewrites the figures of
# docs/performance.md. The throughput table runs 1,000,000 orders, twice per contender
# (at 200,000, Spark's start-up is most of a txstream run). BENCH_ARGS goes to the throughput table
# and wins over those (e.g. BENCH_ARGS="--records 200000 --runs 3"),
# LATENCY_ARGS to both latency runs, SWEEP_ARGS to the three sweeps, WIDE_ARGS to the wide benchmark,
# WINDOWED_ARGS to the windowed count (1,000,000 orders, 2 rounds; issue 52's first benchmark),
# STATEFUL_ARGS to running totals over 1,000,000 customers and dedup over 1,000,000 ids (2 rounds each),
# RESTORE_ARGS to the state restore (1, 10 and 50 million keys into each store).
# About two hours on the 2-core machine the results come from.
bench: kafka-jars spark-archive
	$(PY) -m benchmarks --records 1000000 --runs 2 $(BENCH_ARGS)
	$(PY) -m benchmarks.first_output --rounds 3
	$(PY) -m benchmarks --latency --rate 2000 $(LATENCY_ARGS)
	$(PY) -m benchmarks --latency --rate 20000 $(LATENCY_ARGS)
	$(PY) -m benchmarks --latency --rate 200 --input-transactions-ms 100 $(LATENCY_ARGS)
	$(PY) -m benchmarks --latency --rate 1 --latency-seconds 120 --warmup 5 $(LATENCY_ARGS)
	$(PY) -m benchmarks --sweep batch $(SWEEP_ARGS)
	$(PY) -m benchmarks --sweep partitions $(SWEEP_ARGS)
	$(PY) -m benchmarks --sweep record-size $(SWEEP_ARGS)
	$(PY) -m benchmarks.wide $(WIDE_ARGS)
	$(PY) -m benchmarks --windowed --records 1000000 $(WINDOWED_ARGS)
	$(PY) -m benchmarks --stateful totals --keys 1000000 $(STATEFUL_ARGS)
	$(PY) -m benchmarks --stateful dedup --keys 1000000 $(STATEFUL_ARGS)
	$(PY) -m benchmarks --tables --keys 1000000 $(STATEFUL_ARGS)
	$(PY) -m benchmarks.restore $(RESTORE_ARGS)

# The same steps at smoke sizes, to check the plumbing (files named -quick; docs/performance.md
# prefers a full run's files when there are any): 20000 records and 1 run per table and sweep point, two points per
# sweep (10 KB records capped at 30 MB of input), 10 s latency windows after 3 s of warm-up, one
# 20000-record wide round. About 20 minutes there.
bench-quick: kafka-jars spark-archive
	$(PY) -m benchmarks --quick $(BENCH_ARGS)
	$(PY) -m benchmarks.first_output --quick
	$(PY) -m benchmarks --latency --quick --rate 2000 $(LATENCY_ARGS)
	$(PY) -m benchmarks --latency --quick --rate 20000 $(LATENCY_ARGS)
	$(PY) -m benchmarks --latency --quick --rate 200 --input-transactions-ms 100 $(LATENCY_ARGS)
	$(PY) -m benchmarks --latency --quick --rate 1 --latency-seconds 30 $(LATENCY_ARGS)
	$(PY) -m benchmarks --sweep batch --quick --batch-sizes 1000,5000 $(SWEEP_ARGS)
	$(PY) -m benchmarks --sweep partitions --quick --partition-counts 4,16 $(SWEEP_ARGS)
	$(PY) -m benchmarks --sweep record-size --quick --value-sizes 100,10000 --max-input-mb 30 $(SWEEP_ARGS)
	$(PY) -m benchmarks.wide --quick $(WIDE_ARGS)
	$(PY) -m benchmarks --windowed --quick $(WINDOWED_ARGS)
	$(PY) -m benchmarks --stateful totals --quick $(STATEFUL_ARGS)
	$(PY) -m benchmarks --stateful dedup --quick $(STATEFUL_ARGS)
	$(PY) -m benchmarks --tables --quick $(STATEFUL_ARGS)
	$(PY) -m benchmarks.restore --quick $(RESTORE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
