"""Importing hwcompile changes nothing: no torch import, no patch, and the layer rule's one exception."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import hwcompile

SOURCE = Path(hwcompile.__file__).resolve().parent


def test_import_does_not_import_torch_or_patch_anything():
    code = ("import sys, hwcompile, hwcompile.testing; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(len(hwcompile.__all__))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(hwcompile.__all__)


def test_public_api_is_exported():
    for name in hwcompile.__all__:
        assert hasattr(hwcompile, name), name
    assert callable(hwcompile.compile) and hwcompile.compile.__module__ == "hwcompile.compiling"


def test_errors_share_one_base_and_the_builtin_kinds():
    assert issubclass(hwcompile.CompileArgumentError, (hwcompile.HwcompileError, ValueError, RuntimeError))
    assert issubclass(hwcompile.LazyModeError, RuntimeError)
    assert issubclass(hwcompile.HpuBackendMissingError, ImportError)
    assert issubclass(hwcompile.PatchError, ValueError)
    for name in ("CompileArgumentError", "LazyModeError", "HpuBackendMissingError", "PatchError"):
        assert issubclass(getattr(hwcompile, name), hwcompile.HwcompileError)


def test_only_gaudi_module_names_the_plugin():
    """The layer-rule exception stays in one file: hwcompile/gaudi.py imports habana_frameworks.torch."""
    pattern = re.compile(r"habana_frameworks|torch\.hpu\b|torch\.xpu\b")
    users = set()
    for path in SOURCE.rglob("*.py"):
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            if pattern.search(code) and not code.strip().startswith(('"""', "'", '"', "`")):
                users.add(path.name)
    assert users <= {"gaudi.py"}, users
