"""`txstream registry up/down/status`: a local schema registry (txstream/local/registry.py).

Registered per cache directory (TXSTREAM_CACHE_DIR), as local Kafka clusters are: a bare `down`
stops only the registry on the default port, never the others."""
from __future__ import annotations

import click

from txstream.local import registry as local_registry

_PORT_HELP = f"Port of its API on 127.0.0.1 (its management port: PORT+1) [default: {local_registry.DEFAULT_PORT}]."


@click.group()
def registry() -> None:
    """A local schema registry (Apicurio Registry, Confluent's API) from Maven Central."""


@registry.command("up")
@click.option("--port", type=int, default=local_registry.DEFAULT_PORT, show_default=False, help=_PORT_HELP)
def registry_up(port: int) -> None:
    """Start a local schema registry in the background and print its URL (stdout), the value of
    --schema-registry. In-memory: its schemas go when it stops; BACKWARD compatibility by default."""
    try:
        url = local_registry.LocalRegistry(port=port).start(progress=lambda m: click.echo(m, err=True))
    except local_registry.RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(url)


@registry.command("down")
@click.option("--port", type=int, default=None, help=f"Stop the registry on this port [default: "
              f"{local_registry.DEFAULT_PORT}].")
@click.option("--all", "every", is_flag=True, help="Stop every registry registered in this cache directory.")
def registry_down(port: int | None, every: bool) -> None:
    """Stop a local schema registry started with `registry up`. Without --port, the default port's;
    when none runs there but others do, the command names them and stops nothing (exit 1)."""
    if every and port is not None:
        raise click.UsageError("--all and --port exclude each other")
    running = local_registry.registered_registries()
    chosen = running if every else [r for r in running if r.port == (port or local_registry.DEFAULT_PORT)]
    if not chosen:
        if port is None and running and not every:
            raise click.ClickException(
                f"no local schema registry runs on the default port {local_registry.DEFAULT_PORT}; running: "
                + ", ".join(f"{r.url} (--port {r.port})" for r in running) + ". Name one with --port, or --all.")
        click.echo("No local schema registry is running" + ("" if every else f" on port {port or local_registry.DEFAULT_PORT}") + ".",
                   err=True)
        return
    for found in chosen:
        found.stop()
        click.echo(f"Stopped the schema registry at {found.url}", err=True)


@registry.command("status")
def registry_status() -> None:
    """Say which local schema registries run where."""
    running = local_registry.registered_registries()
    if not running:
        click.echo("No local schema registry is running.")
    for found in running:
        click.echo(f"{found.url}  {'answering' if found.answers() else 'starting'}  pid={found.pid}  log={found.log}")
