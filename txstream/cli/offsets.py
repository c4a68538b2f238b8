"""`txstream offsets show|reset`: consumer-group offsets in kafka-consumer-groups.sh vocabulary.

Reading lives in txstream/kafka/lookups.py, resetting in txstream/tools/offset_reset.py; this module
parses options and prints tables.
"""
from __future__ import annotations

from collections.abc import Sequence

import click

from txstream.cli.options import kafka_options, timeout_option
from txstream.errors import TxstreamError
from txstream.kafka import lookups as kofs
from txstream.kafka.config import KafkaClients
from txstream.tools import offset_reset as ofs

_APP_ID = click.option("--app-id", required=True, help="The app id, which is its consumer group id.")
_TIMEOUT = timeout_option()
_TOPIC_HELP = "TOPIC or TOPIC:P,P,... (repeatable)."


@click.group("offsets")
def offsets() -> None:
    """Show and reset an app's committed offsets (its consumer group)."""


def parse_topics(values: Sequence[str]) -> dict[str, list[int] | None]:
    """`--topic orders --topic payments:0,2` -> {"orders": None (all), "payments": [0, 2]}."""
    selection: dict[str, list[int] | None] = {}
    for value in values:
        topic, sep, parts = value.partition(":")
        topic = topic.strip()
        if not topic:
            raise click.BadParameter(f"{value!r}: expected TOPIC or TOPIC:P,P,...", param_hint="--topic")
        if not sep:
            selection[topic] = None
            continue
        try:
            numbers = sorted({int(p) for p in parts.split(",") if p.strip()})
        except ValueError:
            raise click.BadParameter(f"{value!r}: partitions must be numbers, e.g. {topic}:0,1",
                                     param_hint="--topic") from None
        if not numbers or any(n < 0 for n in numbers):
            raise click.BadParameter(f"{value!r}: expected partitions after ':', e.g. {topic}:0,1",
                                     param_hint="--topic")
        if topic in selection and selection[topic] is None:
            continue
        selection[topic] = sorted(set(selection.get(topic) or []) | set(numbers))
    return selection


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(header)] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells)


def _run(action):
    """Turn our errors (OffsetsError, KafkaUnreachable, ...) into a click error: never a traceback."""
    try:
        return action()
    except TxstreamError as exc:
        raise click.ClickException(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# show
# ---------------------------------------------------------------------------------------------

@offsets.command("show")
@_APP_ID
@kafka_options
@click.option("--topic", "topics", multiple=True, help=f"Also show this topic. {_TOPIC_HELP}")
@_TIMEOUT
def show(app_id: str, clients: KafkaClients, topics: tuple[str, ...], timeout: float) -> None:
    """Committed offset, log end, last stable offset and lag per partition; the group's members.

    LAG is LAST-STABLE-OFFSET - CURRENT-OFFSET: what a read_committed app still has to read.
    """
    selection = parse_topics(topics)
    admin = kofs.admin_client(clients)
    _run(lambda: _show(admin, app_id, selection, timeout))


def _show(admin: kofs.AdminClient, group_id: str, selection: dict[str, list[int] | None], timeout: float) -> None:
    known = kofs.cluster_topics(admin, timeout)  # also the reachability check, before slower group calls
    named = kofs.select_partitions(admin, selection, timeout) if selection else []
    group = kofs.describe_group(admin, group_id, timeout)
    committed = kofs.committed_offsets(admin, group_id, None, stable=False, timeout=timeout)
    if not group.members and not committed and not selection:   # a typo, most likely: as `status` says
        from txstream.errors import OffsetsError
        from txstream.tools.status import unknown_app

        raise OffsetsError(unknown_app(admin, group_id, timeout))
    # Partitions of topics whose commits outlived them cannot be measured; say so instead of failing.
    gone = sorted({p.topic for p in committed if p.topic not in known})
    parts = sorted({p for p in committed if p.topic in known} | set(named))
    if selection:  # --topic T:P narrows T to those partitions; other committed topics stay
        parts = [p for p in parts if p.topic not in selection or p in set(named)]
    marks = kofs.watermarks(admin, parts, timeout)
    owner = {p: m.member_id for m in group.members for p in m.partitions}

    click.echo(f"Group {group_id}: {group.state}, {len(group.members)} member(s)")
    click.echo()
    if parts:
        rows = []
        for p in parts:
            current, mark = committed.get(p), marks[p]
            lag = None if current is None else mark.last_stable - current
            rows.append([p.topic, p.partition, current, mark.log_end, mark.last_stable, lag, owner.get(p)])
        click.echo(_table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAST-STABLE-OFFSET",
                           "LAG", "CONSUMER-ID"], rows))
    else:
        click.echo(f"Group {group_id} has no committed offsets; add --topic to see a topic's offsets.")
    for topic in gone:
        click.echo(f"\nNote: topic {topic} no longer exists; the group still has offsets committed for it.")
    if group.members:
        click.echo()
        click.echo(_table(["CONSUMER-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"],
                          [[m.member_id, m.client_id, m.host, ",".join(map(str, m.partitions)) or "-"]
                           for m in group.members]))


# ---------------------------------------------------------------------------------------------
# reset
# ---------------------------------------------------------------------------------------------

def target_options(command):
    """The targets of a reset (kafka-consumer-groups.sh's), and --topic: `offsets reset` and
    `state reset` take the same; `reset_target` reads them."""
    options = [
        click.option("--to-earliest", is_flag=True, help="To the earliest offset still in the log."),
        click.option("--to-latest", is_flag=True, help="To the last stable offset (skip everything committed so far)."),
        click.option("--to-offset", type=int, default=None, metavar="N", help="To offset N."),
        click.option("--to-datetime", default=None, metavar="ISO8601",
                     help="To the first record at or after this time, e.g. 2024-05-01T12:00:00Z (no zone: local "
                          "time)."),
        click.option("--shift-by", type=int, default=None, metavar="N",
                     help="Move the committed offset by N (may be negative)."),
        click.option("--topic", "topics", multiple=True,
                     help=f"Reset only these [default: all topics with committed offsets]. {_TOPIC_HELP}"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def reset_target(to_earliest: bool, to_latest: bool, to_offset: int | None, to_datetime: str | None,
                 shift_by: int | None, required: bool = True) -> ofs.ResetTarget | None:
    """The one target given (None when none is and none is `required`); more than one is a usage error."""
    given = {"--to-earliest": to_earliest, "--to-latest": to_latest, "--to-offset": to_offset is not None,
             "--to-datetime": to_datetime is not None, "--shift-by": shift_by is not None}
    chosen = [name for name, on in given.items() if on]
    if not chosen and not required:
        return None
    if len(chosen) != 1:
        raise click.UsageError(
            ("give exactly one target option: " if not chosen else f"only one target option at a time, got {', '.join(chosen)}: ")
            + ", ".join(given))
    if to_earliest:
        return ofs.ResetTarget("earliest")
    if to_latest:
        return ofs.ResetTarget("latest")
    if to_offset is not None:
        return ofs.ResetTarget("offset", to_offset)
    if shift_by is not None:
        return ofs.ResetTarget("shift-by", shift_by)
    try:
        return ofs.ResetTarget("datetime", ofs.parse_datetime(to_datetime or ""))
    except ofs.OffsetsError as exc:
        raise click.BadParameter(str(exc), param_hint="--to-datetime") from None


@offsets.command("reset")
@_APP_ID
@kafka_options
@target_options
@click.option("--dry-run/--execute", "dry_run", default=True, show_default=True,
              help="Only show what would change (default), or change it.")
@click.option("--force", is_flag=True,
              help="Reset a wide app with a pending batch (planned, not closed), abandoning that batch, or a "
                   "stateful app's offsets without its state (docs/offsets.md).")
@_TIMEOUT
def reset(app_id: str, clients: KafkaClients, to_earliest: bool, to_latest: bool, to_offset: int | None,
          to_datetime: str | None, shift_by: int | None, topics: tuple[str, ...], dry_run: bool, force: bool,
          timeout: float) -> None:
    """Move the app's committed offsets; the app must be stopped (its group Empty).

    Exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by. Targets
    outside [earliest, latest] are clamped, as kafka-consumer-groups.sh does.
    """
    target = reset_target(to_earliest, to_latest, to_offset, to_datetime, shift_by)
    selection = parse_topics(topics)
    admin = kofs.admin_client(clients)
    result = _run(lambda: ofs.reset_offsets(admin, app_id, target, selection or None,
                                            execute=not dry_run, timeout=timeout, force=force))
    print_reset(result)


def print_reset(result: ofs.ResetResult) -> None:
    mode = "Executed" if result.executed else "Dry run (nothing changed; add --execute to apply)"
    click.echo(f"{mode}: group {result.group_id}, {result.target}")
    click.echo()
    click.echo(_table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
                      [[r.partition.topic, r.partition.partition, r.current, r.new] for r in result.rows]))
    notes = [r for r in result.rows if r.note]
    if notes:
        click.echo()
        for r in notes:
            how = f"clamped to {r.new}" if r.new != r.requested else f"new offset {r.new}"
            click.echo(f"{r.partition}: {r.note}; {how}")
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if result.executed:
        click.echo()
        click.echo("Committed now:")
        click.echo(_table(["TOPIC", "PARTITION", "CURRENT-OFFSET"],
                          [[p.topic, p.partition, o] for p, o in result.committed_after.items()]))
