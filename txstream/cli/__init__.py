"""The `txstream` command: one module per command group; `main` is the click group."""
from txstream.cli.main import main

__all__ = ["main"]
