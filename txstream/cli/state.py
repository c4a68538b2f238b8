"""`txstream state show|reset`: a stateful app's state (docs/state.md, "Tools").

Reading lives in tools/state_view.py, resetting in tools/state_reset.py; this module parses
options and prints.
"""
from __future__ import annotations

import click

from txstream.cli.offsets import parse_topics, print_reset, reset_target, target_options
from txstream.cli.options import kafka_options, timeout_option
from txstream.kafka.config import KafkaClients

_APP_ID = click.option("--app-id", required=True, help="The app id (its consumer group, the prefix of its topics).")


@click.group("state")
def state() -> None:
    """Show and reset a stateful app's state (changelog, snapshots, descriptions)."""


def _one_line(action):
    """Every failure as one line (exit 1), never a traceback."""
    from txstream.classify import one_line

    try:
        return action()
    except click.ClickException:
        raise
    except Exception as exc:
        raise click.ClickException(one_line(exc)) from None


@state.command("show")
@_APP_ID
@kafka_options
@click.option("--operator", default=None, help="Only this stateful operator (e.g. agg, dedup) [default: all].")
@click.option("--key", default=None, metavar="K",
              help="Only groups whose values are K: a JSON list is all the values (e.g. '[\"EUR\",3]'); anything "
                   "else must equal one of them (EUR, 3).")
@click.option("--window", "window", default=None, metavar="START",
              help="Only the window starting at START (ISO 8601 time, UTC without a zone, or ms since the epoch).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Tables, or one JSON object with the same figures (for scripts).")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True,
              help="Keys listed per operator (0: all); the counts cover every key.")
@timeout_option()
def show(app_id: str, clients: KafkaClients, operator: str | None, key: str | None, window: str | None,
         output_format: str, limit: int, timeout: float) -> None:
    """The app's state as its next batch would restore it: per operator its keys and values
    (newest snapshot plus the changelog's tail, tombstones applied, read_committed), open windows,
    the watermark, the changelog's offsets per unit and the last batch. Exit 1: no such app or no
    state (one line)."""
    from txstream.errors import UserError
    from txstream.tools.state_view import parse_window_start, show_state

    start = None
    if window is not None:
        try:
            start = parse_window_start(window)
        except UserError as exc:
            raise click.BadParameter(str(exc), param_hint="--window") from None
    view = _one_line(lambda: show_state(clients, app_id, operator, key, start, limit, timeout))
    click.echo(view.json() if output_format == "json" else view.text())


@state.command("reset")
@_APP_ID
@kafka_options
@target_options
@click.option("--dry-run/--execute", "dry_run", default=True, show_default=True,
              help="Only show what would be deleted (default), or delete it.")
@click.option("--force", is_flag=True,
              help="Reset while the app's plan log has a pending batch (planned, not closed).")
@timeout_option()
def reset(app_id: str, clients: KafkaClients, to_earliest: bool, to_latest: bool, to_offset: int | None,
          to_datetime: str | None, shift_by: int | None, topics: tuple[str, ...], dry_run: bool, force: bool,
          timeout: float) -> None:
    """Start the app's state over: delete its state topics (descriptions, changelogs, snapshots;
    the app creates them again at its next start). The app must be stopped.

    With a target of `txstream offsets reset` (--to-earliest, --to-latest, --to-offset,
    --to-datetime, --shift-by; --topic) the input offsets move too, so that state and input start
    over together. The units' markers are kept (docs/state.md, "Tools")."""
    from txstream.tools.state_reset import reset_state

    target = reset_target(to_earliest, to_latest, to_offset, to_datetime, shift_by, required=False)
    selection = parse_topics(topics)
    if selection and target is None:
        raise click.UsageError("--topic narrows an offsets reset: give a target too (--to-earliest, --to-latest, "
                               "--to-offset, --to-datetime or --shift-by)")
    result = _one_line(lambda: reset_state(clients, app_id, target, selection, execute=not dry_run, force=force,
                                           timeout=timeout))
    mode = ("Executed" if result.executed else "Dry run (nothing changed; add --execute to apply)")
    click.echo(f"{mode}: the state of app {app_id}, {len(result.topics)} topic(s)"
               + (" deleted" if result.executed else " to delete"))
    click.echo()
    rows = [[t.name, t.role, t.partitions, t.records] for t in result.topics]
    cells = [["TOPIC", "ROLE", "PARTITIONS", "RECORDS"]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(4)]
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    click.echo("RECORDS: offsets in use (end minus start, every partition): records, tombstones and transaction "
               "markers.")
    click.echo(f"Kept: the units' markers (group {result.markers_group}): the next batch is numbered after them "
               "and restores the empty state at their batch; their latest event times and the plan log's "
               "watermark are cleared: the watermark starts over with the state.")
    if result.executed:
        click.echo("The app creates its state topics again at its next start.")
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if result.offsets is not None:
        click.echo()
        print_reset(result.offsets)
