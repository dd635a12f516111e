"""The persistent compile cache is on wherever hwrun compiles a decode step (issue 38.1c): `generate()` with a
compiled plan and `hwrun serve --compile` point torch's caches at hwcompile's folder before building the decoder,
not only `hwrun generate --compile`; `HWSTACK_COMPILE_CACHE=0` leaves torch's folders alone; nothing at import."""

from __future__ import annotations

import os
import subprocess
import sys

import hwenv
import hwrun
import pytest
from hwcompile.cache import INDUCTOR_VARIABLE, TRITON_VARIABLE, compile_cache_dir
from hwrun.inference import engine as engine_package
from hwrun.inference.decision import compile_cache, decide_serving
from hwrun.serve.config import ServeConfig


@pytest.fixture
def clean_cache_env(monkeypatch, tmp_path):
    """No compile-cache variables set, HWSTACK_CACHE_DIR in tmp_path; all restored after the test."""
    for name in (INDUCTOR_VARIABLE, TRITON_VARIABLE, "HWSTACK_COMPILE_CACHE"):
        monkeypatch.setenv(name, "recorded")  # so monkeypatch restores what the code under test sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("HWSTACK_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def loaded():
    return hwrun.load(hwrun.plan(device="cpu"))


def _ours() -> str:
    import torch

    return str(compile_cache_dir(torch.__version__))


def test_generate_with_a_compiled_step_turns_the_cache_on(clean_cache_env, loaded):
    model, tokenizer = loaded
    plan = hwrun.plan(device="cpu", compile="eager")
    result = hwrun.generate(plan, "The king said", 3, decode="graphs", model=model, tokenizer=tokenizer)
    assert result.decode == "graphs"
    assert os.environ[INDUCTOR_VARIABLE] == _ours() and _ours().startswith(str(clean_cache_env))
    assert os.environ[TRITON_VARIABLE] == os.path.join(_ours(), "triton")


def test_generate_without_compile_leaves_torchs_folders(clean_cache_env, loaded):
    model, tokenizer = loaded
    hwrun.generate(hwrun.plan(device="cpu"), "The king said", 3, decode="graphs", model=model, tokenizer=tokenizer)
    assert INDUCTOR_VARIABLE not in os.environ


def test_the_opt_out_keeps_torchs_folders(clean_cache_env, loaded, monkeypatch):
    model, tokenizer = loaded
    monkeypatch.setenv("HWSTACK_COMPILE_CACHE", "0")
    plan = hwrun.plan(device="cpu", compile="eager")
    hwrun.generate(plan, "The king said", 3, decode="graphs", model=model, tokenizer=tokenizer)
    assert INDUCTOR_VARIABLE not in os.environ and TRITON_VARIABLE not in os.environ


def test_serve_with_compile_turns_the_cache_on_before_building(clean_cache_env, loaded, monkeypatch):
    from hwrun.serve.startup import _slots_backend

    model, _ = loaded
    plan = hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)), compile=True)
    decision = decide_serving(plan, model, slots=2, max_cache_len=64)
    assert decision.compile_backend is not None
    seen = []

    class Recording:
        def __init__(self, model, **kwargs):
            seen.append(os.environ.get(INDUCTOR_VARIABLE))
            raise RuntimeError("built")

    monkeypatch.setattr(engine_package, "EngineCore", Recording)
    with pytest.raises(RuntimeError, match="built"):
        _slots_backend(plan, model, ServeConfig(max_concurrency=2), decision, 64)
    assert seen == [_ours()]


def test_compile_cache_is_idempotent_and_only_for_compiled_graph_decode(clean_cache_env, loaded):
    model, _ = loaded
    compiled = decide_serving(hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)), compile=True),
                              model, slots=2, max_cache_len=64)
    first = compile_cache(compiled)
    second = compile_cache(compiled)
    assert first.folder == second.folder and "already on in this process" in second.reason
    second.undo()
    assert os.environ[INDUCTOR_VARIABLE] == _ours()  # the second call set nothing, so its undo restores nothing
    first.undo()
    assert INDUCTOR_VARIABLE not in os.environ
    assert compile_cache(decide_serving(hwrun.plan(device="cpu"), model)) is None  # Transformers' engine


def test_importing_hwrun_and_hwcompile_sets_no_cache_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (INDUCTOR_VARIABLE, TRITON_VARIABLE)}
    code = ("import os, hwrun, hwcompile, hwrun.inference.decision, hwrun.inference.generate, hwrun.serve.startup; "
            f"print(os.environ.get({INDUCTOR_VARIABLE!r}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "None"
