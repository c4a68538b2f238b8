"""Acceptance: a user's own processor in a file outside the repo, with its own Avro schemas,
run with `txstream run`, killed and restarted, publishes exactly once. And a UDF that raises
for one record sends that record to the dead-letter topic, not the whole partition."""
from __future__ import annotations

import json
import signal
import textwrap
import time
from collections import Counter
from pathlib import Path

from tests.support.kafka import avro_bytes, committed, produce, read_all
from tests.support.running import App, Run
from txstream.kafka import headers
from txstream.serde.avro import AvroCodec, load_schema

USER_CODE = '''
from pyspark.sql import DataFrame, functions as F, types as T
from txstream import Processor


@F.udf(T.StringType())
def shout(name):
    if name == "poison":
        raise ValueError("cannot shout poison")
    return name.upper()


class Greeter(Processor):
    input_topics = ["people"]
    output_topic = "greetings"
    value_schema = "person.avsc"
    output_value_schema = "greeting.avsc"
    one_to_one = True

    def transform(self, batch: DataFrame) -> DataFrame:
        return batch.select("key", "offset", F.struct(
            F.concat(F.lit("Hello, "), shout(F.col("value.name"))).alias("text"),
            (F.col("value.age") + 1).alias("age_next_year")).alias("value"))
'''

PERSON = {"type": "record", "name": "Person", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
GREETING = {"type": "record", "name": "Greeting", "fields": [
    {"name": "text", "type": "string"}, {"name": "age_next_year", "type": "int"}]}


def _user_project(tmp_path: Path) -> Path:
    project = tmp_path / "my-project"
    project.mkdir()
    (project / "greeter.py").write_text(textwrap.dedent(USER_CODE))
    (project / "person.avsc").write_text(json.dumps(PERSON))
    (project / "greeting.avsc").write_text(json.dumps(GREETING))
    return project


def _app(project: Path, bootstrap: str, app_id: str, source: str, sink: str, dlq: str | None) -> App:
    """`txstream run greeter.py:Greeter` started from the user's project directory."""
    return App(bootstrap, source, sink, 2, app_id=app_id, processor="greeter.py:Greeter", cap=300, cwd=project,
               extra=["--dead-letter-topic", dlq] if dlq else [])


def _run(app: App, timeout: float = 300) -> Run:
    """One run to its end (the exit code in `.proc.returncode`)."""
    run = app.start()
    try:
        run.wait(timeout)
    finally:
        run.destroy()
    return run


def test_user_processor_outside_the_repo_killed_and_restarted(bootstrap_servers, make_topic, tmp_path) -> None:
    project = _user_project(tmp_path)
    source, sink = make_topic("people", partitions=2), make_topic("greetings", partitions=2)
    people = [{"name": f"person-{i}", "age": i % 90} for i in range(1500)]
    produce(bootstrap_servers, source, ((p["name"].encode(), avro_bytes(PERSON, p)) for p in people))
    app_id = f"greeter-{time.time_ns()}"
    faults_dir = tmp_path / "faults"
    # The first run dies between producing its second range and committing it (kill -9 of the
    # driver, the JVM and the Python workers); the restart must not publish anything twice.
    app = _app(project, bootstrap_servers, app_id, source, sink, None)
    app.faults, app.faults_dir = "publish.before_commit=kill@2", str(faults_dir)
    first = _run(app)
    assert first.poll() == -signal.SIGKILL, first.tail()
    assert (faults_dir / "publish.before_commit.2").exists()
    app.faults = None
    second = _run(app)
    assert second.poll() == 0, second.tail(60)
    assert second.events().of("caught_up"), second.tail()
    codec = AvroCodec(load_schema(json.dumps(GREETING)))
    got = Counter((r.key.decode(), codec.decode(r.value)["text"]) for r in read_all(bootstrap_servers, sink))
    assert got == Counter((p["name"], f"Hello, {p['name'].upper()}") for p in people)
    assert sum(committed(bootstrap_servers, app_id, source, 2).values()) == 1500


def test_a_udf_error_dead_letters_only_that_record(bootstrap_servers, make_topic, tmp_path) -> None:
    project = _user_project(tmp_path)
    source, sink, dlq = make_topic("people"), make_topic("greetings"), make_topic("dlq")
    people = [{"name": "poison" if i == 137 else f"p{i}", "age": 30} for i in range(400)]
    produce(bootstrap_servers, source, ((p["name"].encode(), avro_bytes(PERSON, p)) for p in people))
    run = _run(_app(project, bootstrap_servers, f"udf-{time.time_ns()}", source, sink, dlq))
    assert run.poll() == 0, run.tail(60)
    out = read_all(bootstrap_servers, sink)
    assert sorted(r.key.decode() for r in out) == sorted(p["name"] for p in people if p["name"] != "poison")
    [dead] = read_all(bootstrap_servers, dlq)
    assert dead.key == b"poison" and dead.value == avro_bytes(PERSON, people[137])
    assert dead.headers[headers.DLQ_STAGE] == b"transform"
    assert b"cannot shout poison" in dead.headers[headers.DLQ_ERROR]
    assert dead.lineage.offset == 137


def test_a_udf_error_without_dead_letter_topic_stops_naming_the_record(bootstrap_servers, make_topic, tmp_path) -> None:
    project = _user_project(tmp_path)
    source, sink = make_topic("people"), make_topic("greetings")
    people = [{"name": "poison" if i == 3 else f"p{i}", "age": 30} for i in range(10)]
    produce(bootstrap_servers, source, ((p["name"].encode(), avro_bytes(PERSON, p)) for p in people))
    run = _run(_app(project, bootstrap_servers, f"udf-{time.time_ns()}", source, sink, None))
    assert run.poll() == 1, run.tail(60)
    # Spark's executor log shows the worker's traceback; txstream's own last word is one clear line.
    last = run.text().strip().splitlines()[-1]
    assert last.startswith(f"Error: record {source}[0]@3 failed in the transform"), last
    assert "cannot shout poison" in last and "dead_letter_topic" in last
    assert sorted(r.key.decode() for r in read_all(bootstrap_servers, sink)) == ["p0", "p1", "p2"]
