"""`txstream schemas list|show|check|register`: a schema registry's subjects and schemas, through the
client and error types the runs use (txstream/serde/registry.py)."""
from __future__ import annotations

import json
import sys

import click

from txstream.cli.options import registry_options


def _config(url: str | None, properties: dict[str, str]):
    from txstream.serde.registry import RegistryConfig

    if not url:
        raise click.UsageError("--schema-registry URL is required (e.g. the URL `txstream registry up` printed)")
    return RegistryConfig(url, tuple(sorted(properties.items())))


def _run(action):
    """Run `action()`; txstream's errors become one clear line."""
    from txstream.errors import TxstreamError

    try:
        return action()
    except TxstreamError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def schemas() -> None:
    """A schema registry's subjects and schemas (Confluent's API; docs/schemas.md)."""


@schemas.command("list")
@click.argument("subject", required=False)
@registry_options
def schemas_list(subject: str | None, schema_registry_url: str | None, schema_registry_properties: dict) -> None:
    """The registry's subjects, or SUBJECT's versions."""
    from txstream.serde import registry as reg

    config = _config(schema_registry_url, schema_registry_properties)
    client = reg.client(config)
    if subject is None:
        for name in _run(lambda: reg.call(config, "listing subjects", client.get_subjects)):
            click.echo(name)
        return
    try:
        versions = _run(lambda: reg.call(config, f"listing the versions of {subject}", client.get_versions, subject))
    except reg.NotFound:
        raise click.ClickException(f"subject {subject!r} is not in the schema registry at {config.url}") from None
    for version in versions:
        click.echo(version)


@schemas.command("show")
@click.argument("subject")
@click.option("--version", default="latest", show_default=True, help="A version number, or latest.")
@registry_options
def schemas_show(subject: str, version: str, schema_registry_url: str | None, schema_registry_properties: dict) -> None:
    """SUBJECT's schema at --version: its id and version on stderr, the schema (JSON) on stdout."""
    from txstream.serde import registry as reg

    config = _config(schema_registry_url, schema_registry_properties)
    client = reg.client(config)
    fetch = (lambda: client.get_latest_version(subject)) if version == "latest" else \
        (lambda: client.get_version(subject, int(version)))
    if version != "latest" and not version.isdigit():
        raise click.BadParameter("a version number, or latest", param_hint="--version")
    try:
        registered = _run(lambda: reg.call(config, f"version {version} of {subject}", fetch))
    except reg.NotFound:
        raise click.ClickException(f"subject {subject!r} has no version {version} in the schema registry at "
                                   f"{config.url}") from None
    click.echo(f"subject {subject} version {registered.version} id {registered.schema_id}", err=True)
    click.echo(json.dumps(json.loads(registered.schema.schema_str), indent=2))


def _file_schema(path: str):
    """The .avsc as written (checked by fastavro first): its defaults matter to compatibility."""
    from pathlib import Path

    from confluent_kafka.schema_registry import Schema

    from txstream.serde.avro import load_schema

    _run(lambda: load_schema(path))
    return Schema(json.dumps(json.loads(Path(path).read_text())), "AVRO")


def _subject_and_file(command):
    """SUBJECT and SCHEMA_FILE (an .avsc), and the registry's options."""
    command = click.argument("schema_file", type=click.Path(exists=True, dir_okay=False))(registry_options(command))
    return click.argument("subject")(command)


@schemas.command("check")
@_subject_and_file
def schemas_check(subject: str, schema_file: str, schema_registry_url: str | None,
                  schema_registry_properties: dict) -> None:
    """Whether SCHEMA_FILE (an .avsc) may be registered under SUBJECT by its compatibility rule:
    exit 0 when compatible, 1 when not."""
    from txstream.serde import registry as reg

    config = _config(schema_registry_url, schema_registry_properties)
    schema = _file_schema(schema_file)
    try:
        compatible = _run(lambda: reg.call(config, f"the compatibility check under {subject}",
                                           reg.client(config).test_compatibility_all_versions, subject, schema))
    except reg.NotFound:
        click.echo(f"compatible: subject {subject} has no version yet", err=True)
        return
    if not compatible:
        click.echo(f"NOT compatible with subject {subject} under its compatibility rule", err=True)
        sys.exit(1)
    click.echo(f"compatible with subject {subject}", err=True)


@schemas.command("register")
@_subject_and_file
def schemas_register(subject: str, schema_file: str, schema_registry_url: str | None,
                     schema_registry_properties: dict) -> None:
    """Register SCHEMA_FILE under SUBJECT (its id on stdout); a schema the rule refuses is an error."""
    from txstream.serde import registry as reg

    config = _config(schema_registry_url, schema_registry_properties)
    schema_id = _run(lambda: reg.call(config, f"registering under {subject}", reg.client(config).register_schema,
                                      subject, _file_schema(schema_file)))
    click.echo(schema_id)
