"""`txstream offsets show|reset`: consumer-group offsets in kafka-consumer-groups.sh vocabulary."""
import click


@click.group("offsets")
def offsets() -> None:
    """Show and reset an app's committed offsets (its consumer group)."""
