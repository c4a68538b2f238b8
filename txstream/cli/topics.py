"""`txstream topics create|ensure`: set up topics (logic in tools/topics.py)."""
from __future__ import annotations

import click

from txstream.cli.options import kafka_options, pairs, timeout_option
from txstream.kafka.config import KafkaClients


@click.group("topics")
def topics() -> None:
    """Create topics: one by name, or those a processor reads and writes (txstream run never creates
    topics: a typo in a topic name must not quietly start an empty pipeline)."""


@topics.command("create")
@click.argument("name")
@kafka_options
@click.option("--partitions", type=click.IntRange(1), default=None,
              help="Partitions [default: the broker's num.partitions].")
@click.option("--replication-factor", type=click.IntRange(1), default=None,
              help="Replicas of each partition [default: the broker's default.replication.factor].")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config (repeatable).")
@timeout_option()
def create(name: str, clients: KafkaClients, partitions: int | None, replication_factor: int | None,
           configs: tuple[str, ...], timeout: float) -> None:
    """Create topic NAME. A topic that exists as asked is left as it is (exit 0); one that exists
    with other partitions, replication or configs is an error that says how it differs."""
    from txstream.classify import one_line
    from txstream.kafka.lookups import admin_client, cluster_topics
    from txstream.tools import topics as tt

    config = pairs(configs, "--config")
    try:
        admin = admin_client(clients)
        cluster_topics(admin, timeout)   # an unreachable cluster: one clear line after `timeout`
        states = tt.plan(admin, [("topic", name)], partitions, replication_factor, config, timeout)
        created = tt.create(admin, states, timeout)
    except Exception as exc:  # every failure ends as one clear line
        raise click.ClickException(one_line(exc)) from None
    click.echo(f"created topic {name}: {states[0].describe()}" if created
               else f"topic {name} exists as asked: {states[0].describe()}", err=True)


@topics.command("ensure")
@click.argument("processor")
@kafka_options
@click.option("--input", "inputs", multiple=True, help="Input topic (repeatable) [default: the processor's].")
@click.option("--output", help="Output topic [default: the processor's].")
@click.option("--table", "table_topics", multiple=True, metavar="NAME=TOPIC",
              help="The topic of the processor's table NAME (repeatable) [default: its Table's].")
@click.option("--dead-letter-topic", help="Dead-letter topic [default: the processor's].")
@click.option("--partitions", type=click.IntRange(1), default=None,
              help="Partitions of the topics to create [default: the input topic's, else the broker's default].")
@click.option("--replication-factor", type=click.IntRange(1), default=None,
              help="Replication of the topics to create [default: the broker's default].")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="Topic config for the topics to create (repeatable); existing ones must already have it.")
@click.option("--dry-run", is_flag=True, help="Print what would be created; create nothing.")
@timeout_option()
def ensure(processor: str, clients: KafkaClients, inputs: tuple[str, ...], output: str | None,
           table_topics: tuple[str, ...], dead_letter_topic: str | None, partitions: int | None, replication_factor: int | None,
           configs: tuple[str, ...], dry_run: bool, timeout: float) -> None:
    """Create PROCESSOR's input and table topics (when missing; tables compacted), output and
    dead-letter topics.

    Prints the plan first; an existing topic is never changed: if it differs from what is asked
    (partitions, replication, the configs given) the command says how and creates nothing."""
    from txstream import settings as run_settings
    from txstream.classify import one_line
    from txstream.kafka.lookups import admin_client
    from txstream.tools import topics as tt

    try:
        cls = run_settings.load_processor(processor)
        resolved = run_settings.resolve(cls, bootstrap_servers=clients.bootstrap_servers, inputs=list(inputs),
                                        output=output, dead_letter=dead_letter_topic,
                                        table_topics=pairs(table_topics, "--table"))
        admin = admin_client(clients)
        states = tt.plan(admin, tt.declared(resolved.input_topics, resolved.output_topic, resolved.dead_letter_topic,
                                            [t.topic for t in resolved.tables]),
                         partitions, replication_factor, pairs(configs, "--config"), timeout)
        width = max(len(s.name) for s in states)
        for s in states:
            click.echo(f"{s.role:<12} {s.name:<{width}}  {s.action:<7}  {s.describe()}")
        if dry_run:
            differing = [s for s in states if s.differences]
            click.echo("dry run: nothing created" + (f"; {len(differing)} existing topic(s) differ" if differing else ""),
                       err=True)
            if differing:
                raise SystemExit(1)
            return
        created = tt.create(admin, states, timeout)
    except (click.ClickException, SystemExit):
        raise
    except Exception as exc:  # every failure ends as one clear line
        raise click.ClickException(one_line(exc)) from None
    click.echo(f"created {', '.join(created)}" if created else "nothing to create: every topic exists as asked",
               err=True)
