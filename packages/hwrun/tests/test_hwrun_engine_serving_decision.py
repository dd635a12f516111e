"""One decision for hwrun serve (issue 35 point 1, the serve side): what made the slot engine refuse a model at build
time (a sliding window shorter than the context served) is asked by `decide_serving` before anything is built, so
`serve.startup` no longer switches engines on a build error; a slot engine that still fails to build (here: too
little KV memory) stops the start with the reason instead of silently serving with Transformers' engine."""

from __future__ import annotations

import hwrun
import pytest
from hwrun.errors import EngineStartError
from hwrun.inference.decision import decide_serving
from hwrun.inference.engine import slot_step_support
from hwrun.serve import startup
from hwrun.serve.config import ServeConfig
from hwrun.testing.families import build_tiny_family


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_family("llama", tmp_path_factory.mktemp("decision") / "llama")
    plan = hwrun.plan(str(path), device="cpu")
    model, _ = hwrun.load(plan)
    return plan, model


def test_a_window_shorter_than_the_context_is_asked_before_building(tiny, monkeypatch):
    plan, model = tiny
    monkeypatch.setattr(model.config, "sliding_window", 16, raising=False)
    step, why = slot_step_support(model, max_cache_len=64)
    assert step is None and "sliding-window attention (window 16)" in why
    assert slot_step_support(model, max_cache_len=16)[0] is not None  # the window covers the whole context
    with pytest.raises(EngineStartError, match=r"--engine slots cannot serve .*sliding-window attention"):
        decide_serving(plan, model, "slots", max_cache_len=64)
    assert decide_serving(plan, model, "slots", max_cache_len=16).engine == "slots"
    auto = decide_serving(plan, model, "auto", max_cache_len=64)
    assert auto.engine == "transformers" and "sliding-window" in auto.reason


def test_a_slot_engine_that_fails_to_build_stops_the_start_with_its_reason(tiny, monkeypatch):
    plan, model = tiny
    monkeypatch.setattr(startup, "decide_engine", lambda plan, config, model, max_len: decide_serving(
        plan, model, "slots", max_cache_len=max_len, slots=config.max_concurrency))
    monkeypatch.setattr("hwrun.model.load.load", lambda plan: (model, _Tokenizer()))
    config = ServeConfig(max_concurrency=2, max_model_len=64, kv_cache_memory=1000)  # not one block of 16
    with pytest.raises(EngineStartError, match="slot engine cannot start: .*hold no block of 16 positions"):
        startup._build(plan, config)


class _Tokenizer:
    pad_token_id = 0
    eos_token_id = None
