"""The `hwrun` command line: `main.py` parses and dispatches, one module per command group."""

from .main import main

__all__ = ["main"]
