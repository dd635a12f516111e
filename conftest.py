"""Suite-wide set-up for `uv run pytest` (issue 40: the README's test command fast on 2 cores, on any machine).

- Bytecode: where the environment says PYTHONDONTWRITEBYTECODE and the venv holds no `.pyc` (`uv sync` without
  UV_COMPILE_BYTECODE, as on this machine), every Python process of the suite (a worker, each CLI subprocess)
  compiled torch's and Transformers' sources again: importing hwrun's CLI, Transformers' model code and PEFT took
  39 s instead of 15 s here (2 cores, load 4). The suite then keeps the bytecode under `.pytest_cache/d/pycache`
  (PYTHONPYCACHEPREFIX, inherited by every subprocess), never beside a source file, as the variable asks.
- pytest-xdist (`-n auto --dist loadgroup` in pyproject's addopts): a test that uses a module- or class-scoped
  fixture is put in its module's group, so each such fixture (a trained run, a launched 2-process job) is built
  once, on one worker; every other test goes to whichever worker is free.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

#: Fixture scopes whose value is shared by the tests of one module (or class): those tests stay on one worker.
SHARED_SCOPES = ("module", "class", "package")


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


def _shares_a_fixture(item: pytest.Item) -> bool:
    """True when `item` uses a fixture whose value its module (or class) shares."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definitions[-1].scope in SHARED_SCOPES for definitions in info.name2fixturedefs.values() if definitions)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
