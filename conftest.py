"""Suite-wide set-up for `uv run pytest` (issue 40: the README's test command fast on 2 cores, on any machine).

- Bytecode: where the environment says PYTHONDONTWRITEBYTECODE and the venv holds no `.pyc` (`uv sync` without
  UV_COMPILE_BYTECODE, as on this machine), every Python process of the suite (a worker, each CLI subprocess)
  compiled torch's and Transformers' sources again: importing hwrun's CLI, Transformers' model code and PEFT took
  39 s instead of 15 s here (2 cores, load 4). The suite then keeps the bytecode under `.pytest_cache/d/pycache`
  (PYTHONPYCACHEPREFIX, inherited by every subprocess), never beside a source file, as the variable asks.
  Since the workspace sets uv's `compile-bytecode = true`, `uv run` compiles the venv and this stays inert; it
  still serves a venv made otherwise (`uv sync` of an older checkout, `pip install`).
- pytest-xdist runs with `--dist loadscope` (pyproject's addopts): a module's tests stay on one worker, so a
  module-scoped fixture (a trained run, a launched 2-process job) is built once. (`loadgroup` with xdist_group
  marks per fixture does nothing with pytest 9.2 and xdist 3.8: xdist sets `item._nodeid`, which pytest 9.2 no
  longer reads, so each worker built such a fixture again: the ZeRO runs twice, 143 s and 156 s.)
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest


def _venv_has_bytecode() -> bool:
    """True when the installed torch (the largest import of the suite) was compiled at install."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return True  # nothing to gain
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def _keep_bytecode(config: pytest.Config) -> None:
    """Point this process and its subprocesses at one bytecode folder outside the sources (see the module doc)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX") or _venv_has_bytecode():
        return
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    folder = cache.mkdir("pycache") if cache is not None else Path(tempfile.gettempdir()) / f"hwstack-pycache-{os.getuid()}"
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    _keep_bytecode(config)


#: Device-selection and mode variables that code under test may set in os.environ (hwrun's plan applies its env;
#: the Gaudi fake reads PT_HPU_LAZY_MODE): each test gets them back as they were, so none leaks into the next test
#: of the same xdist worker (a PT_HPU_LAZY_MODE=1 left behind failed an unrelated hwcompile test on 2026-12-06).
_DEVICE_VARIABLES = ("PT_HPU_LAZY_MODE", "PT_ENABLE_INT64_SUPPORT", "HABANA_VISIBLE_MODULES", "HLS_MODULE_ID",
                     "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER", "ZE_FLAT_DEVICE_HIERARCHY", "HWENV_DEVICE")


@pytest.fixture(autouse=True)
def _restore_device_variables():
    import os

    saved = {name: os.environ.get(name) for name in _DEVICE_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
