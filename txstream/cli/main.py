"""The `txstream` command (click): run processors, manage the local broker, move test data."""
from __future__ import annotations

import faulthandler
import signal
import sys

import click

from txstream.cli.options import kafka_options
from txstream.kafka.config import KafkaClients
from txstream.local import cluster as local_broker


def _progress(message: str) -> None:
    click.echo(message, err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Exactly-once Kafka-to-Kafka stream processing with PySpark transforms."""


# ---------------------------------------------------------------------------------------------
# txstream kafka
# ---------------------------------------------------------------------------------------------

@main.group()
def kafka() -> None:
    """A local Apache Kafka cluster (KRaft) from the official jars on Maven Central."""


@kafka.command("up")
@click.option("--port", default=9092, show_default=True, help="Port of the first broker.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Where the nodes keep their logs and data [default: ~/.cache/txstream/data/kafka-PORT].")
@click.option("--brokers", default=1, show_default=True, type=click.IntRange(1, 5),
              help="Number of combined broker+controller nodes (3 gives replication 3, min ISR 2).")
@click.option("--listen", default="localhost", show_default=True,
              help="Address the brokers listen on for clients: a network address (or 0.0.0.0) serves "
                   "Spark executors on other hosts.")
@click.option("--advertise", default=None,
              help="Address the brokers tell clients to connect to [default: --listen; this host's name "
                   "when listening on 0.0.0.0].")
def kafka_up(port: int, data_dir: str | None, brokers: int, listen: str, advertise: str | None) -> None:
    """Start a local Kafka cluster in the background and print its bootstrap address."""
    cluster = local_broker.LocalKafkaCluster(port=port, data_dir=data_dir or "", brokers=brokers,
                                             listen=listen, advertise=advertise or "")
    try:
        bootstrap = cluster.start(progress=_progress)
    except local_broker.BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(bootstrap)


@kafka.command("down")
@click.option("--port", default=None, type=int, help="Stop only the cluster on this port [default: all].")
def kafka_down(port: int | None) -> None:
    """Stop local Kafka clusters started with `kafka up`."""
    clusters = [c for c in local_broker.registered_clusters() if port is None or c.port == port]
    if not clusters:
        click.echo("No local Kafka cluster is running.", err=True)
        return
    for cluster in clusters:
        cluster.stop()
        click.echo(f"Stopped Kafka at {cluster.bootstrap_servers}", err=True)


@kafka.command("status")
def kafka_status() -> None:
    """Say which local Kafka clusters run where."""
    clusters = local_broker.registered_clusters()
    if not clusters:
        click.echo("No local Kafka cluster is running.")
        return
    for cluster in clusters:
        alive = cluster.alive_pids()
        state = "running" if len(alive) == len(cluster.nodes) else ("degraded" if alive else "stopped")
        click.echo(f"{cluster.bootstrap_servers}  {state}  nodes={len(cluster.nodes)}  "
                   f"pids={','.join(map(str, alive)) or '-'}  data={cluster.data_dir}")
        if not alive:
            cluster.state_file.unlink(missing_ok=True)


@kafka.command("check")
@kafka_options
@click.option("--timeout", type=click.FloatRange(min=0.5), default=20.0, show_default=True,
              help="Seconds to wait for Kafka at each step.")
def kafka_check(clients: KafkaClients, timeout: float) -> None:
    """Prove the cluster honours transactions: aborted vs committed vs open, read two ways."""
    from txstream.errors import TxstreamError
    from txstream.tools.broker_check import transaction_round_trip

    try:
        result = transaction_round_trip(clients, timeout=timeout)
    except TxstreamError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.report())
    if not result.ok:
        sys.exit(1)


# ---------------------------------------------------------------------------------------------
# txstream run / produce / consume
# ---------------------------------------------------------------------------------------------

def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    from txstream.kafka.config import parse_pairs

    try:
        return parse_pairs(values, option)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


@main.command("run")
@click.argument("processor")
@kafka_options(as_properties=True,
               x_help="librdkafka property for every client (repeatable); prefix producer. or consumer. "
                      "for one side. Wins over --command-config.")
@click.option("--app-id", help="Consumer group and transactional.id prefix [default: from the class name].")
@click.option("--input", "inputs", multiple=True, help="Input topic (repeatable) [default: the processor's].")
@click.option("--output", help="Output topic [default: the processor's].")
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
@click.option("--wide-mode", type=click.Choice(["units", "single-transaction"]), default=None,
              help="How a wide transform's batch is published: K output units, each its own transaction, or "
                   "all of it in one transaction [default: the processor's, else units].")
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
def run(processor: str, bootstrap_servers: str, app_id: str | None, inputs: tuple[str, ...], output: str | None,
        dead_letter_topic: str | None, guarantee: str | None, auto_offset_reset: str | None, master: str | None,
        max_records_per_partition: int | None, trigger_interval: float | None, until_caught_up: bool,
        max_batches: int | None, batch_timeout: float | None, value_schema: str | None, key_schema: str | None,
        output_value_schema: str | None, output_key_schema: str | None, lineage: bool | None,
        client_properties: dict[str, str], spark_conf: tuple[str, ...], quiet: bool, lenient_trailing_bytes: bool,
        metrics_port: int | None, spark_ui_port: int | None, metrics_address: str, log_format: str,
        wide_mode: str | None, output_units: int | None, allow_nondeterministic: bool | None,
        task_slots: int | None, producers_per_slot: int | None, first_batch_records: int | None) -> None:
    """Run PROCESSOR (package.module:Class or path/file.py:Class) exactly once, batch after batch."""
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
            dead_letter=dead_letter_topic, guarantee=guarantee, auto_offset_reset=auto_offset_reset,
            max_records_per_partition=max_records_per_partition, trigger_interval=trigger_interval,
            master=master, lineage=lineage, librdkafka=client_properties,
            spark_conf=_pairs(spark_conf, "--conf"),
            schemas={"value": value_schema, "key": key_schema, "output_value": output_value_schema,
                     "output_key": output_key_schema},
            until_caught_up=until_caught_up, max_batches=max_batches, quiet=quiet,
            batch_timeout_s=batch_timeout, lenient_trailing_bytes=lenient_trailing_bytes, metrics_port=metrics_port,
            metrics_address=metrics_address, log_format=log_format, spark_ui_port=spark_ui_port,
            wide_mode=wide_mode, output_units=output_units, allow_nondeterministic=allow_nondeterministic,
            task_slots=task_slots, producers_per_slot=producers_per_slot, first_batch_records=first_batch_records)
        echo = (lambda _m: None) if quiet else (lambda m: click.echo(m, err=True))
        code = Driver(resolved, echo=echo).run()
    except click.ClickException:
        raise
    except Exception as exc:  # every failure ends as one clear line, its type decides the words
        from txstream.failures import one_line, unexpected_cause

        cause = unexpected_cause(exc)
        if cause is not None:
            # Not an outcome txstream knows (a bug of its own, most likely): the line alone would
            # not say where it came from.
            import traceback

            click.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)
        raise click.ClickException(one_line(exc)) from None
    sys.exit(code)


@main.command("produce")
@click.argument("topic")
@kafka_options
@click.option("--value-schema", help="Encode each JSON line with this Avro schema (.avsc); else send the line as is.")
@click.option("--key-field", help="Use this field of each JSON value as the record key.")
@click.option("--file", "path", type=click.File("r"), default="-", help="JSON lines [default: stdin].")
@click.option("--transactional", is_flag=True, help="Write everything in one transaction.")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=60.0, show_default=True,
              help="Seconds to wait for Kafka (first contact, acknowledgements).")
def produce(topic: str, clients: KafkaClients, value_schema: str | None, key_field: str | None,
            path, transactional: bool, timeout: float) -> None:
    """Write JSON lines to TOPIC (one record per line)."""
    from txstream.serde.avro import load_schema
    from txstream.tools.topic_io import produce_lines

    try:
        schema = load_schema(value_schema) if value_schema else None
        count = produce_lines(clients, topic, path, schema, key_field, transactional, timeout=timeout)
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
@click.option("--timeout", type=float, default=60.0, show_default=True)
def consume(topic: str, clients: KafkaClients, value_schema: str | None, isolation: str,
            limit: int | None, timeout: float) -> None:
    """Print TOPIC from the beginning to its current end as JSON lines."""
    import json

    from txstream.serde.avro import load_schema
    from txstream.tools.topic_io import read_records

    try:
        schema = load_schema(value_schema) if value_schema else None
        count = 0
        for record in read_records(clients, topic, schema, isolation, limit, timeout):
            click.echo(json.dumps(record, sort_keys=True))
            count += 1
    except Exception as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{count} records ({isolation})", err=True)


# Command groups that live in modules of their own.
from txstream.cli.offsets import offsets  # noqa: E402
from txstream.cli.status import status  # noqa: E402
from txstream.cli.topics import topics  # noqa: E402
from txstream.cli.verify import verify  # noqa: E402

main.add_command(offsets)
main.add_command(verify)
main.add_command(topics)
main.add_command(status)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
