"""`txstream kafka up/down/status/check`: a local Apache Kafka cluster (txstream/local/cluster.py).

Clusters are registered per cache directory (TXSTREAM_CACHE_DIR), and several people or test runs
may share a machine: a bare `down` stops only the cluster on the default port, never the others.
"""
from __future__ import annotations

import os
import sys

import click

from txstream.cli.options import BOOTSTRAP_ENV, TIMEOUT_HELP, kafka_options
from txstream.kafka.config import KafkaClients
from txstream.local import cluster as local_broker

DEFAULT_PORT = 9092


def default_port() -> int:
    """The port `kafka up` and `kafka down` use without --port: the one TXSTREAM_BOOTSTRAP_SERVERS
    names (so `up` starts the cluster the other commands will look for), else 9092."""
    first = os.environ.get(BOOTSTRAP_ENV, "").split(",")[0].strip()
    try:
        return int(first.rsplit(":", 1)[1]) if ":" in first else DEFAULT_PORT
    except ValueError:
        return DEFAULT_PORT


_PORT_HELP = f"Port of the first broker [default: {DEFAULT_PORT}, or the port {BOOTSTRAP_ENV} names]."


def _progress(message: str) -> None:
    click.echo(message, err=True)


@click.group()
def kafka() -> None:
    """A local Apache Kafka cluster (KRaft) from the official jars on Maven Central."""


@kafka.command("up")
@click.option("--port", type=int, default=None, help=_PORT_HELP)
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
@click.option("--tls", is_flag=True,
              help="Add a TLS listener on PORT+200 with a throwaway CA (client certificates accepted).")
@click.option("--scram-user", "scram_users", multiple=True, metavar="NAME:PASSWORD",
              help="A SASL/SCRAM-SHA-512 user of the secured listener on PORT+200 (repeatable).")
@click.option("--acls", "authorizer", is_flag=True,
              help="Turn on Kafka's StandardAuthorizer: nothing is allowed without an ACL (the plaintext listener "
                   "stays a super user, for administration).")
def kafka_up(port: int | None, data_dir: str | None, brokers: int, listen: str, advertise: str | None,
             tls: bool, scram_users: tuple[str, ...], authorizer: bool) -> None:
    """Start a local Kafka cluster in the background and print its bootstrap address (stdout).

    With --tls or --scram-user it also gets a secured listener; the client settings for it are
    written to a properties file (its path is printed) to pass as --command-config."""
    users = {}
    for item in scram_users:
        name, sep, password = item.partition(":")
        if not sep or not name or not password:
            raise click.BadParameter(f"expected NAME:PASSWORD, got {item!r}", param_hint="--scram-user")
        users[name] = password
    cluster = local_broker.LocalKafkaCluster(port=port or default_port(), data_dir=data_dir or "", brokers=brokers,
                                             listen=listen, advertise=advertise or "", tls=tls,
                                             scram_users=users or None, authorizer=authorizer)
    try:
        bootstrap = cluster.start(progress=_progress)
    except local_broker.BrokerError as exc:
        raise click.ClickException(str(exc)) from None
    if cluster.secured:
        path = cluster.write_client_properties()
        _progress(f"Secured listener ({cluster.secured_protocol}): {cluster.secured_bootstrap_servers}; its client "
                  f"settings: --command-config {path}")
    click.echo(bootstrap)


def _names(clusters: list[local_broker.LocalKafkaCluster]) -> str:
    return ", ".join(f"{c.bootstrap_servers} (--port {c.port})" for c in clusters)


def _not_ours(port: int) -> None:
    """Nothing registered here runs on `port`: say whether something else listens there."""
    listener = local_broker.listener_on(port)
    if listener is None:
        click.echo(f"No local Kafka cluster runs on port {port}.", err=True)
        return
    raise click.ClickException(
        f"{listener} listens on port {port}, but it is not a cluster registered in "
        f"{local_broker.registry_dir()}: it was started under another TXSTREAM_CACHE_DIR (run `txstream kafka "
        f"down --port {port}` with that one) or by something else (stop it yourself, e.g. `kill PID`).")


@kafka.command("down")
@click.option("--port", type=int, default=None,
              help=f"Stop the cluster on this port [default: {DEFAULT_PORT}, or the port {BOOTSTRAP_ENV} names].")
@click.option("--all", "every", is_flag=True, help="Stop every cluster registered in this cache directory.")
def kafka_down(port: int | None, every: bool) -> None:
    """Stop a local Kafka cluster started with `kafka up`.

    Without --port, the default port's cluster; when none runs there but others do, the command
    names them and stops nothing (exit 1). A port where something else listens is an error that
    says what listens."""
    if every and port is not None:
        raise click.UsageError("--all and --port exclude each other")
    running = local_broker.registered_clusters()
    if every:
        if not running:
            click.echo("No local Kafka cluster is running.", err=True)
        for cluster in running:
            cluster.stop()
            click.echo(f"Stopped Kafka at {cluster.bootstrap_servers}", err=True)
        return
    wanted = port if port is not None else default_port()
    chosen = [c for c in running if c.port == wanted]
    if chosen:
        chosen[0].stop()
        click.echo(f"Stopped Kafka at {chosen[0].bootstrap_servers}", err=True)
        return
    if port is None and running:
        raise click.ClickException(
            f"no local Kafka cluster runs on the default port {wanted}; running: {_names(running)}. "
            "Name one with --port, or stop them all with --all.")
    _not_ours(wanted)


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
@click.option("--timeout", type=click.FloatRange(min=0.5), default=30.0, show_default=True, help=TIMEOUT_HELP)
def kafka_check(clients: KafkaClients, timeout: float) -> None:
    """Prove the cluster honours transactions: aborted vs committed vs open, read two ways.

    The check's topic and group are deleted afterwards."""
    from txstream.errors import TxstreamError
    from txstream.tools.broker_check import transaction_round_trip

    try:
        result = transaction_round_trip(clients, timeout=timeout)
    except TxstreamError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.report())
    if not result.ok:
        sys.exit(1)
