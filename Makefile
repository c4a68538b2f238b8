# Two commands a new user runs on a fresh machine: `make demo` and `make test`.
# Everything else (virtual environment, Python packages, Kafka jars) is installed by them.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test install kafka-jars bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,bench]"
	# Spark's class-data-sharing archive: about 5 s off every Spark start (see spark_session.py).
	$(PY) -m txstream.spark_session
	touch $@

install: $(VENV)/.installed

kafka-jars: install
	$(PY) -c "from txstream.local_broker import kafka_libs; kafka_libs(print)"

demo: kafka-jars
	$(PY) scripts/demo.py

# pytest exits 5 when no test ran; make then fails like on any other non-zero exit.
test: kafka-jars
	$(PY) -m pytest $(PYTEST_ARGS)

bench: kafka-jars
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
