"""`txstream acls PROCESSOR --principal User:NAME`: the ACLs an app's principal needs
(txstream/kafka/acls.py), as `kafka-acls.sh` lines, or created with `--execute`."""
from __future__ import annotations

import click

from txstream.cli.options import kafka_options, timeout_option
from txstream.kafka.config import KafkaClients


@click.command("acls")
@click.argument("processor")
@kafka_options
@click.option("--principal", required=True, help="The app's principal, e.g. User:orders-app.")
@click.option("--app-id", default=None, help="The app id [default: the processor's].")
@click.option("--input", "inputs", multiple=True, help="Input topic (repeatable) [default: the processor's].")
@click.option("--output", help="Output topic [default: the processor's].")
@click.option("--dead-letter-topic", help="Dead-letter topic [default: the processor's].")
@click.option("--guarantee", default=None, help="The run's guarantee [default: the processor's].")
@click.option("--protocol", type=click.Choice(["any", "narrow", "wide", "stateful"]), default="any",
              show_default=True, help="Only what this batch protocol needs (`any`: whatever the run chooses).")
@click.option("--execute", is_flag=True, help="Create the ACLs through the admin API (needs ALTER on the cluster).")
@timeout_option()
def acls(processor: str, clients: KafkaClients, principal: str, app_id: str | None, inputs: tuple[str, ...],
         output: str | None, dead_letter_topic: str | None, guarantee: str | None, protocol: str, execute: bool,
         timeout: float) -> None:
    """The ACLs PROCESSOR's app needs for its principal: one `kafka-acls.sh` line each (stdout), and
    why (stderr); `--execute` creates them."""
    from txstream import settings as run_settings
    from txstream.classify import one_line
    from txstream.kafka import acls as kafka_acls
    from txstream.kafka.lookups import admin_client

    if ":" not in principal:
        raise click.BadParameter("expected TYPE:NAME, e.g. User:orders-app", param_hint="--principal")
    try:
        cls = run_settings.load_processor(processor)
        s = run_settings.resolve(cls, bootstrap_servers=clients.bootstrap_servers, app_id=app_id,
                                 inputs=list(inputs), output=output, dead_letter=dead_letter_topic, guarantee=guarantee)
        needs = kafka_acls.app_needs(s.app_id, s.input_topics, s.output_topic, s.dead_letter_topic, s.guarantee,
                                     protocol)
        for need, line in zip(needs, kafka_acls.kafka_acls_commands(needs, principal, clients.bootstrap_servers),
                              strict=True):
            click.echo(f"# {need.describe()}", err=True)
            click.echo(line)
        if execute:
            kafka_acls.grant(admin_client(clients), needs, principal, timeout)
            click.echo(f"created {sum(len(n.operations) for n in needs)} ACL(s) for {principal}", err=True)
    except click.ClickException:
        raise
    except Exception as exc:  # every failure ends as one clear line
        raise click.ClickException(one_line(exc)) from None
