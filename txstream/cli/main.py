"""The `txstream` command (click): run processors, manage the local broker, move test data."""
from __future__ import annotations

import faulthandler
import signal
import sys
from pathlib import Path

import click

from txstream.cli.options import (
    DEFAULT_TIMEOUT_S,
    kafka_options,
    pairs,
    registry_options,
    timeout_option,
)
from txstream.kafka.config import KafkaClients


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             epilog=f"Timeouts: every command that talks to Kafka takes --timeout SECONDS (default "
                    f"{DEFAULT_TIMEOUT_S:g}), how long it waits for each step (first contact, a request, "
                    "acknowledgements, a stall while reading) before it stops and says which step did not answer.")
@click.version_option(package_name="txstream", prog_name="txstream", message="%(prog)s %(version)s")
def main() -> None:
    """Exactly-once Kafka-to-Kafka stream processing with PySpark transforms."""


# ---------------------------------------------------------------------------------------------
# txstream run / produce / consume
# ---------------------------------------------------------------------------------------------

@main.command("run")
@click.argument("processor")
@kafka_options(as_properties=True,
               x_help="librdkafka property for every client (repeatable); prefix producer. or consumer. "
                      "for one side. Wins over --command-config.")
@click.option("--app-id", help="Consumer group and transactional.id prefix [default: from the class name].")
@click.option("--input", "inputs", multiple=True, help="Input topic (repeatable) [default: the processor's].")
@click.option("--output", help="Output topic [default: the processor's].")
@click.option("--table", "table_topics", multiple=True, metavar="NAME=TOPIC",
              help="The topic of the processor's table NAME (repeatable) [default: its Table's].")
@click.option("--dead-letter-topic", help="Topic for records that cannot be processed.")
@click.option("--guarantee", type=click.Choice(["exactly-once", "at-least-once", "at-most-once"]),
              help="Delivery guarantee [default: the processor's, exactly-once].")
@click.option("--auto-offset-reset", type=click.Choice(["earliest", "latest", "none"]),
              help="Where to start without a committed offset [default: earliest].")
@click.option("--master", default=None,
              help="Spark master, e.g. spark://HOST:7077 [default: spark-submit's --master, then spark.master "
                   "in spark-defaults.conf, then local[*]].")
@click.option("--max-records-per-partition", type=int, help="Cap per partition per batch [default: 100000].")
@click.option("--trigger-interval", type=float, help="Seconds between batch starts [default: 0].")
@click.option("--until-caught-up", is_flag=True,
              help="Exit 0 once every owned partition reaches the end offset seen at start.")
@click.option("--max-batches", type=int, help="Stop after this many batches.")
@click.option("--batch-timeout", type=click.FloatRange(min=1), default=None,
              help="Cancel and re-plan a batch still running after this many seconds "
                   "[default: 5 x transaction.timeout.ms].")
@click.option("--value-schema", help="Avro schema (.avsc) of input values.")
@click.option("--key-schema", help="Avro schema (.avsc) of input keys.")
@click.option("--output-value-schema", help="Avro schema (.avsc) of output values.")
@click.option("--output-key-schema", help="Avro schema (.avsc) of output keys.")
@registry_options
@click.option("--subject-name-strategy", type=click.Choice(["topic", "record", "topic-record"]), default=None,
              help="How subjects are named: TOPIC-value, the record's full name, or TOPIC-RECORD [default: the "
                   "processor's, else topic].")
@click.option("--auto-register/--no-auto-register", default=None,
              help="Register the output schema under its subject at start [default: on]; off: it must be "
                   "registered already.")
@click.option("--use-latest-version", is_flag=True, default=None,
              help="Publish with the output subject's latest registered schema.")
@click.option("--lineage/--no-lineage", default=None, help="Stamp source topic/partition/offset headers.")
@click.option("--lenient-trailing-bytes", is_flag=True,
              help="Accept Avro values with bytes left after the record (read the record, ignore the rest); "
                   "by default such a value is a decode error (written with another schema?).")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE", help="Spark setting.")
@click.option("-q", "--quiet", is_flag=True, help="Only the final summary.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port) [default: off].")
@click.option("--spark-ui-port", type=click.IntRange(1, 65535), default=None,
              help="Serve Spark's UI on this port [default: on (port 4040) with a cluster master, off locally].")
@click.option("--metrics-address", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
@click.option("--log-format", type=click.Choice(["human", "json"]), default="human", show_default=True,
              help="json: one JSON object per batch and per event (assignment, retry, dead letter, ...).")
@click.option("--spark-logs", is_flag=True,
              help="Show Spark's own output (its banner, log lines, a failed job's stack traces) on stderr "
                   "[default: written to spark.log in the run's directory, ~/.cache/txstream/runs/APP-ID/TIME/].")
@click.option("--wide-mode", type=click.Choice(["units", "single-transaction"]), default=None,
              help="How a wide transform's batch is published: K output units, each its own transaction, or "
                   "all of it in one transaction [default: the processor's, else units].")
@click.option("--output-mode", type=click.Choice(["append", "update", "complete", "per-batch"]), default=None,
              help="How an aggregation or deduplication emits: as Structured Streaming's output modes, with state "
                   "across batches, or per batch alone (docs/state.md) [default: the processor's, else append].")
@click.option("--watermark-idle", "watermark_idle_s", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="After this long without input, the watermark follows wall-clock time less its "
                                      "delay, so an idle stream's windows close (docs/state.md) [default: the "
                                      "processor's watermark_idle_s, else never].")
@click.option("--state-snapshot-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="A state unit writes a snapshot of its state to Kafka once its changelog has grown N records "
                   "past the newest one; a restore reads the snapshot and at most N records after it "
                   "(docs/state.md) [default: the processor's state_snapshot_every, else 200000].")
@click.option("--output-units", type=click.IntRange(min=1), default=None,
              help="K, the output units of a wide transform [default: the number of input partitions].")
@click.option("--task-slots", type=click.IntRange(min=1), default=None,
              help="Publishing tasks per narrow batch; each publishes its share of the input partitions through "
                   "one producer in one transaction [default: the processor's, else Spark's cores].")
@click.option("--producers-per-slot", type=click.IntRange(min=1), default=None,
              help="transactional.ids per task slot: a slot's task publishes through whichever of them its "
                   "Python worker already holds a producer for, sparing init_transactions [default: the "
                   "processor's, else 4].")
@click.option("--first-batch-records", type=click.IntRange(min=0), default=None,
              help="Records the run's first batch reads in all (output soon after the start, even over a "
                   "backlog); the next batches read up to --max-records-per-partition per partition. 0: the "
                   "first batch too [default: the processor's, 10000].")
@click.option("--allow-nondeterministic", is_flag=True, default=None,
              help="Run a wide transform that is not deterministic (rand, current_timestamp, first, ...) "
                   "knowingly: a re-run batch may then differ (docs/wide-transforms.md).")
@timeout_option("Seconds to wait for Kafka's first answer before the run starts: an unreachable cluster is "
                "reported after this long.")
def run(processor: str, bootstrap_servers: str, app_id: str | None, inputs: tuple[str, ...], output: str | None,
        table_topics: tuple[str, ...], dead_letter_topic: str | None, guarantee: str | None, auto_offset_reset: str | None, master: str | None,
        max_records_per_partition: int | None, trigger_interval: float | None, until_caught_up: bool,
        max_batches: int | None, batch_timeout: float | None, value_schema: str | None, key_schema: str | None,
        output_value_schema: str | None, output_key_schema: str | None, lineage: bool | None,
        client_properties: dict[str, str], spark_conf: tuple[str, ...], quiet: bool, lenient_trailing_bytes: bool,
        metrics_port: int | None, spark_ui_port: int | None, metrics_address: str, log_format: str, spark_logs: bool,
        wide_mode: str | None, output_mode: str | None, watermark_idle_s: float | None,
        state_snapshot_every: int | None, output_units: int | None, allow_nondeterministic: bool | None,
        task_slots: int | None, producers_per_slot: int | None, first_batch_records: int | None,
        timeout: float, schema_registry_url: str | None, schema_registry_properties: dict[str, str],
        subject_name_strategy: str | None, auto_register: bool | None, use_latest_version: bool | None) -> None:
    """Run PROCESSOR (package.module:Class or path/file.py:Class) exactly once, batch after batch.

    A stop by SIGINT (Ctrl-C) or SIGTERM finishes the batch in flight, leaves the group, prints
    `stopped after batch N: SIGNAL; committed up to ...` and exits 0; a second signal aborts the
    batch (its transactions abort, nothing is half-published) and exits 130 (SIGINT) or 143 (SIGTERM).
    Exit 1: the run failed (the `Error:` line says why)."""
    import logging

    from txstream import settings as run_settings
    from txstream.driver.loop import Driver

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # `kill -USR1 PID` prints every thread's stack: where a stuck run is stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        cls = run_settings.load_processor(processor)
        resolved = run_settings.resolve(
            cls, bootstrap_servers=bootstrap_servers, app_id=app_id, inputs=list(inputs), output=output,
            table_topics=pairs(table_topics, "--table"), dead_letter=dead_letter_topic, guarantee=guarantee, auto_offset_reset=auto_offset_reset,
            max_records_per_partition=max_records_per_partition, trigger_interval=trigger_interval,
            master=master, lineage=lineage, librdkafka=client_properties,
            spark_conf=pairs(spark_conf, "--conf"),
            schemas={"value": value_schema, "key": key_schema, "output_value": output_value_schema,
                     "output_key": output_key_schema},
            until_caught_up=until_caught_up, max_batches=max_batches, quiet=quiet,
            batch_timeout_s=batch_timeout, lenient_trailing_bytes=lenient_trailing_bytes, metrics_port=metrics_port,
            metrics_address=metrics_address, log_format=log_format, spark_ui_port=spark_ui_port,
            wide_mode=wide_mode, output_mode=output_mode,
            watermark_idle_s=watermark_idle_s, state_snapshot_every=state_snapshot_every, output_units=output_units,
            allow_nondeterministic=allow_nondeterministic,
            task_slots=task_slots, producers_per_slot=producers_per_slot, first_batch_records=first_batch_records,
            schema_registry_url=schema_registry_url,
            schema_registry_properties=schema_registry_properties,
            subject_name_strategy=subject_name_strategy, auto_register=auto_register,
            use_latest_version=use_latest_version)
        # Human lines are for the terminal (stderr); JSON events are the run's output, for a pipe.
        as_json = log_format != "human"
        echo = (lambda _m: None) if quiet else (lambda m: click.echo(m, err=not as_json))
        if log_format == "human":
            echo(_first_line(resolved))
        if not spark_logs:
            from txstream.spark.session import send_jvm_output_to

            log_file = run_directory(resolved.app_id) / "spark.log"
            send_jvm_output_to(log_file)
        _reachable(resolved.clients, timeout)
        code = Driver(resolved, echo=echo).run()
    except click.ClickException:
        raise
    except Exception as exc:  # every failure ends as one clear line, its type decides the words
        from txstream.classify import one_line, unexpected_cause

        cause = unexpected_cause(exc)
        if cause is not None:
            # Not an outcome txstream knows (a bug of its own, most likely): the line alone would
            # not say where it came from.
            import traceback

            click.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)
        raise click.ClickException(one_line(exc)) from None
    sys.exit(code)


def _first_line(s) -> str:
    """The run's first line: the app id first, as `status`, `verify` and `offsets` want it."""
    output = s.output_topic or "the rows' topic column"
    topics = f"{', '.join(s.input_topics)} -> {output}"
    letters = f", dead letters to {s.dead_letter_topic}" if s.dead_letter_topic else ""
    return f"app id {s.app_id}: {topics}{letters}, {s.guarantee}"


def run_directory(app_id: str) -> Path:
    """This run's directory: ~/.cache/txstream/runs/APP-ID/UTC-TIME-PID/ (TXSTREAM_CACHE_DIR moves it)."""
    import os
    import time

    from txstream.local.paths import cache_dir

    return cache_dir() / "runs" / app_id / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"


def _reachable(clients: KafkaClients, timeout: float) -> None:
    """One metadata request before anything else starts: an unreachable cluster is one line after
    `timeout` seconds."""
    from txstream.kafka.lookups import admin_client, cluster_topics

    cluster_topics(admin_client(clients), timeout)


@main.command("produce")
@click.argument("topic")
@kafka_options
@click.option("--value-schema", help="Encode each JSON line with this Avro schema (.avsc); else send the line as is.")
@click.option("--key-field", help="Use this field of each JSON value as the record key.")
@click.option("--file", "path", type=click.File("r"), default="-", help="JSON lines [default: stdin].")
@click.option("--transactional", is_flag=True, help="Write everything in one transaction.")
@registry_options
@click.option("--use-latest-version", is_flag=True,
              help="With --schema-registry: encode with TOPIC-value's latest registered schema.")
@click.option("--no-auto-register", is_flag=True,
              help="With --schema-registry: the schema must be registered under TOPIC-value already.")
@timeout_option()
def produce(topic: str, clients: KafkaClients, value_schema: str | None, key_field: str | None,
            path, transactional: bool, timeout: float, schema_registry_url: str | None,
            schema_registry_properties: dict[str, str], use_latest_version: bool, no_auto_register: bool) -> None:
    """Write JSON lines to TOPIC (one record per line). With --schema-registry: Avro framed with
    the schema's id under TOPIC-value (registered unless --no-auto-register)."""
    from txstream.serde.avro import load_schema
    from txstream.tools.topic_io import produce_lines

    try:
        schema = load_schema(value_schema) if value_schema else None
        registry = _registry(schema_registry_url, schema_registry_properties, auto_register=not no_auto_register,
                             use_latest_version=use_latest_version)
        if registry is not None and schema is None and not use_latest_version:
            raise click.UsageError("--schema-registry needs --value-schema FILE or --use-latest-version")
        count = produce_lines(clients, topic, path, schema, key_field, transactional, timeout=timeout,
                              registry=registry)
    except Exception as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"produced {count} records to {topic}", err=True)


@main.command("consume")
@click.argument("topic")
@kafka_options
@click.option("--value-schema", help="Decode values with this Avro schema (.avsc).")
@click.option("--isolation", type=click.Choice(["read_committed", "read_uncommitted"]), default="read_committed",
              show_default=True)
@click.option("--max", "limit", type=int, help="Stop after this many records.")
@registry_options
@timeout_option()
def consume(topic: str, clients: KafkaClients, value_schema: str | None, isolation: str,
            limit: int | None, timeout: float, schema_registry_url: str | None,
            schema_registry_properties: dict[str, str]) -> None:
    """Print TOPIC from the beginning to its current end as JSON lines. With --schema-registry:
    each value decoded with the schema its id names (`schema_id` in the line), read as
    --value-schema when given."""
    import json

    from txstream.serde.avro import load_schema
    from txstream.tools.topic_io import read_records

    try:
        schema = load_schema(value_schema) if value_schema else None
        registry = _registry(schema_registry_url, schema_registry_properties)
        count = 0
        for record in read_records(clients, topic, schema, isolation, limit, timeout, registry=registry):
            click.echo(json.dumps(record, sort_keys=True))
            count += 1
    except Exception as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{count} records ({isolation})", err=True)


def _registry(url: str | None, properties: dict[str, str], **how: bool):
    """The command's schema registry (serde/registry.py RegistryConfig), None without a URL."""
    if not url:
        return None
    from txstream.serde.registry import RegistryConfig, client

    config = RegistryConfig(url=url, properties=tuple(sorted(properties.items())), **how)
    client(config)   # its properties checked now, not taken for a bad record later
    return config


# Command groups that live in modules of their own.
from txstream.cli.acls import acls  # noqa: E402
from txstream.cli.kafka import kafka  # noqa: E402
from txstream.cli.offsets import offsets  # noqa: E402
from txstream.cli.registry import registry  # noqa: E402
from txstream.cli.schemas import schemas  # noqa: E402
from txstream.cli.state import state  # noqa: E402
from txstream.cli.status import status  # noqa: E402
from txstream.cli.topics import topics  # noqa: E402
from txstream.cli.verify import verify  # noqa: E402

main.add_command(kafka)
main.add_command(offsets)
main.add_command(verify)
main.add_command(topics)
main.add_command(status)
main.add_command(state)
main.add_command(acls)
main.add_command(registry)
main.add_command(schemas)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
