"""The device boundary (issue 24, like DeepSpeed's scripts/check-torchcuda.py): outside hwenv's
platform modules no code calls `torch.cuda` / `torch.xpu` / `torch.hpu`, imports `habana_frameworks`,
or compares a device kind to a string literal. A line that must do so says why with
`# platform-boundary: <reason>`; those lines are the allow-list, printed and kept short.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where device calls belong: the platform modules, and the fakes that stand in for the stacks.
EXEMPT = (
    ROOT / "packages/hwenv/src/hwenv/platforms",  # the device layer itself
    ROOT / "packages/hwenv/src/hwenv/testing",  # the fakes replace torch.xpu / torch.hpu / habana_frameworks
)
KIND_LITERALS = frozenset({"hpu", "xpu", "cuda", "rocm", "mps", "cpu"})
DEVICE_MODULES = frozenset({"cuda", "xpu", "hpu"})
MARKER = re.compile(r"#\s*platform-boundary:\s*(\S.{9,})")
PLUGIN_PATH = re.compile(r"^habana_frameworks(\.\w+)*$")
ALLOWED_AT_MOST = 8


def _kind_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in KIND_LITERALS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_kind_literal(element) for element in node.elts)
    return False


def violations(source: str) -> list[tuple[int, str]]:
    """(line, what) for every device-boundary crossing in `source`."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops) and any(
                    _kind_literal(operand) for operand in operands):
                found.append((node.lineno, "compares a device kind to a string literal"))
        elif isinstance(node, ast.Attribute) and node.attr in DEVICE_MODULES and isinstance(node.value, ast.Name) \
                and node.value.id == "torch":
            found.append((node.lineno, f"uses torch.{node.attr}"))
        elif isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "habana_frameworks" for alias in node.names):
            found.append((node.lineno, "imports habana_frameworks"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "habana_frameworks":
            found.append((node.lineno, "imports habana_frameworks"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and PLUGIN_PATH.match(node.value):
            found.append((node.lineno, f"names the Gaudi plugin module {node.value!r}"))
    return sorted(set(found))


def _sources() -> list[Path]:
    files = sorted((ROOT / "packages").glob("*/src/**/*.py"))
    return [path for path in files if not any(path.is_relative_to(exempt) for exempt in EXEMPT)]


def _scan() -> tuple[list[str], list[str]]:
    crossings, allowed = [], []
    for path in _sources():
        lines = path.read_text().splitlines()
        for lineno, what in violations(path.read_text()):
            where = f"{path.relative_to(ROOT)}:{lineno}: {what}"
            match = MARKER.search(lines[lineno - 1])
            (allowed if match else crossings).append(f"{where} ({match.group(1)})" if match else where)
    return crossings, allowed


def test_the_checker_finds_each_kind_of_crossing():
    sample = '''
import habana_frameworks.torch
from habana_frameworks.torch import hpu
import importlib
if accel.kind == "xpu": pass
if kind in ("cuda", "xpu"): pass
if device.type != "cuda": pass
torch.cuda.synchronize()
graph = torch.xpu.XPUGraph()
importlib.import_module("habana_frameworks.torch.core")
backend == "hccl"
print("running on xpu")
'''
    assert [line for line, _ in violations(sample)] == [2, 3, 5, 6, 7, 8, 9, 10]


def test_no_package_crosses_the_device_boundary():
    crossings, _ = _scan()
    assert not crossings, (
        "Device-kind branches and direct device calls belong in hwenv's platforms (ask "
        "`accel.platform` / `hwenv.platforms.runtime`, or a per-package table keyed by kind). "
        "Found:\n  " + "\n  ".join(crossings)
    )


def test_the_allow_list_is_short_and_every_entry_says_why(capsys):
    _, allowed = _scan()
    with capsys.disabled():
        print(f"\nplatform-boundary allow-list ({len(allowed)}):\n  " + "\n  ".join(allowed))
    assert len(allowed) <= ALLOWED_AT_MOST, f"{len(allowed)} allowed crossings; move device facts into the platforms"


@pytest.mark.parametrize("package", ["hwattn", "hwcompile", "hwdist", "hwrun"])
def test_each_package_is_scanned(package):
    assert any(f"packages/{package}/src/" in str(path) for path in _sources())
