"""`txstream verify`: audit exactly-once from the topics alone."""
from __future__ import annotations

import json
import sys

import click

from txstream.cli.options import kafka_options
from txstream.kafka.config import KafkaClients


class _ExitTwo(click.ClickException):
    """Usage or connection problem: a clear message, exit status 2, no traceback."""

    exit_code = 2


@click.command("verify")
@click.option("--input", "inputs", multiple=True, required=True, metavar="TOPIC",
              help="Input topic of the app (repeatable).")
@click.option("--output", "outputs", multiple=True, required=True, metavar="TOPIC",
              help="Output topic of the app (repeatable).")
@click.option("--dead-letter-topic", "--dead-letter", "dead_letter", default=None, metavar="TOPIC",
              help="The app's dead-letter topic (as `run --dead-letter-topic`): dead-lettered records count "
                   "as handled.")
@click.option("--app-id", default=None,
              help="Audit only what the app committed (its consumer group's offsets) "
                   "[default: everything up to the input's last stable offset].")
@click.option("--one-to-one", is_flag=True,
              help="The processor emits exactly one record per input record: report gaps "
                   "(no output, no dead letter), and second outputs without a publication id "
                   "as duplicates.")
@click.option("--count-field", default=None, metavar="FIELD",
              help="A wide app's output values are JSON with this count field (an aggregate's count): per "
                   "batch, its sum must equal the input records the batch read (not dead-lettered).")
@kafka_options
@click.option("--format", "output_format", type=click.Choice(["human", "json"]), default="human", show_default=True,
              help="The report as a table and notes, or as JSON with the same figures (for scripts and CI).")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="The same as --format json.")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for the broker, and the longest stall allowed while reading.")
def verify(inputs: tuple[str, ...], outputs: tuple[str, ...], dead_letter: str | None,
           app_id: str | None, one_to_one: bool, count_field: str | None, clients: KafkaClients,
           output_format: str, as_json: bool, timeout: float) -> None:
    """Audit an app's output against its input: duplicates and gaps per source partition.

    Reads every topic with isolation.level=read_committed up to its last stable offset and
    follows each output's lineage header back to its publication and source record; a wide app's
    output is audited per batch and unit against the app's batch records. Exit status: 0 clean,
    1 duplicates, gaps or incomplete publications found, 2 usage or connection error.
    """
    from txstream.errors import TxstreamError
    from txstream.tools.verify import audit

    try:
        report = audit(clients, list(inputs), list(outputs), dead_letter=dead_letter,
                       app_id=app_id, one_to_one=one_to_one, timeout=timeout, count_field=count_field)
    except TxstreamError as exc:   # AuditError, KafkaUnreachable, OffsetsError: one line
        raise _ExitTwo(str(exc)) from None
    if as_json or output_format == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(report.table())
    sys.exit(0 if report.clean else 1)
