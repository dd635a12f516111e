"""The `hwrun` command line: `main.py` parses and dispatches (entry point `hwrun.cli.main:main`); each
other module adds one command group (`train`, `serve`, `chat`)."""
