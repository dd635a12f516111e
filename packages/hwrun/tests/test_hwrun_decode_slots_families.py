"""Any family through hwrun's engine (issue 26 point 3): `EngineCore(step="model")` runs the model's own forward
for every slot at once over a per-row slot cache, so requests of different lengths join mid-run, leave, and are
cancelled, and each gets `model.generate(do_sample=False)`'s tokens; the fused Llama step is an optimisation on
top (same tokens); the model step captures on the graph fakes; generate() and the server pick slots for a
non-Llama family; what neither step runs gets a reason and keeps Transformers' loop."""

from __future__ import annotations

import importlib

import hwenv
import hwrun
import pytest
import torch
from hwenv.platforms import get_platform
from hwenv.testing import fake_gaudi, fake_xpu
from hwrun.errors import EngineStartError, FastDecodeError, GenerateError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.decode.slot_cache import model_step_support
from hwrun.inference.engine import EngineCore, TokenEvent, slot_step_support
from hwrun.testing.families import build_tiny_family

generate_module = importlib.import_module("hwrun.inference.generate")  # the module, not hwrun.generate()

#: Families the static decoder's model step runs (test_hwrun_decode_families.py), plus more of the matrix.
FAMILIES = ("gpt2", "qwen3", "phi3", "gpt_neox", "mistral", "gemma", "olmo2", "phi", "qwen3_moe")
#: Prompts of different lengths (token ids inside every tiny family's vocabulary).
PROMPTS = [[5, 9, 14], [40, 41, 42, 43, 44, 45, 46, 47, 48], [2, 7, 11, 13, 17], [99]]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("slot_families")
    first = build_tiny_family(FAMILIES[0], root / FAMILIES[0])
    dirs = {FAMILIES[0]: first}
    for name in (*FAMILIES[1:], "stablelm", "gemma3_text"):
        dirs[name] = build_tiny_family(name, root / name, tokenizer_source=first)
    return dirs


def _load(family_dirs, family, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(family_dirs[family], local_files_only=True, **kwargs).eval()


def _reference(model, ids, n):
    """Greedy `model.generate` for one unpadded prompt: stops after the model's EOS, as the decoder does."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _collect(events, streams, reasons):
    for event in events:
        assert isinstance(event, TokenEvent)
        streams.setdefault(event.request_id, []).append(event.token_id)
        if event.finished:
            reasons[event.request_id] = event.finish_reason


def _drain(decoder, streams, reasons, limit=200):
    for _ in range(limit):
        if not decoder.active:
            return
        _collect(decoder.step(), streams, reasons)
    raise AssertionError("requests never finished")


@pytest.mark.parametrize("family", FAMILIES)
def test_model_step_gives_generates_tokens_as_requests_join_and_leave(family_dirs, family):
    model = _load(family_dirs, family)
    decoder = EngineCore(model, slots=2, max_cache_len=32, step="model")
    assert decoder.step_name == decoder.runner.step.name == "model"
    streams: dict = {}
    reasons: dict = {}
    decoder.add("a", PROMPTS[0], max_new_tokens=9)
    _collect(decoder.step() + decoder.step(), streams, reasons)  # "a" alone for two steps
    decoder.add("b", PROMPTS[1], max_new_tokens=6)  # a longer prompt joins mid-run, into the other row
    _collect(decoder.step(), streams, reasons)
    _drain(decoder, streams, reasons)
    decoder.add("c", PROMPTS[2], max_new_tokens=7)  # a freed row takes a third prompt
    _drain(decoder, streams, reasons)
    for request, prompt, n in (("a", PROMPTS[0], 9), ("b", PROMPTS[1], 6), ("c", PROMPTS[2], 7)):
        assert streams[request] == _reference(model, prompt, n), request
        eos = model.generation_config.eos_token_id
        assert reasons[request] == ("stop" if streams[request][-1] == eos else "length")
    assert decoder.free_slots == 2 and decoder.active == set()


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_whole_batch_generate_admits_waiting_prompts_into_freed_rows(family_dirs, family):
    model = _load(family_dirs, family)
    decoder = EngineCore(model, slots=3, max_cache_len=32, step="model", check_every=3, prefill_tokens=20)
    rows = decoder.generate(PROMPTS, [8, 5, 6, 9])
    assert rows == [_reference(model, p, n) for p, n in zip(PROMPTS, [8, 5, 6, 9], strict=True)]
    # prompts 0 and 1 left-padded into one prefill (2 x 9 <= 20 tokens), prompt 2 alone, prompt 3 once a row frees
    assert decoder.prefills == 3


def test_cancel_frees_a_row_that_a_new_request_reuses(family_dirs):
    model = _load(family_dirs, "qwen3")
    decoder = EngineCore(model, slots=2, max_cache_len=32, step="model")
    streams: dict = {}
    reasons: dict = {}
    decoder.add("x", PROMPTS[1], max_new_tokens=20, eos_token_id=None)
    decoder.add("y", PROMPTS[0], max_new_tokens=8)
    _collect(decoder.step() + decoder.step(), streams, reasons)
    decoder.cancel("x")
    assert decoder.active == {"y"} and decoder.free_slots == 1
    _collect(decoder.step(), streams, reasons)
    decoder.add("z", PROMPTS[3], max_new_tokens=6)  # x's row, while y is mid-run
    assert decoder.free_slots == 0
    _drain(decoder, streams, reasons)
    assert streams["y"] == _reference(model, PROMPTS[0], 8) and streams["z"] == _reference(model, PROMPTS[3], 6)
    assert len(streams["x"]) == 2 and "x" not in reasons and decoder.free_slots == 2
    with pytest.raises(FastDecodeError, match="request_id='x' is not active"):
        decoder.cancel("x")


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(family_dirs):
    model = _load(family_dirs, "gpt2")
    params = SamplingParams(temperature=1.3, top_p=0.9, top_k=40, seed=7)

    def run(others):
        decoder = EngineCore(model, slots=4, max_cache_len=32, step="model")
        for index, other in enumerate(others):  # the others first: the sampled request gets another row
            decoder.add(f"o{index}", PROMPTS[other], max_new_tokens=9, eos_token_id=None,
                        sampling=SamplingParams(temperature=1.0, seed=index))
        decoder.add("s", PROMPTS[2], max_new_tokens=10, eos_token_id=None, sampling=params)
        streams: dict = {}
        _drain(decoder, streams, {})
        return streams

    alone, beside = run([]), run([0, 1, 3])
    assert alone["s"] == beside["s"] and len(alone["s"]) == 10
    greedy = EngineCore(model, slots=1, max_cache_len=32, step="model").generate([PROMPTS[2]], 10, eos_token_id=None)
    assert alone["s"] != greedy[0]  # it did sample
    # the whole-batch API samples each prompt as it would alone, too
    rows = EngineCore(model, slots=3, max_cache_len=32, step="model").generate(
        [PROMPTS[2], PROMPTS[0], PROMPTS[1]], 10, eos_token_id=None, sampling=params)
    assert rows[0] == alone["s"]


def test_eager_attention_takes_the_additive_mask(family_dirs):
    model = _load(family_dirs, "gpt2", attn_implementation="eager")
    decoder = EngineCore(model, slots=2, max_cache_len=32, step="model")
    assert decoder.runner.step.attention == "eager"
    assert decoder.generate(PROMPTS[:3], 7) == [_reference(model, p, 7) for p in PROMPTS[:3]]


@pytest.fixture(scope="module")
def llama():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    return hwrun.load(plan)


def test_the_llama_model_gives_the_same_tokens_with_either_step(llama):
    model, tokenizer = llama
    prompts = [tokenizer(p)["input_ids"] for p in ("The king said", "Once upon a time there was a little house",
                                                   "It was")]
    fused = EngineCore(model, slots=2, max_cache_len=48, step="fused")
    own = EngineCore(model, slots=2, max_cache_len=48, step="model")
    auto = EngineCore(model, slots=2, max_cache_len=48)
    assert (fused.step_name, own.step_name, auto.step_name) == ("fused", "model", "fused")
    assert "step='model' given" in own.step_reason
    greedy = fused.generate(prompts, 10)
    assert own.generate(prompts, 10) == greedy == [_reference(model, p, 10) for p in prompts]
    sampled = SamplingParams(temperature=0.9, top_p=0.95, seed=3)
    assert own.generate(prompts, 10, eos_token_id=None, sampling=sampled) == \
        fused.generate(prompts, 10, eos_token_id=None, sampling=sampled)


def test_the_model_step_compiles(llama):
    model, _ = llama
    prompts = [[5, 9, 14, 7, 3], [2, 7]]
    eager = EngineCore(model, slots=2, max_cache_len=24, step="model").generate(prompts, 6, eos_token_id=None)
    compiled = EngineCore(model, slots=2, max_cache_len=24, step="model", compile_backend="eager")
    compiled.start(sampling=False)
    assert compiled.generate(prompts, 6, eos_token_id=None) == eager


def test_the_model_step_captures_and_replays_on_the_graph_fakes(family_dirs):
    model = _load(family_dirs, "gpt2")
    prompt = PROMPTS[2]
    eager = EngineCore(model, slots=2, max_cache_len=32, step="model", use_graphs=False)
    eager.add("a", prompt, max_new_tokens=8, eos_token_id=None)
    expected = [eager.step()[0].token_id for _ in range(8)]
    with fake_gaudi(1, lazy_mode="1") as fake:
        decoder = EngineCore(model, slots=2, max_cache_len=32, platform=get_platform("hpu"))
        assert decoder.step_name == "model" and decoder.use_graphs
        decoder.start()  # the greedy and the sampled step of each bucket (1 and 2 rows), before any request
        assert fake.graph_events.count("capture_begin") == 4 and "replay" not in fake.graph_events
        assert sorted(decoder.graphs) == [(False, 1, 32), (False, 2, 32), (True, 1, 32), (True, 2, 32)]
        decoder.add("a", prompt, max_new_tokens=8, eos_token_id=None)
        tokens = [decoder.step()[0].token_id for _ in range(8)]
        assert fake.graph_events.count("replay") == 8 and fake.graph_events.count("capture_begin") == 4
        assert decoder.last_rows == 1  # one request: the one-row graph
    assert tokens == expected
    sampled = SamplingParams(temperature=1.2, seed=5)
    want = EngineCore(model, slots=2, max_cache_len=32, step="model", use_graphs=False).generate(
        [prompt, PROMPTS[0]], 8, eos_token_id=None, sampling=sampled)
    with fake_xpu(1) as fake:
        decoder = EngineCore(model, slots=2, max_cache_len=32, check_every=3, platform=get_platform("xpu"))
        rows = decoder.generate([prompt, PROMPTS[0]], 8, eos_token_id=None)
        got = decoder.generate([prompt, PROMPTS[0]], 8, eos_token_id=None, sampling=sampled)
        assert fake.graph_events.count("capture_begin") == 2 and fake.graph_events.count("replay") > 0
    assert rows[0] == expected and got == want


def test_generate_continuous_graphs_runs_the_slot_decoder_for_another_family(family_dirs):
    plan = hwrun.plan(str(family_dirs["phi3"]), device="cpu")
    model, tokenizer = hwrun.load(plan)
    prompts = ["The king said", "Once upon a time there was a little house", "It was"]
    result = hwrun.generate(plan, prompts, 8, decode="graphs", batching="continuous", model=model,
                            tokenizer=tokenizer)
    assert result.decode == "graphs" and result.batching == "continuous"
    assert "step: the model's own forward over a per-row slot cache" in result.decode_reason
    decoders = [d for d in generate_module.decoders_of(model).values() if isinstance(d, EngineCore)]
    assert len(decoders) == 1 and decoders[0].step_name == "model"
    assert result.token_ids == [_reference(model, tokenizer(p)["input_ids"], 8) for p in prompts]


def test_the_server_picks_slots_for_another_family(family_dirs):
    from hwrun.inference.decision import decide_serving, engine_blockers

    cuda = hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)))
    gaudi = hwrun.plan(device=hwenv.Accelerator("hpu", 1, memory=(96 * 2**30,)))
    gpt2 = _load(family_dirs, "gpt2")
    assert engine_blockers(cuda, gpt2) == []
    choice = decide_serving(cuda, gpt2, "auto")
    assert choice.engine == "slots" and "CUDA graph" in choice.reason
    assert "step: the model's own forward over a per-row slot cache" in choice.reason
    choice = decide_serving(gaudi, gpt2, "auto")  # HPU graphs; Transformers' batching does not run on Gaudi
    assert choice.engine == "slots" and "one HPU graph replay per step" in choice.reason
    stablelm = _load(family_dirs, "stablelm")  # computes attention itself: neither engine runs it
    assert "is_backend_compatible() is False" in engine_blockers(cuda, stablelm)[0]
    with pytest.raises(EngineStartError, match="--engine slots cannot serve this model.*is_backend_compatible"):
        decide_serving(cuda, stablelm, "slots")
    with pytest.raises(EngineStartError, match="no engine can serve this model on hpu"):
        decide_serving(gaudi, stablelm, "auto")


def test_what_no_step_runs_is_refused_with_the_reason(family_dirs, monkeypatch):
    gpt2 = _load(family_dirs, "gpt2")
    with pytest.raises(FastDecodeError, match="step='fused' cannot run GPT2LMHeadModel: model_type 'gpt2'"):
        EngineCore(gpt2, slots=2, max_cache_len=32, step="fused")
    with pytest.raises(FastDecodeError, match="step='paged' is not a decode step"):
        EngineCore(gpt2, slots=2, max_cache_len=32, step="paged")
    stablelm = _load(family_dirs, "stablelm")
    with pytest.raises(FastDecodeError, match="cannot run StableLmForCausalLM: the model's own forward cannot run "
                                              "here \\(.*is_backend_compatible\\(\\) is False"):
        EngineCore(stablelm, slots=2, max_cache_len=32)
    gemma3 = _load(family_dirs, "gemma3_text")
    with pytest.raises(FastDecodeError, match="sliding-window attention \\(window 16\\) shorter than max_cache_len=32"):
        EngineCore(gemma3, slots=2, max_cache_len=32)
    monkeypatch.setattr(gpt2.config, "_attn_implementation", "flash_attention_2")
    assert "its attention is 'flash_attention_2', which takes no per-row 4D mask" in model_step_support(gpt2)
    step, why = slot_step_support(gpt2)
    assert step is None and "flash_attention_2" in why


def test_the_decision_keeps_the_fallbacks_for_what_the_engine_cannot_run(family_dirs, monkeypatch):
    from hwrun.inference.decision import decide

    cpu = hwrun.plan(device="cpu")
    stablelm = _load(family_dirs, "stablelm")  # computes attention itself: no continuous batching at all
    decision = decide(cpu, stablelm, n_prompts=3, needed=20, decode="graphs")
    assert (decision.batching, decision.runner) == ("static", "static_graphs")
    assert "is_backend_compatible() is False" in decision.batching_reason and "StaticCache" in decision.reason
    with pytest.raises(GenerateError, match="batching='continuous' cannot run StableLmForCausalLM: hwrun's engine "
                       "cannot run it: .*and Transformers' generate_batch neither"):
        decide(cpu, stablelm, n_prompts=3, needed=20, decode="graphs", batching="continuous")
    cuda = hwrun.plan(device=hwenv.Accelerator("cuda", 1, memory=(80 * 2**30,)), compile=True)
    gpt2 = _load(family_dirs, "gpt2")
    decision = decide(cuda, gpt2, n_prompts=3, needed=20)
    assert decision.runner == "engine" and decision.reason.startswith("CUDA (compile on)")
    assert "per-row slot cache" in decision.reason
    # continuous batching runs it, hwrun's engine does not: the static graph decoder on decode='graphs' ...
    monkeypatch.setattr(gpt2.config, "_attn_implementation", "flash_attention_2")
    decision = decide(cpu, gpt2, n_prompts=3, needed=20, decode="graphs")
    assert (decision.batching, decision.runner) == ("static", "static_graphs")
    assert "hwrun's engine cannot run it" in decision.batching_reason and "StaticCache" in decision.reason
    # ... and Transformers' generate_batch when continuous batching was asked for
    decision = decide(cpu, gpt2, n_prompts=3, needed=20, decode="graphs", batching="continuous")
    assert decision.runner == "generate_batch"
    assert decision.reason.startswith("model.generate_batch (hwrun's engine cannot run it: ")


def test_the_server_starts_the_slot_engine_for_another_family_and_answers_like_generate(family_dirs):
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.engine import EngineRequest
    from hwrun.serve.protocol import Sampling
    from hwrun.serve.startup import load_backend, restore_torch_threads

    plan = hwrun.plan(str(family_dirs["gpt_neox"]), device="cpu")
    loaded = load_backend(plan, ServeConfig(engine="slots", max_concurrency=2, max_model_len=64, torch_threads=1))
    try:
        assert loaded.choice.name == "slots" and "the model's own forward" in loaded.choice.reason
        backend = loaded.backend
        prompts = {"a": PROMPTS[1], "b": PROMPTS[2]}
        for request_id, ids in prompts.items():
            backend.add(EngineRequest(request_id, tuple(ids), 6, Sampling(temperature=0.0)))
        streams: dict = {}
        for _ in range(50):
            for event in backend.step():
                streams.setdefault(event.request_id, []).extend(event.token_ids)
            if not backend.decoder.active:
                break
        model = backend.decoder.model
        assert backend.decoder.step_name == "model"
        assert streams == {r: _reference(model, ids, 6) for r, ids in prompts.items()}
    finally:
        restore_torch_threads(loaded)
