"""The graph decoders capture and replay through the platform's graph API on the Gaudi and XPU fakes
(hwenv.testing), whose graph classes record the captured ops and replay them on the same tensors: capture
comes before replay, once per step kind, and the tokens equal the eager loop's. Gaudi captures only in lazy
mode and never compiles there."""

from __future__ import annotations

import hwenv
import hwrun
import pytest
import torch
from hwenv.platforms import get_platform
from hwenv.testing import fake_gaudi, fake_xpu
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.decode.static import GraphDecoder
from hwrun.inference.engine import EngineCore

PROMPT = torch.tensor([[5, 9, 14, 7, 3]])
SAMPLED = SamplingParams(temperature=1.2, top_p=0.9, seed=5)


@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    return hwrun.load(plan)


@pytest.fixture(scope="module")
def eager(loaded):
    model, _ = loaded
    decoder = GraphDecoder(model, max_cache_len=40, use_graphs=False)
    return {sample: decoder.generate(PROMPT, 12, eos_token_id=None, sampling=SAMPLED if sample else None)
            for sample in (False, True)}


def _check_order(events, captures):
    assert events.count("capture_begin") == events.count("capture_end") == captures
    begins = [i for i, e in enumerate(events) if e == "capture_begin"]
    ends = [i for i, e in enumerate(events) if e == "capture_end"]
    replays = [i for i, e in enumerate(events) if e == "replay"]
    assert all(b < e for b, e in zip(begins, ends, strict=True))
    assert replays and replays[0] > ends[0]


@pytest.mark.parametrize("step", ["fused", "model"])
def test_static_decoder_through_hpu_graphs_on_the_gaudi_fake(loaded, eager, step):
    model, _ = loaded
    with fake_gaudi(1, lazy_mode="1") as fake:
        decoder = GraphDecoder(model, max_cache_len=40, step=step, check_every=4, platform=get_platform("hpu"))
        assert decoder.use_graphs and decoder.graph_tools.api == "hpu_graphs"
        greedy = decoder.generate(PROMPT, 12, eos_token_id=None)
        _check_order(fake.graph_events, 1)
        assert fake.graph_events.count("replay") == 11
        sampled = decoder.generate(PROMPT, 12, eos_token_id=None, sampling=SAMPLED)
        _check_order(fake.graph_events, 2)  # a second graph for the sampled step, captured once
        again = decoder.generate(PROMPT, 12, eos_token_id=None)
        assert fake.graph_events.count("capture_begin") == 2  # replayed, not captured again
    assert torch.equal(greedy, eager[False]) and torch.equal(again, eager[False])
    assert torch.equal(sampled, eager[True])


def test_slot_decoder_steps_through_hpu_graphs_on_the_gaudi_fake(loaded, eager):
    model, _ = loaded
    reference = EngineCore(model, slots=2, max_cache_len=40, use_graphs=False)
    reference.add("a", PROMPT[0].tolist(), max_new_tokens=8, eos_token_id=None)
    expected = [reference.step()[0].token_id for _ in range(8)]
    with fake_gaudi(1, lazy_mode="1") as fake:
        decoder = EngineCore(model, slots=2, max_cache_len=40, platform=get_platform("hpu"))
        decoder.start()
        assert fake.graph_events.count("capture_begin") == 4 and "replay" not in fake.graph_events  # 2 row buckets x 2
        decoder.add("a", PROMPT[0].tolist(), max_new_tokens=8, eos_token_id=None)
        tokens = [decoder.step()[0].token_id for _ in range(8)]
        assert fake.graph_events.count("replay") == 8 and fake.graph_events.count("capture_begin") == 4
    assert tokens == expected == eager[False][0, :8].tolist()


def test_gaudi_never_compiles_in_lazy_mode_and_has_no_graphs_in_eager_mode(loaded, eager):
    model, _ = loaded
    with fake_gaudi(1, lazy_mode="1"):
        with pytest.raises(FastDecodeError, match="compile_backend='hpu_backend'.*lazy mode.*PT_HPU_LAZY_MODE=0"):
            GraphDecoder(model, max_cache_len=40, compile_backend="hpu_backend", platform=get_platform("hpu"))
        with pytest.raises(FastDecodeError, match="lazy mode"):
            EngineCore(model, slots=2, max_cache_len=40, compile_backend="hpu_backend", platform=get_platform("hpu"))
    with fake_gaudi(1, lazy_mode="0") as fake:
        decoder = GraphDecoder(model, max_cache_len=40, platform=get_platform("hpu"))
        assert not decoder.use_graphs and decoder.graph_tools is None
        assert torch.equal(decoder.generate(PROMPT, 12, eos_token_id=None), eager[False])
        assert fake.graph_events == []


def test_generate_on_a_gaudi_plan_uses_hpu_graphs_and_drops_compile_in_lazy_mode(loaded, eager):
    model, tokenizer = loaded
    accel = hwenv.Accelerator("hpu", 1, names=("GAUDI2",))
    with fake_gaudi(1, lazy_mode="1") as fake:
        plan = hwrun.plan(hwrun.DEFAULT_MODEL, device=accel, compile=True)
        auto = hwrun.generate(plan, "The king said", 6, model=model, tokenizer=tokenizer)
        assert auto.decode == "generate" and "decode='graphs'" in auto.decode_reason
        result = hwrun.generate(plan, "The king said", 12, decode="graphs", model=model, tokenizer=tokenizer)
        assert result.decode == "graphs" and "hpu_graphs" in result.decode_reason
        assert "not compiled" in result.decode_reason and "lazy mode" in result.decode_reason
        assert "capture_begin" in fake.graph_events and "replay" in fake.graph_events
    reference = hwrun.generate(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), "The king said", 12, decode="generate",
                               model=model, tokenizer=tokenizer)
    assert result.token_ids == reference.token_ids


def test_decoders_through_xpu_graphs_on_the_xpu_fake(loaded, eager):
    model, _ = loaded
    with fake_xpu(1) as fake:
        decoder = GraphDecoder(model, max_cache_len=40, check_every=4, platform=get_platform("xpu"))
        assert decoder.graph_tools.graph_class is torch.xpu.XPUGraph and decoder.graph_tools.capture is torch.xpu.graph
        greedy = decoder.generate(PROMPT, 12, eos_token_id=None)
        sampled = decoder.generate(PROMPT, 12, eos_token_id=None, sampling=SAMPLED)
        _check_order(fake.graph_events, 2)
        slots = EngineCore(model, slots=2, max_cache_len=40, check_every=3, platform=get_platform("xpu"))
        rows = slots.generate([PROMPT[0].tolist(), [2, 7]], 12, eos_token_id=None)
        assert fake.graph_events.count("capture_begin") == 3
    assert torch.equal(greedy, eager[False]) and torch.equal(sampled, eager[True])
    assert rows[0] == eager[False][0].tolist()


def test_generate_reports_the_seconds_its_graphs_took_to_capture_and_only_when_they_were_captured(loaded):
    """`GenerationResult.warmup_seconds`: the part of `seconds` spent capturing hwrun's step graphs in this call
    (issue 38.1: `--timings` says where the first text's time goes); a second call replays them (0), an eager run
    captures nothing (0)."""
    model, tokenizer = loaded
    accel = hwenv.Accelerator("xpu", 1, names=("Intel(R) Data Center GPU Max 1550",))
    with fake_xpu(1) as fake:
        plan = hwrun.plan(hwrun.DEFAULT_MODEL, device=accel)
        first = hwrun.generate(plan, "The king said", 8, decode="graphs", model=model, tokenizer=tokenizer)
        assert fake.graph_events.count("capture_begin") >= 1
        assert 0 < first.warmup_seconds <= first.seconds
        captures = fake.graph_events.count("capture_begin")
        again = hwrun.generate(plan, "The king said", 8, decode="graphs", model=model, tokenizer=tokenizer)
        assert fake.graph_events.count("capture_begin") == captures and again.warmup_seconds == 0
    eager = hwrun.generate(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), "The king said", 8, model=model,
                           tokenizer=tokenizer)
    assert eager.warmup_seconds == 0


def test_the_timings_line_names_the_capture_share_of_the_generate_phase():
    from hwrun.cli.timings import PhaseClock

    clock = PhaseClock()
    clock.mark("generate")
    assert "graph capture and compile 1.25s" in clock.summary(0.5, 1.25)
    assert "first token after 0.50s; graph capture" in clock.summary(0.5, 1.25)
    assert "graph capture" not in clock.summary(0.5, 0.0) and "graph capture" not in clock.summary(None)
