"""Options every command that talks to Kafka shares: where Kafka is and how to reach it.

`--bootstrap-servers`, `--command-config FILE` (a Java properties file, as Kafka's own tools take)
and `-X key=value` (repeatable, librdkafka properties; later wins over the file), and
`--client-logs` to see librdkafka's own log lines. The command receives them as one
`clients: KafkaClients` (kafka/config.py), or, with `as_properties=True`, as `bootstrap_servers`
plus a `client_properties` dict (what `txstream run` hands to its settings).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import click

from txstream.kafka.config import KafkaClients, command_properties, show_client_logs

BOOTSTRAP_ENV = "TXSTREAM_BOOTSTRAP_SERVERS"

# One timeout policy for every command that talks to Kafka: each step (first contact, a request,
# the acknowledgements, a stall while reading) waits at most this long, then the command says
# which step did not answer.
DEFAULT_TIMEOUT_S = 30.0
TIMEOUT_HELP = ("Seconds to wait for Kafka at each step (first contact, each request, acknowledgements, "
                "a stall while reading); then the command stops and says which step did not answer.")


def timeout_option(help: str = TIMEOUT_HELP) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--timeout SECONDS`, the same default and words on every command."""
    return click.option("--timeout", type=click.FloatRange(min=0.5), default=DEFAULT_TIMEOUT_S, show_default=True,
                        help=help)


def pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    """KEY=VALUE options (`--conf`, `--config`) as a dict; a malformed one is a usage error."""
    from txstream.kafka.config import parse_pairs

    try:
        return parse_pairs(values, option)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def kafka_options(fn: Callable[..., Any] | None = None, *, as_properties: bool = False,
                  x_help: str = "librdkafka client property (repeatable), e.g. -X security.protocol=SASL_SSL; "
                                "wins over --command-config.") -> Any:
    """Add the shared Kafka options to a click command (usable bare or with arguments)."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, bootstrap_servers: str, command_config: str | None,
                    client_properties: tuple[str, ...], client_logs: bool, **kwargs: Any) -> Any:
            show_client_logs(client_logs)
            try:
                props = command_properties(command_config, client_properties)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="-X/--command-config") from None
            props, registry_props = split_registry_properties(props)
            if registry_props:
                if "schema_registry_config" not in kwargs:
                    raise click.BadParameter(f"{REGISTRY_PREFIX}* properties: this command uses no schema registry",
                                             param_hint="-X")
                kwargs["schema_registry_x"] = registry_props   # for `registry_options`
            if as_properties:
                return command(*args, bootstrap_servers=bootstrap_servers, client_properties=props, **kwargs)
            return command(*args, clients=KafkaClients.from_properties(bootstrap_servers, props), **kwargs)

        options = [
            click.option("-b", "--bootstrap-servers", envvar=BOOTSTRAP_ENV, default="localhost:9092", show_default=True,
                         help=f"Kafka bootstrap servers [env: {BOOTSTRAP_ENV}]."),
            click.option("--command-config", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                         help="Client properties file (key=value lines, as Kafka's tools take), "
                              "e.g. security.protocol, sasl.*, ssl.*."),
            click.option("-X", "client_properties", multiple=True, metavar="KEY=VALUE", help=x_help),
            click.option("--client-logs", is_flag=True, help="Show librdkafka's own log lines on stderr."),
        ]
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate(fn) if fn is not None else decorate


REGISTRY_PREFIX = "schema.registry."


def registry_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--schema-registry URL` and `--schema-registry-config FILE` (SchemaRegistryClient properties,
    key=value lines: basic.auth.user.info, ssl.*, bearer.auth.*); the command receives
    `schema_registry_url` and `schema_registry_properties`, to which a command's
    `-X schema.registry.<property>=...` (split off by `kafka_options`) adds, winning over the file."""
    @functools.wraps(command)
    def wrapper(*args: Any, schema_registry_config: str | None, schema_registry_x: dict[str, str] | None = None,
                **kwargs: Any) -> Any:
        from txstream.kafka.config import load_properties

        try:
            properties = load_properties(schema_registry_config) if schema_registry_config else {}
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--schema-registry-config") from None
        return command(*args, schema_registry_properties={**properties, **(schema_registry_x or {})}, **kwargs)

    wrapper = click.option("--schema-registry-config", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                           help="Schema registry client properties (key=value lines: basic.auth.user.info, "
                                "ssl.*, bearer.auth.*), as confluent-kafka's SchemaRegistryClient names them.")(wrapper)
    return click.option("--schema-registry", "schema_registry_url", metavar="URL", default=None,
                        help="Schema registry (Confluent's API): Avro values framed with schema ids "
                             "(docs/schemas.md).")(wrapper)


def split_registry_properties(properties: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """-X properties split into (Kafka's, the schema registry's: `schema.registry.` taken off)."""
    kafka = {k: v for k, v in properties.items() if not k.startswith(REGISTRY_PREFIX)}
    registry = {k[len(REGISTRY_PREFIX):]: v for k, v in properties.items() if k.startswith(REGISTRY_PREFIX)}
    return kafka, registry
