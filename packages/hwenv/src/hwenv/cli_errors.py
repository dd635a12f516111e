"""One-line errors for hwstack's command-line tools: the validation layer every CLI shares.

Every CLI (`hwenv`, `hwdist`, and any later one) parses with `OneLineParser` and runs its
command through `run_command`:
- a usage error (unknown option, bad choice, `--port abc`) is one line on stderr, exit 2;
- an error of the package's own family (`HwenvError`, `HwdistError`, ...) is one line, exit 2;
- `--verbose` adds the traceback above that line;
- anything else is a bug: one line naming its type, exit 1 (the traceback with `--verbose`);
- Ctrl-C exits 130, a closed pipe (`| head`) exits 0, both without a traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

#: Exit status of a bad input (usage or validation), as argparse uses it.
EXIT_BAD_INPUT = 2
#: Exit status of an unexpected failure (a bug): not the user's input.
EXIT_INTERNAL = 1
#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def one_line(text: object) -> str:
    """`text` on one line: every run of whitespace (newlines included) becomes one space."""
    return " ".join(str(text).split())


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line on stderr (and exit 2), naming `--help`.

    Subparsers made with `add_subparsers()` are of this class too (argparse uses `type(self)`).
    """

    def error(self, message: str) -> NoReturn:
        """Print `PROG: error: MESSAGE (see PROG --help)` on one line and exit 2."""
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def add_verbose(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """Add `--verbose` (traceback with errors) to `parser`; sub-commands accept it after their name too."""
    parser.add_argument(
        "--verbose", action="store_true", default=False if top_level else argparse.SUPPRESS,
        help="print the traceback with an error (errors are one line otherwise)",
    )


def run_command(
    label: str,
    function: Callable[[], int],
    expected: tuple[type[BaseException], ...],
    *,
    verbose: bool = False,
) -> int:
    """Run `function` and turn its errors into one line on stderr headed `label: error:`.

    `expected` are the package's error families (bad input): exit 2. Anything else is a bug:
    exit 1 with its type named. `verbose` prints the traceback before the line.
    """
    try:
        return function()
    except expected as error:
        return _report(label, "error", one_line(error), EXIT_BAD_INPUT, verbose)
    except KeyboardInterrupt:
        print(f"{label}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `hwenv doctor --json | head`
        try:
            sys.stderr.close()
        except OSError:  # pragma: no cover
            pass
        return 0
    except Exception as error:  # a bug, not the user's input: still one line unless --verbose
        text = f"{type(error).__name__}: {one_line(error)} (an internal error; rerun with --verbose for the traceback and report it)"
        return _report(label, "internal error", text, EXIT_INTERNAL, verbose)


def _report(label: str, what: str, text: str, code: int, verbose: bool) -> int:
    if verbose:
        traceback.print_exc(file=sys.stderr)
    print(f"{label}: {what}: {text}", file=sys.stderr)
    return code


__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "OneLineParser", "add_verbose", "one_line",
           "run_command"]
