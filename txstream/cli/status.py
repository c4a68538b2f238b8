"""`txstream status`: an app's group, offsets, lag, last publications and live figures (tools/status.py)."""
from __future__ import annotations

import json

import click

from txstream.cli.options import kafka_options, timeout_option
from txstream.kafka.config import KafkaClients


@click.command("status")
@click.option("--app-id", required=True, help="The app id (its consumer group).")
@kafka_options
@click.option("--output", "outputs", multiple=True,
              help="Output topic (repeatable): read its tail for each input partition's last publication.")
@click.option("--topic", "topics", multiple=True, help="Also show this input topic's partitions (repeatable).")
@click.option("--metrics-url", help="A running instance's /metrics (txstream run --metrics-port) for live figures.")
@click.option("--tail", type=click.IntRange(1), default=1000, show_default=True,
              help="Offsets read at the end of each output partition.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@timeout_option()
def status(app_id: str, clients: KafkaClients, outputs: tuple[str, ...], topics: tuple[str, ...],
           metrics_url: str | None, tail: int, as_json: bool, timeout: float) -> None:
    """The app's group state and members; per input partition the committed offset, last stable
    offset, lag and the last publication (from the output's lineage headers: no instance needs to
    run); and a running instance's live figures when --metrics-url is given."""
    from txstream.classify import one_line
    from txstream.tools.status import status as app_status

    try:
        result = app_status(clients, app_id, list(outputs), list(topics), metrics_url, tail, timeout)
    except Exception as exc:  # one clear line, never a traceback
        raise click.ClickException(one_line(exc)) from None
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.text())
