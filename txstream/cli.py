"""The `txstream` command (click): run processors, manage the local broker, move test data."""
from __future__ import annotations

import sys

import click

from txstream import local_broker


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
def kafka_up(port: int, data_dir: str | None, brokers: int) -> None:
    """Start a local Kafka cluster in the background and print its bootstrap address."""
    cluster = local_broker.LocalKafkaCluster(port=port, data_dir=data_dir or "", brokers=brokers)
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
@click.option("--bootstrap-servers", envvar="TXSTREAM_BOOTSTRAP_SERVERS", default="localhost:9092",
              show_default=True)
def kafka_check(bootstrap_servers: str) -> None:
    """Prove the cluster honours transactions: aborted vs committed vs open, read two ways."""
    from txstream.broker_check import transaction_round_trip

    result = transaction_round_trip(bootstrap_servers)
    click.echo(result.report())
    if not result.ok:
        sys.exit(1)


# Command groups that live in modules of their own.
from txstream.cli_offsets import offsets  # noqa: E402
from txstream.cli_verify import verify  # noqa: E402

main.add_command(offsets)
main.add_command(verify)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
