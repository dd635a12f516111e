"""The persistent compile cache (issue 29 point 4): explicit, idempotent, reversible, and really reused by torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from hwcompile.cache import (
    INDUCTOR_VARIABLE,
    TRITON_VARIABLE,
    cache_root,
    compile_cache_dir,
    enable_persistent_cache,
)


def test_cache_root_follows_the_variables(tmp_path):
    assert cache_root({"HWSTACK_CACHE_DIR": str(tmp_path / "x")}) == tmp_path / "x"
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "hwstack"
    assert compile_cache_dir("2.15.0+cu130", {"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "hwstack" / "compile" / "torch-2.15.0_cu130")


def test_enable_sets_both_folders_and_undo_restores(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    cache = enable_persistent_cache("2.15.0", env)
    assert env[INDUCTOR_VARIABLE] == str(cache.folder) and env[TRITON_VARIABLE] == str(cache.folder / "triton")
    assert cache.folder.is_dir() and not cache.warm and "cold" in cache.reason
    again = enable_persistent_cache("2.15.0", env)  # idempotent: the folder is now the user's setting, kept
    assert again.folder == cache.folder and env[INDUCTOR_VARIABLE] == str(cache.folder)
    again.undo()
    cache.undo()
    cache.undo()  # a second undo does nothing
    assert env == {"XDG_CACHE_HOME": str(tmp_path)}


def test_a_folder_the_user_chose_is_kept(tmp_path):
    env = {INDUCTOR_VARIABLE: str(tmp_path / "mine")}
    cache = enable_persistent_cache("2.15.0", env)
    assert cache.folder == tmp_path / "mine" and "yours, kept" in cache.reason
    cache.undo()
    assert env == {INDUCTOR_VARIABLE: str(tmp_path / "mine")}


def test_torchs_own_default_in_the_variable_is_replaced(tmp_path):
    from hwcompile.cache import torch_default_dir

    env = {INDUCTOR_VARIABLE: str(torch_default_dir()), "HWSTACK_CACHE_DIR": str(tmp_path)}
    cache = enable_persistent_cache("2.15.0", env)
    assert env[INDUCTOR_VARIABLE] == str(tmp_path / "compile" / "torch-2.15.0")
    cache.undo()
    assert env[INDUCTOR_VARIABLE] == str(torch_default_dir())


def test_an_uncreatable_folder_keeps_torchs_default(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {"HWSTACK_CACHE_DIR": str(blocker)}
    cache = enable_persistent_cache("2.15.0", env)
    assert INDUCTOR_VARIABLE not in env and "could not create" in cache.reason


def test_a_second_process_reads_the_compiled_graph_back(tmp_path):
    """Cold then warm in two fresh processes: the second finds graphs and takes an FX-graph cache hit."""
    script = textwrap.dedent("""
        import json, os, sys
        from hwcompile.cache import enable_persistent_cache
        cache = enable_persistent_cache()
        import torch
        from torch._dynamo.utils import counters
        f = torch.compile(lambda x: (x.sin() * 2 + 1).relu(), backend="inductor")
        f(torch.randn(16))
        print(json.dumps({"warm": cache.warm, "hits": counters["inductor"]["fxgraph_cache_hit"],
                          "folder": str(cache.folder)}))
    """)
    env = {**__import__("os").environ, "HWSTACK_CACHE_DIR": str(tmp_path)}
    env.pop(INDUCTOR_VARIABLE, None)
    env.pop(TRITON_VARIABLE, None)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["warm"] is False and runs[0]["hits"] == 0
    assert runs[1]["warm"] is True and runs[1]["hits"] >= 1
    assert runs[0]["folder"].startswith(str(tmp_path))


def test_torchs_default_in_the_variable_warm_looks_where_enable_points(tmp_path, monkeypatch):
    """torch wrote its /tmp default into the variable: `persistent_cache_warm` and `enable_persistent_cache` both
    take it as unset and look at hwstack's folder (a warm /tmp is not what the compile will read)."""
    from hwcompile import cache as cache_module

    torchs = tmp_path / "torchinductor_me"
    (torchs / "fxgraph" / "ab").mkdir(parents=True)  # torch's /tmp default is warm
    monkeypatch.setattr(cache_module, "torch_default_dir", lambda: torchs)
    env = {INDUCTOR_VARIABLE: str(torchs), "HWSTACK_CACHE_DIR": str(tmp_path / "hw")}
    ours = tmp_path / "hw" / "compile" / "torch-2.15.0"
    assert cache_module.compile_read_dir("2.15.0", env) == ours
    assert cache_module.persistent_cache_warm("2.15.0", env) is False
    cache = enable_persistent_cache("2.15.0", env)
    assert cache.folder == ours and cache.warm is False and env[INDUCTOR_VARIABLE] == str(ours)
    cache.undo()
    (ours / "aotautograd" / "cd").mkdir(parents=True)
    assert cache_module.persistent_cache_warm("2.15.0", env) is True
    again = enable_persistent_cache("2.15.0", env)
    assert again.folder == ours and again.warm is True
    again.undo()
