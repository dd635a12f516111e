"""Graph decoding and `hwrun serve` on a real accelerator (`gpu` marker): on-device sampling, the slot
decoder's step API, streaming, any family through the model's own forward, fused weights as views and the
OpenAI-compatible server, each with its graphs captured for real (CUDA graphs on the H200). Their CPU twins
are packages/hwrun/tests/test_hwrun_decode_*.py and test_hwrun_serve.py; here the models run in fp32, so a
greedy tie cannot flip between two paths. Skipped, with the reason, where only a CPU is here.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gpu_marks import ACCEL, GPU_MARKS  # tests/gpu is on sys.path (conftest.py)

pytestmark = GPU_MARKS

PROMPTS = ["The king said", "Once upon a time there was", "In the beginning", "The queen"]
#: A hot, filtered sampling setting (as the CPU tests use): on the tiny model it moves tokens off greedy.
SAMPLED = dict(do_sample=True, temperature=1.3, top_p=0.95, top_k=40, seed=3)


def _plan(model=None, **kwargs):
    import hwrun

    return hwrun.plan(model, device=ACCEL.kind, dtype="float32", **kwargs)


def _graph_name(plan) -> str:
    """The graph hwrun's decoders capture here ("CUDA graph"), or a skip where they capture none."""
    from hwrun.inference.decision import graph_api_of

    graphs = graph_api_of(plan)
    if graphs is None:
        pytest.skip(f"{ACCEL.kind} has no graph API hwrun's decoders capture with ({ACCEL.platform.graph_api})")
    return graphs[1]


@pytest.fixture(scope="module")
def loaded():
    """(plan, model, tokenizer): the shipped tiny model in fp32 on the accelerator, compile off."""
    import hwrun

    plan = _plan()
    model, tokenizer = hwrun.load(plan)
    assert model.device.type == ACCEL.device_type
    return plan, model, tokenizer


def _reference(model, ids, n):
    """Greedy `model.generate` of exactly `n` new tokens for one prompt of token ids."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _drain(decoder, streams, limit=400):
    """step() until no request is active; tokens per request id, finish reasons returned."""
    reasons = {}
    for _ in range(limit):
        if not decoder.active:
            return reasons
        for event in decoder.step():
            streams.setdefault(event.request_id, []).append(event.token_id)
            if event.finished:
                reasons[event.request_id] = event.finish_reason
    raise AssertionError("requests never finished")


# ---- 1. greedy graph decode (the sampling code present) equals model.generate ---------------------------


@pytest.mark.parametrize("compile", [False, True], ids=["eager-step", "compiled-step"])
@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_greedy_graph_decode_equals_generate_in_fp32(batching, compile):
    import hwrun

    plan = _plan(compile=compile)
    graph = _graph_name(plan)
    model, tokenizer = hwrun.load(plan)
    prompts = PROMPTS[:3]
    ours = hwrun.generate(plan, prompts, 24, decode="graphs", batching=batching, model=model, tokenizer=tokenizer)
    theirs = hwrun.generate(plan, prompts, 24, decode="generate", batching="static", model=model,
                            tokenizer=tokenizer)
    assert ours.decode == "graphs" and ours.batching == batching and graph in ours.decode_reason
    assert ours.token_ids == theirs.token_ids


# ---- 2. sampled graph decode ---------------------------------------------------------------------------


@pytest.mark.parametrize("compile", [False, True], ids=["eager-step", "compiled-step"])
@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_sampled_graph_decode_is_seeded_and_top_k_1_is_greedy(batching, compile):
    import hwrun

    plan = _plan(compile=compile)
    _graph_name(plan)
    model, tokenizer = hwrun.load(plan)
    prompts = PROMPTS[:3]
    run = dict(decode="graphs", batching=batching, model=model, tokenizer=tokenizer)
    first = hwrun.generate(plan, prompts, 16, **SAMPLED, **run)
    again = hwrun.generate(plan, prompts, 16, **SAMPLED, **run)
    assert first.decode == "graphs" and first.token_ids == again.token_ids  # same seed, same tokens
    greedy = hwrun.generate(plan, prompts, 16, **run)
    assert first.token_ids != greedy.token_ids  # it did sample
    top1 = hwrun.generate(plan, prompts, 16, **{**SAMPLED, "top_k": 1}, **run)
    assert top1.token_ids == greedy.token_ids


def test_seeded_request_is_the_same_alone_and_in_a_batch_of_four(loaded):
    from hwrun.inference.decode import SamplingParams
    from hwrun.inference.engine import EngineCore

    plan, model, tokenizer = loaded
    _graph_name(plan)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(temperature=1.5, top_p=0.95, seed=11)

    def run(others):
        decoder = EngineCore(model, slots=4, max_cache_len=64)
        for index, other in enumerate(others):  # the others first: the seeded request gets another slot
            decoder.add(f"o{index}", ids[other], max_new_tokens=9, eos_token_id=None,
                        sampling=SamplingParams(temperature=1.0, seed=index))
        decoder.add("s", ids[0], max_new_tokens=12, eos_token_id=None, sampling=params)
        streams: dict = {}
        _drain(decoder, streams)
        assert decoder.use_graphs and any(key[0] for key in decoder.graphs)  # a sampled step was captured
        return streams

    alone, beside = run([]), run([1, 2, 3])
    assert len(alone["s"]) == 12 and alone["s"] == beside["s"]
    assert alone["s"] != _reference(model, ids[0], 12)  # it did sample


# ---- 3. the slot decoder's step API under real graphs --------------------------------------------------


def test_step_api_adds_at_different_steps_and_cancels_under_graphs(loaded):
    from hwrun.inference.engine import EngineCore

    plan, model, tokenizer = loaded
    _graph_name(plan)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    budgets = {"a": 14, "b": 30, "c": 10}
    prompt_of = {"a": ids[0], "b": ids[1], "c": ids[2]}
    decoder = EngineCore(model, slots=3, max_cache_len=64)
    decoder.start(sampling=False)
    assert decoder.use_graphs and decoder.graph is not None  # captured before the first request

    def alone(name):
        decoder.add(name, prompt_of[name], max_new_tokens=budgets[name], eos_token_id=None)
        streams: dict = {}
        _drain(decoder, streams)
        return streams[name]

    want = {name: alone(name) for name in ("a", "c")}
    assert decoder.free_slots == 3 and decoder.active == set()

    streams: dict = {}

    def steps(n):
        for _ in range(n):
            for event in decoder.step():
                streams.setdefault(event.request_id, []).append(event.token_id)

    decoder.add("a", prompt_of["a"], max_new_tokens=budgets["a"], eos_token_id=None)
    steps(2)
    decoder.add("b", prompt_of["b"], max_new_tokens=budgets["b"], eos_token_id=None)
    steps(3)
    decoder.add("c", prompt_of["c"], max_new_tokens=budgets["c"], eos_token_id=None)
    assert decoder.free_slots == 0 and decoder.active == {"a", "b", "c"}
    steps(2)
    decoder.cancel("b")  # mid-way: 5 of its 30 tokens reported
    assert decoder.active == {"a", "c"} and decoder.free_slots == 1 and len(streams["b"]) == 5
    reasons = _drain(decoder, streams)
    assert reasons == {"a": "length", "c": "length"}
    assert streams["a"] == want["a"] and streams["c"] == want["c"]
    assert len(streams["b"]) == 5  # nothing of b after its cancel
    assert decoder.free_slots == 3 and decoder.active == set()
    assert streams["a"] == _reference(model, prompt_of["a"], budgets["a"])
    assert decoder.moves > 0  # c moved down when b was cancelled, then a finished


def test_one_request_of_eight_slots_replays_the_one_row_graph(loaded):
    """Row buckets under real graphs: a lone request replays the 1-row graph (it attends over its own row
    only), three requests the 4-row one, and the tokens equal model.generate's."""
    from hwrun.inference.engine import EngineCore

    plan, model, tokenizer = loaded
    _graph_name(plan)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    decoder = EngineCore(model, slots=8, max_cache_len=64)
    decoder.start(sampling=False)
    assert {key[1] for key in decoder.graphs} == {1, 2, 4, 8}
    decoder.add("a", ids[0], max_new_tokens=12, eos_token_id=None)
    decoder.step()
    assert decoder.last_rows == 1
    for name, prompt in (("b", ids[1]), ("c", ids[2])):
        decoder.add(name, prompt, max_new_tokens=12, eos_token_id=None)
    streams: dict = {}
    for event in decoder.step():
        streams.setdefault(event.request_id, []).append(event.token_id)
    assert decoder.last_rows == 4
    _drain(decoder, streams)
    for name, prompt in (("b", ids[1]), ("c", ids[2])):
        assert streams[name] == _reference(model, prompt, 12)


# ---- 4. streaming from the graph decoder ---------------------------------------------------------------


class RecordingStreamer:
    """Transformers' streamer protocol (put/end), recording what arrives."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value):
        assert not self.ended, "put() after end()"
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_streaming_from_the_graph_decoder_delivers_the_results_tokens(loaded):
    import hwrun

    plan, model, tokenizer = loaded
    graph = _graph_name(plan)
    streamer = RecordingStreamer()
    result = hwrun.generate(plan, PROMPTS[0], 48, decode="graphs", streamer=streamer, model=model,
                            tokenizer=tokenizer)
    assert result.decode == "graphs" and result.batching == "static" and graph in result.decode_reason
    assert streamer.ended == 1 and len(streamer.puts) >= 2
    assert streamer.puts[0] == tokenizer(PROMPTS[0])["input_ids"]  # the prompt first, as model.generate gives it
    assert sum(streamer.puts[1:], []) == result.token_ids[0]
    plain = hwrun.generate(plan, PROMPTS[0], 48, decode="generate", batching="static", model=model,
                           tokenizer=tokenizer)
    assert result.token_ids == plain.token_ids


# ---- 5. any family through the model's own forward -----------------------------------------------------


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    from hwrun.testing.families import build_tiny_family

    root = tmp_path_factory.mktemp("families")
    first = build_tiny_family("gpt2", root / "gpt2")
    return {"gpt2": first, "qwen3": build_tiny_family("qwen3", root / "qwen3", tokenizer_source=first)}


def _generate_rows(model, tokenizer, prompts, n):
    """Each prompt's `n` greedy tokens from `model.generate` alone, up to and including its first EOS."""
    import torch

    eos = tokenizer.eos_token_id
    rows = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(model.device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                 pad_token_id=0)
        row = out[0, ids.shape[1]:].tolist()
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


@pytest.mark.parametrize("family", ["gpt2", "qwen3"])
def test_other_families_through_graph_decode_equal_generate(family_dirs, family):
    import hwrun
    from hwrun.inference.decode.static import GraphDecoder

    plan = _plan(str(family_dirs[family]))
    graph = _graph_name(plan)
    model, tokenizer = hwrun.load(plan)
    prompts = PROMPTS[:3]
    result = hwrun.generate(plan, prompts, 12, decode="graphs", batching="static", model=model,
                            tokenizer=tokenizer)
    assert result.decode == "graphs" and graph in result.decode_reason
    assert "the model's own forward over a StaticCache" in result.decode_reason
    expected = _generate_rows(model, tokenizer, prompts, 12)
    assert result.token_ids == expected
    # the decoder itself: the model's own forward, its step captured as a graph
    decoder = GraphDecoder(model, batch_size=1, max_cache_len=48)
    ids = tokenizer(prompts[0], return_tensors="pt")["input_ids"].to(model.device)
    out = decoder.generate(ids, 12, eos_token_id=None)[0].tolist()
    assert decoder.fused is None and decoder.use_graphs and decoder.graph is not None
    assert out[: len(expected[0])] == expected[0]


@pytest.mark.parametrize("family", ["gpt2", "qwen3"])
def test_other_families_through_the_slot_decoder_equal_generate(family_dirs, family):
    import hwrun
    from hwrun.inference.engine import EngineCore

    plan = _plan(str(family_dirs[family]))
    graph = _graph_name(plan)
    model, tokenizer = hwrun.load(plan)
    prompts = PROMPTS[:3]
    result = hwrun.generate(plan, prompts, 12, decode="graphs", batching="continuous", model=model,
                            tokenizer=tokenizer)
    assert result.decode == "graphs" and result.batching == "continuous" and graph in result.decode_reason
    assert "the model's own forward over a per-row slot cache" in result.decode_reason
    expected = _generate_rows(model, tokenizer, prompts, 12)
    assert result.token_ids == expected
    decoder = EngineCore(model, slots=2, max_cache_len=64)
    decoder.start()
    assert decoder.step_name == "model" and decoder.use_graphs
    decoder.add("a", tokenizer(prompts[1])["input_ids"], max_new_tokens=12)
    tokens = []
    while decoder.active:
        tokens += [e.token_id for e in decoder.step()]
    assert tokens == expected[1]


# ---- 6. fused weights as views: no second copy on the device --------------------------------------------


def test_fused_weights_are_views_and_add_no_device_memory():
    import hwrun
    import torch
    from hwenv.platforms import runtime
    from hwrun.inference.decode.static import GraphDecoder
    from hwrun.inference.engine import EngineCore

    plan = _plan()
    model, tokenizer = hwrun.load(plan)  # a fresh model: no decoder has fused it yet
    platform, device = ACCEL.platform, model.device

    def allocated() -> int:
        runtime.synchronize(platform, device)
        runtime.reset_peak_memory_stats(platform, device)  # the peak restarts at what is allocated now
        value = runtime.max_memory_allocated(platform, device)
        if value is None:
            pytest.skip(f"{ACCEL.kind} reports no allocated memory ({ACCEL.platform.memory_api})")
        return value

    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    separate = attn.q_proj.weight.data_ptr()
    before = allocated()
    decoder = GraphDecoder(model, batch_size=1, max_cache_len=64)
    after = allocated()
    fused = decoder.fused
    qkv, gate_up = fused.layers[0]["qkv"], fused.layers[0]["gate_up"]
    assert qkv.device.type == ACCEL.device_type
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr() != separate
    assert attn.k_proj.weight.data_ptr() == qkv[attn.q_proj.out_features].data_ptr()
    rows = attn.q_proj.out_features + attn.k_proj.out_features
    assert attn.v_proj.weight.data_ptr() == qkv[rows].data_ptr()
    assert mlp.gate_proj.weight.data_ptr() == gate_up.data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
    cache = sum(t.numel() * t.element_size() for t in (*fused.keys, *fused.values))
    growth = after - before
    # the K/V cache (and a few small index buffers) is new; a second copy of the weights would add fused_bytes
    assert cache <= growth < cache + fused.fused_bytes // 2, (growth, cache, fused.fused_bytes)
    # a second decoder reuses the same matrices: again only its cache is new
    slots = EngineCore(model, slots=2, max_cache_len=64)
    assert slots.runner.step.fused.layers[0]["qkv"] is qkv
    grown = allocated() - after
    second_cache = sum(t.numel() * t.element_size() for t in (*slots.kv.keys, *slots.kv.values))
    assert second_cache <= grown < second_cache + fused.fused_bytes // 2, (grown, second_cache)
    # and the views decode: the graph decoder's greedy tokens equal model.generate's
    ids = tokenizer(PROMPTS[0])["input_ids"]
    out = decoder.generate(torch.tensor([ids], device=device), 12, eos_token_id=None)[0].tolist()
    assert out == _reference(model, ids, 12)


# ---- 7. hwrun serve on the accelerator ----------------------------------------------------------------


def test_serve_auto_picks_slots_and_answers_like_generate():
    for module in ("openai", "starlette", "uvicorn", "zmq", "msgspec"):
        pytest.importorskip(module, reason=f"`hwrun serve` tests need {module} (hwrun[serve] and the openai "
                                           "client); carry its wheel in .whl/")
    import hwrun
    import openai
    from hwrun.inference.decision import graph_api_of
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.server import ServerThread

    plan = _plan()
    graph = _graph_name(plan)
    label = graph_api_of(plan)[0]
    model_id = "hwrun/tiny-llama"
    config = ServeConfig(port=0, max_concurrency=4, max_queue=4, grace_seconds=5, model_id=model_id,
                         engine="auto", max_model_len=256)
    lines: list[str] = []
    jobs = [(PROMPTS[0], 20), (PROMPTS[1], 7), (PROMPTS[2], 12), (PROMPTS[3], 16)]
    model, tokenizer = hwrun.load(plan)  # the reference: a second load of the same plan
    want = [hwrun.generate(plan, p, n, decode="generate", batching="static", model=model, tokenizer=tokenizer).text
            for p, n in jobs]
    srv = ServerThread(config, plan, say=lines.append).start(timeout=300)
    try:
        assert srv.state.engine_name == "slots"
        assert any(line.startswith(f"engine: slots ({label}: hwrun's") for line in lines), lines
        # the engine core runs in its own process: its slots are seen through the counters it sends with each batch
        engine = srv.state.engine
        assert engine.mode == "process" and any("engine core: its own process" in line for line in lines), lines
        assert engine.free_slots == 4
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(job):
            return client.completions.create(model=model_id, prompt=job[0], max_tokens=job[1],
                                             temperature=0).choices[0].text

        with ThreadPoolExecutor(len(jobs)) as pool:
            assert list(pool.map(ask, jobs)) == want
        card = client.models.list().data[0]
        meta = card.model_extra["hwrun"]
        assert card.id == model_id and meta["engine"] == "slots" and graph in meta["engine_reason"]
        assert meta["device"] == plan.device and meta["dtype"] == plan.dtype and meta["max_model_len"] == 256
        deadline = time.monotonic() + 30
        while (engine.free_slots != 4 or engine.running) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.free_slots == 4 and not engine.running  # every finished request gave its slot back
    finally:
        srv.stop()
    assert not srv.thread.is_alive()
