"""Gaudi device selection: `HABANA_VISIBLE_MODULES` / `_DEVICES`, `hl-smi` mapping, supported groups.

FACTS.md G6-G8. Module IDs are stable across reboots and driver reinstalls; device indices
can change, so a selection is always written as module IDs.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from .errors import GaudiGroupError, HlSmiParseError, PluginMissingError, SelectionError

MODULES_VARIABLE = "HABANA_VISIBLE_MODULES"
DEVICES_VARIABLE = "HABANA_VISIBLE_DEVICES"
INT64_VARIABLE = "PT_ENABLE_INT64_SUPPORT"
LAZY_MODE_VARIABLE = "PT_HPU_LAZY_MODE"
HL_SMI_QUERY = ("hl-smi", "-Q", "index,module_id", "-f", "csv")
SERVER_SIZE = 8

#: Intel's supported module-ID groups for a distributed workload on part of an 8-device
#: server. Source: Intel Gaudi documentation, "Multiple Workloads on a Single Docker"
#: (the "multiple dockers, each with a single workload" table), as recorded in FACTS.md G8.
#: The order inside a group is free (Intel's example mounts HABANA_VISIBLE_MODULES=5,4,7,6).
SUPPORTED_PARTIAL_GROUPS: dict[int, tuple[frozenset[int], ...]] = {
    2: (frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})),
    4: (frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})),
}

PLUGIN_INSTALL_HINT = (
    "Install the Intel Gaudi software stack and its PyTorch package (habana-torch-plugin, "
    "imported as habana_frameworks) from Intel's Gaudi installer; it is not on PyPI. "
    "See https://docs.habana.ai/en/latest/Installation_Guide/"
)


@dataclass(frozen=True)
class HlSmiRow:
    """One row of `hl-smi -Q index,module_id -f csv`: a device index and its module ID."""

    index: int
    module_id: int


def parse_id_list(text: str, variable: str) -> tuple[int, ...]:
    """`"5,4,7,6"` -> `(5, 4, 7, 6)`; bad items, negatives and duplicates raise `SelectionError`."""
    if text is None or str(text).strip() == "":
        raise SelectionError(f"{variable}={text!r} is empty; list ids such as '0,1' or unset it to use every Gaudi.")
    ids: list[int] = []
    for position, item in enumerate(str(text).split(","), start=1):
        item = item.strip()
        if not (item.isascii() and item.isdigit()):
            raise SelectionError(
                f"{variable}={text!r} is invalid: item {position} ({item!r}) is not a non-negative integer id."
            )
        value = int(item)
        if value in ids:
            raise SelectionError(f"{variable}={text!r} lists {value} twice; list each id once.")
        ids.append(value)
    return tuple(ids)


def parse_hl_smi_csv(text: str) -> tuple[HlSmiRow, ...]:
    """Parse `hl-smi -Q index,module_id -f csv` output (header `index, module_id`, rows like `3, 6`).

    Blank lines are skipped; a missing header, a missing column, an extra column, a
    non-numeric or duplicated id is an `HlSmiParseError` naming the line.
    """
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)]
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
        row = HlSmiRow(int(cells[0]), int(cells[1]))
        for other in rows:
            if other.index == row.index or other.module_id == row.module_id:
                raise HlSmiParseError(
                    f"hl-smi output line {number}: {line!r} repeats index {row.index} or module_id "
                    f"{row.module_id} of an earlier row."
                )
        rows.append(row)
    return tuple(rows)


def read_hl_smi() -> tuple[HlSmiRow, ...]:
    """Run `hl-smi -Q index,module_id -f csv` (no shell) and parse it; `PluginMissingError` if absent."""
    executable = shutil.which(HL_SMI_QUERY[0])
    if executable is None:
        raise PluginMissingError(f"hl-smi is not on PATH, so device indices cannot be mapped to module IDs. {PLUGIN_INSTALL_HINT}")
    try:
        result = subprocess.run(
            [executable, *HL_SMI_QUERY[1:]], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise HlSmiParseError(f"running {' '.join(HL_SMI_QUERY)} failed: {error}") from error
    if result.returncode != 0:
        raise HlSmiParseError(
            f"{' '.join(HL_SMI_QUERY)} exited with {result.returncode}: {result.stderr.strip()[:300]}"
        )
    return parse_hl_smi_csv(result.stdout)


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


def check_group(module_ids: tuple[int, ...], server_size: int = SERVER_SIZE) -> None:
    """Raise `GaudiGroupError` unless `module_ids` is the full server or a supported 2/4 group (G8)."""
    group = frozenset(module_ids)
    bad = sorted(m for m in group if m >= server_size)
    if bad:
        raise GaudiGroupError(
            f"Gaudi module ID(s) {bad} do not exist on a {server_size}-device server (IDs 0..{server_size - 1})."
        )
    if len(group) == server_size:
        return
    allowed = SUPPORTED_PARTIAL_GROUPS.get(len(group))
    if allowed is None:
        raise GaudiGroupError(
            f"A group of {len(group)} Gaudi device(s) {sorted(group)} is not supported on part of a server: "
            f"Intel supports groups of 2 or 4 devices (or all {server_size}). {supported_groups_text()}"
        )
    if group not in allowed:
        raise GaudiGroupError(
            f"Gaudi module IDs {sorted(group)} are not a supported {len(group)}-device group. "
            f"{supported_groups_text()}"
        )


def supported_groups_text() -> str:
    """The supported partial-server groups, as one readable sentence."""
    parts = []
    for size, groups in SUPPORTED_PARTIAL_GROUPS.items():
        listed = " or ".join("{" + ",".join(str(m) for m in sorted(g)) + "}" for g in groups)
        parts.append(f"{size} devices: {listed}")
    return "Supported module-ID groups: " + "; ".join(parts) + " (order inside a group is free)."
