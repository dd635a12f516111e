"""`HWSTACK_COMPILE_CACHE`: the documented opt-out of the persistent compile cache hwrun turns on by default, and a
second `enable_persistent_cache` in one process changing nothing (issue 38.1c)."""

from __future__ import annotations

import pytest
from hwcompile.cache import (
    INDUCTOR_VARIABLE,
    SWITCH_VARIABLE,
    cache_switch,
    enable_persistent_cache,
)
from hwcompile.errors import CompileArgumentError


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("False", False), ("no", False), ("", True),
                                       ("1", True), ("on", True), ("yes", True)])
def test_the_switch_reads_on_and_off(value, on):
    assert cache_switch({SWITCH_VARIABLE: value}) is on
    assert cache_switch({}) is True


def test_a_switch_neither_on_nor_off_is_refused_with_the_value():
    with pytest.raises(CompileArgumentError, match=r"HWSTACK_COMPILE_CACHE='maybe' is neither on nor off"):
        cache_switch({SWITCH_VARIABLE: "maybe"})


def test_off_changes_nothing(tmp_path):
    env = {SWITCH_VARIABLE: "0", "HWSTACK_CACHE_DIR": str(tmp_path)}
    cache = enable_persistent_cache("2.15.0", env)
    assert cache.on is False and "off: HWSTACK_COMPILE_CACHE=0" in cache.reason
    assert env == {SWITCH_VARIABLE: "0", "HWSTACK_CACHE_DIR": str(tmp_path)}
    assert not (tmp_path / "compile").exists()


def test_a_second_call_is_already_on_and_its_undo_keeps_the_first(tmp_path):
    env = {"HWSTACK_CACHE_DIR": str(tmp_path)}
    first = enable_persistent_cache("2.15.0", env)
    second = enable_persistent_cache("2.15.0", env)
    assert first.on and second.on and second.folder == first.folder
    assert "already on in this process" in second.reason
    second.undo()
    assert env[INDUCTOR_VARIABLE] == str(first.folder)
    first.undo()
    assert env == {"HWSTACK_CACHE_DIR": str(tmp_path)}


def _with_graphs(folder):
    (folder / "fxgraph" / "ab").mkdir(parents=True)
    return folder


@pytest.mark.parametrize("set_variable", [False, True])
def test_off_warm_looks_where_a_compile_reads_torchs_folder(tmp_path, monkeypatch, set_variable):
    """Opted out, `persistent_cache_warm` and `enable_persistent_cache` both look at torch's own folder (the
    variable as set, else torch's default), not at a warm hwstack folder the compile would never read."""
    from hwcompile import cache as cache_module

    _with_graphs(tmp_path / "hw" / "compile" / "torch-2.15.0")  # hwstack's folder is warm, but not read
    torchs = tmp_path / "torchs"
    monkeypatch.setattr(cache_module, "torch_default_dir", lambda: torchs)
    env = {SWITCH_VARIABLE: "0", "HWSTACK_CACHE_DIR": str(tmp_path / "hw")}
    if set_variable:
        torchs = tmp_path / "set-by-hand"
        env[INDUCTOR_VARIABLE] = str(torchs)
    assert cache_module.compile_read_dir("2.15.0", env) == torchs
    assert cache_module.persistent_cache_warm("2.15.0", env) is False
    cache = enable_persistent_cache("2.15.0", env)
    assert cache.on is False and cache.folder == torchs and cache.warm is False
    _with_graphs(torchs)
    assert cache_module.persistent_cache_warm("2.15.0", env) is True
    assert enable_persistent_cache("2.15.0", env).warm is True
