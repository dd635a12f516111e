"""Every case table of the reliability suite: the `cases_*.py` modules in this folder, loaded by path.

Loaded by path (not as a package) so that pytest and `tools/reliability_doc.py` read the same
tables; a new CLI's cases (e.g. `cases_hwrun.py`) are picked up by their file name alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # so each table's `from reliability_case import Case` resolves

import reliability_case  # noqa: E402


def _load(path: Path):
    name = f"reliability_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def table_files() -> list[Path]:
    """The table modules, in name order (cases_hwdist, cases_hwenv, later cases_hwrun)."""
    return sorted(HERE.glob("cases_*.py"))


def all_cases() -> list:
    """Every `Case` of every table, in table order."""
    cases = []
    for path in table_files():
        cases.extend(_load(path).CASES)
    return cases


def case_module():
    """The `reliability_case` module (CLASSES, EXPECTATIONS, Case)."""
    return reliability_case
