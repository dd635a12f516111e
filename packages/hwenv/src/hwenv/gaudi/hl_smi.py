"""`hl-smi -Q index,module_id -f csv`: reading it and mapping device indices to module IDs (G7, S10)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ..errors import HlSmiParseError, PluginMissingError, SelectionError
from .groups import SERVER_SIZE
from .variables import PLUGIN_INSTALL_HINT

HL_SMI_QUERY = ("hl-smi", "-Q", "index,module_id", "-f", "csv")
#: Digits an id may have: far above any device index, and below int()'s 4,300-digit refusal (a ValueError).
MAX_ID_DIGITS = 6


@dataclass(frozen=True)
class HlSmiRow:
    """One row of `hl-smi -Q index,module_id -f csv`: a device index and its module ID."""

    index: int
    module_id: int


def parse_hl_smi_csv(text: str) -> tuple[HlSmiRow, ...]:
    """Parse `hl-smi -Q index,module_id -f csv` output (header `index, module_id`, rows like `3, 6`).

    Blank lines and a leading byte-order mark are skipped; a missing header, a header without rows (no
    Gaudi listed), a missing column, an extra column, a non-numeric, over-long or duplicated id, or a module
    ID past the server's 0..7 is an `HlSmiParseError` naming the line.
    """
    lines = [(number, line.strip()) for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1)]
    lines = [(number, line) for number, line in lines if line]
    if not lines:
        raise HlSmiParseError("hl-smi output is empty: expected a header 'index, module_id' and one row per Gaudi.")
    header_number, header = lines[0]
    columns = [column.strip() for column in header.split(",")]
    if columns != ["index", "module_id"]:
        raise HlSmiParseError(
            f"hl-smi output line {header_number}: header is {header!r}, expected 'index, module_id' "
            f"(run {' '.join(HL_SMI_QUERY)})."
        )
    rows: list[HlSmiRow] = []
    for number, line in lines[1:]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 2 or "" in cells:
            raise HlSmiParseError(
                f"hl-smi output line {number}: {line!r} has {len([c for c in cells if c])} value(s); "
                f"expected 2 (index, module_id)."
            )
        for name, cell in zip(("index", "module_id"), cells, strict=True):
            if not (cell.isascii() and cell.isdigit()):
                raise HlSmiParseError(f"hl-smi output line {number}: {name} {cell!r} is not a non-negative integer.")
            if len(cell) > MAX_ID_DIGITS:
                raise HlSmiParseError(f"hl-smi output line {number}: {name} {cell[:12]}... has {len(cell)} digits; "
                                      f"an id has at most {MAX_ID_DIGITS}.")
        row = HlSmiRow(int(cells[0]), int(cells[1]))
        if row.module_id >= SERVER_SIZE:
            raise HlSmiParseError(
                f"hl-smi output line {number}: module_id {row.module_id} does not exist on a {SERVER_SIZE}-device "
                f"server (module IDs 0..{SERVER_SIZE - 1}); is this hl-smi's output for -Q index,module_id?")
        for other in rows:
            if other.index == row.index or other.module_id == row.module_id:
                raise HlSmiParseError(
                    f"hl-smi output line {number}: {line!r} repeats index {row.index} or module_id "
                    f"{row.module_id} of an earlier row."
                )
        rows.append(row)
    if not rows:
        raise HlSmiParseError(
            "hl-smi output has the header but no rows: it lists no Gaudi, so no device index maps to a module ID. "
            "Run `hl-smi` to see whether the driver sees the cards (in a container: were they mounted?).")
    return tuple(rows)


def read_hl_smi() -> tuple[HlSmiRow, ...]:
    """Run `hl-smi -Q index,module_id -f csv` (no shell) and parse it; `PluginMissingError` if absent."""
    executable = shutil.which(HL_SMI_QUERY[0])
    if executable is None:
        raise PluginMissingError(f"hl-smi is not on PATH, so device indices cannot be mapped to module IDs. {PLUGIN_INSTALL_HINT}")
    try:
        result = subprocess.run([executable, *HL_SMI_QUERY[1:]], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise HlSmiParseError(f"running {' '.join(HL_SMI_QUERY)} failed: {error}") from error
    # bytes, decoded here: text=True raised UnicodeDecodeError from inside subprocess on a non-UTF-8 byte
    stdout, stderr = (stream.decode("utf-8", "replace") for stream in (result.stdout, result.stderr))
    if result.returncode != 0:
        raise HlSmiParseError(f"{' '.join(HL_SMI_QUERY)} exited with {result.returncode}: {_exit_reason(stdout, stderr)}")
    return parse_hl_smi_csv(stdout)


def _exit_reason(stdout: str, stderr: str) -> str:
    """What a failed hl-smi said: its stderr, else its stdout (hl-smi prints some errors there), else that it said
    nothing, with the fix."""
    said = stderr.strip() or stdout.strip()
    if said:
        return said[-300:]
    return ("it printed nothing. Run `hl-smi` alone to see whether the habanalabs driver is loaded and sees the cards "
            "(in a container: were the devices mounted?).")


def index_to_module(rows: tuple[HlSmiRow, ...]) -> dict[int, int]:
    """Map device index -> module ID."""
    return {row.index: row.module_id for row in rows}


def module_to_index(rows: tuple[HlSmiRow, ...]) -> dict[int, int]:
    """Map module ID -> device index."""
    return {row.module_id: row.index for row in rows}


def indices_to_modules(indices: tuple[int, ...], rows: tuple[HlSmiRow, ...]) -> tuple[int, ...]:
    """Translate device indices to module IDs with the hl-smi mapping; unknown indices raise."""
    mapping = index_to_module(rows)
    missing = [index for index in indices if index not in mapping]
    if missing:
        raise SelectionError(
            f"Gaudi device index(es) {missing} are not in hl-smi's list (indices {sorted(mapping)})."
        )
    return tuple(mapping[index] for index in indices)


