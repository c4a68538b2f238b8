"""`txstream verify`: audit exactly-once from the topics alone."""
import click


@click.command("verify")
def verify() -> None:
    """Audit an app's output against its input: duplicates and gaps per source partition."""
    raise click.ClickException("not implemented yet")
