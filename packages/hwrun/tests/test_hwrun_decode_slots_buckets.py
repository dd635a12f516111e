"""hwrun's engine steps only the rows in use: active requests stay packed in the lowest slots (a leaving
request's slot takes the highest active row: its K/V, position, token counter, produced tokens and sampling row),
and each step runs over the smallest bucket of rows (1, 2, 4, ... slots) that holds them, one graph per bucket.
Greedy tokens still equal `model.generate`'s while rows move (fused and model step, Llama and GPT-2), seeded
sampling is the same alone and beside others however often the request moves, the graph fakes capture one graph
per bucket used and replay that bucket's, and one active request of 8 slots steps one row. With `cache_buckets`,
a step also attends over only the cache positions its rows have reached (one graph per rows x length bucket)."""

from __future__ import annotations

import dataclasses

import hwrun
import pytest
import torch
from hwenv.platforms import get_platform
from hwenv.testing import fake_xpu
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore, bucket_sizes, length_buckets
from hwrun.testing.families import build_tiny_family

TEXTS = ["The king said", "Once upon a time there was a little house", "It was", "The queen", "A dog ran",
         "She opened the door and saw"]


@pytest.fixture(scope="module")
def llama():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return model, [tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("gpt2", tmp_path_factory.mktemp("bucket_families") / "gpt2")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    prompts = [[5, 9, 14], [40, 41, 42, 43, 44, 45, 46, 47, 48], [2, 7, 11, 13, 17], [99], [3, 4], [60, 61, 62, 63]]
    return model, prompts


def _reference(model, ids, n):
    """`n` greedy tokens of `model.generate` without stopping at EOS: one generate call per token (min_new_tokens
    would suppress the EOS logit instead of taking it, which the decoder does with eos_token_id=None)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out = model.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False, pad_token_id=0)
            seq.append(int(out[0, -1]))
    return seq[len(ids):]


def _step(decoder, streams):
    for event in decoder.step():
        streams.setdefault(event.request_id, []).append(event.token_id)


def _drain(decoder, streams, rows=None):
    for _ in range(200):
        if not decoder.active:
            return
        _step(decoder, streams)
        if rows is not None:
            rows.append(decoder.last_rows)
    raise AssertionError("requests never finished")


def _packed(decoder):
    """The active requests hold exactly the lowest slots."""
    slots = sorted(r.slot for r in decoder.scheduler.requests.values())
    return slots == list(range(len(slots)))


def test_bucket_sizes():
    assert bucket_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert bucket_sizes(6) == (1, 2, 4, 6) and bucket_sizes(1) == (1,)
    assert bucket_sizes(8, [8]) == (8,) and bucket_sizes(8, [3, 1]) == (1, 3, 8)
    with pytest.raises(FastDecodeError, match="buckets=\\[0, 4\\] holds 0: each bucket is a row count from 1 to "
                                              "slots=8"):
        bucket_sizes(8, [0, 4])
    with pytest.raises(FastDecodeError, match="holds 9"):
        bucket_sizes(8, [9])


@pytest.mark.parametrize("family", ["llama-fused", "llama-model", "gpt2"])
def test_tokens_equal_generate_while_rows_move(llama, gpt2, family):
    model, ids = gpt2 if family == "gpt2" else llama
    step = "model" if family in ("llama-model", "gpt2") else "fused"
    decoder = EngineCore(model, slots=8, max_cache_len=64, step=step)
    assert decoder.step_name == step
    budgets = {"a": 12, "b": 3, "c": 20, "d": 9, "e": 7, "f": 6}
    streams: dict = {}
    rows: list[int] = []
    decoder.add("a", ids[0], max_new_tokens=budgets["a"], eos_token_id=None)
    _step(decoder, streams)
    assert decoder.last_rows == 1
    for name, prompt in zip("bcd", ids[1:4], strict=True):
        decoder.add(name, prompt, max_new_tokens=budgets[name], eos_token_id=None)
    _step(decoder, streams)
    _step(decoder, streams)
    assert decoder.last_rows == 4 and decoder.moves == 0
    _step(decoder, streams)  # "b" (slot 1) finishes: "d" (slot 3) moves into slot 1
    assert "b" not in decoder.active and decoder.scheduler.requests["d"].slot == 1 and decoder.moves == 1
    assert _packed(decoder)
    decoder.cancel("a")  # slot 0 frees: "c" (slot 2) moves down
    assert decoder.scheduler.requests["c"].slot == 0 and decoder.moves == 2 and _packed(decoder)
    _step(decoder, streams)
    assert decoder.last_rows == 2  # two active requests: the two-row bucket
    decoder.add("e", ids[4], max_new_tokens=budgets["e"], eos_token_id=None)  # into slot 2, mid-run
    decoder.add("f", ids[5], max_new_tokens=budgets["f"], eos_token_id=None)
    assert decoder.scheduler.requests["f"].slot == 3
    _drain(decoder, streams, rows)
    assert rows[0] == 4 and rows[-1] == 1 and rows == sorted(rows, reverse=True)  # shrinking as they finish
    for name, prompt in zip("bcdef", ids[1:], strict=True):
        assert streams[name] == _reference(model, prompt, budgets[name]), name
    assert len(streams["a"]) == 4 and decoder.free_slots == 8 and decoder.moves > 2


@pytest.mark.parametrize("family", ["llama-fused", "gpt2"])
def test_whole_batch_generate_packs_and_shrinks(llama, gpt2, family):
    model, ids = gpt2 if family == "gpt2" else llama
    budgets = [3, 14, 5, 9, 4, 11]
    decoder = EngineCore(model, slots=4, max_cache_len=64, check_every=2)
    rows = decoder.generate(ids, budgets, eos_token_id=None)
    assert rows == [_reference(model, p, n) for p, n in zip(ids, budgets, strict=True)]
    assert decoder.moves > 0 and decoder.last_rows == 1  # the longest request ran alone at the end


@pytest.mark.parametrize("step", ["fused", "model"])
def test_one_active_request_of_eight_slots_steps_one_row(llama, step):
    model, ids = llama
    decoder = EngineCore(model, slots=8, max_cache_len=64, step=step)
    shapes = []
    if step == "fused":
        fused = decoder.runner.step.fused
        decoder.runner.step.fused = lambda token, position, **kw: shapes.append(tuple(token.shape)) or fused(token, position, **kw)
        hook = None
    else:
        hook = model.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                               with_kwargs=True)
    try:
        decoder.add("a", ids[0], max_new_tokens=4, eos_token_id=None)
        shapes.clear()  # the prefill's
        streams: dict = {}
        _drain(decoder, streams)
        decoder.add("b", ids[1], max_new_tokens=2, eos_token_id=None)
        decoder.add("c", ids[2], max_new_tokens=2, eos_token_id=None)
        decoder.add("d", ids[3], max_new_tokens=2, eos_token_id=None)
        shapes.clear()
        _step(decoder, streams)
    finally:
        if hook is not None:
            hook.remove()
    # the three requests added together are prefilled in one forward (3 rows), then the four-row bucket steps
    assert shapes[0][0] == 3 and shapes[1:] == [(4, 1)], shapes
    assert streams["a"] == _reference(model, ids[0], 4)
    assert [streams[n] for n in "bcd"] == [_reference(model, ids[i], 1) for i in (1, 2, 3)]


SEEDED = SamplingParams(temperature=1.3, top_p=0.95, top_k=50, seed=21)


def _sampled_run(model, ids, others, cancel_at=None):
    """A seeded request "s" added after `others` ((prompt index, budget); every other one sampled with its own
    seed), so it starts in the highest slot; `cancel_at` cancels "o1" before that step. (s's tokens, its first
    slot, the rows moved)."""
    decoder = EngineCore(model, slots=8, max_cache_len=64)
    for index, (other, budget) in enumerate(others):
        decoder.add(f"o{index}", ids[other], max_new_tokens=budget, eos_token_id=None,
                    sampling=SamplingParams(temperature=0.8, seed=index) if index % 2 else None)
    decoder.add("s", ids[0], max_new_tokens=14, eos_token_id=None, sampling=SEEDED)
    start = decoder.scheduler.requests["s"].slot
    streams: dict = {}
    for step in range(30):
        if not decoder.active:
            break
        if step == cancel_at:
            decoder.cancel("o1")
        _step(decoder, streams)
    return streams["s"], start, decoder.moves


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_seeded_sampling_keeps_its_tokens_when_its_row_moves(llama, gpt2, family):
    model, ids = gpt2 if family == "gpt2" else llama
    alone, _, _ = _sampled_run(model, ids, [])
    beside, start, moves = _sampled_run(model, ids, [(1, 3), (2, 5), (3, 20), (4, 2)], cancel_at=4)
    assert start == 4 and moves == 4  # s: slot 4, then 3 and 0 as o3 and o0 finish; then o2 moves twice
    assert beside == alone and len(alone) == 14
    assert alone != _reference(model, ids[0], 14)  # it did sample
    # the whole-batch API: the second prompt samples as it would alone while shorter ones retire around it
    rows = EngineCore(model, slots=2, max_cache_len=64, check_every=3).generate(
        [ids[3], ids[0], ids[1]], [2, 14, 4], eos_token_id=None, sampling=SEEDED)
    assert rows[1] == alone


def test_graph_fakes_capture_one_graph_per_bucket_used_and_replay_it(llama):
    # The fake's graph class and capture context stand in for torch.xpu.XPUGraph / torch.xpu.graph (INTEL.md
    # "Graphs", S1; torch/xpu/graphs.py in torch 2.15), to which hwenv's test_hwenv_fake_graphs.py holds the fake.
    model, ids = llama
    eager = EngineCore(model, slots=4, max_cache_len=64, use_graphs=False)
    plan = [("add", "a", 0, 9), ("step",), ("add", "b", 1, 4), ("step",), ("add", "c", 2, 6), ("step",),
            ("step",), ("cancel", "a"), ("step",), ("step",), ("step",), ("step",)]

    def drive(decoder, replays=None):
        streams: dict = {}
        for action in plan:
            if action[0] == "add":
                decoder.add(action[1], ids[action[2]], max_new_tokens=action[3], eos_token_id=None)
            elif action[0] == "cancel":
                decoder.cancel(action[1])
            elif decoder.active:
                _step(decoder, streams)
        _drain(decoder, streams)
        return streams

    expected = drive(eager)
    with fake_xpu(1) as fake:
        decoder = EngineCore(model, slots=4, max_cache_len=64, platform=get_platform("xpu"))
        assert decoder.use_graphs and decoder.buckets == (1, 2, 4)
        replayed = []
        real_runner = decoder.runner.runnable

        def runner(sample, rows=None, columns=None):
            key = (sample, rows, columns)
            fresh = key not in decoder.graphs
            replay = real_runner(*key)
            if fresh:  # record which graph each replay is
                graph = decoder.graphs[key]
                original = graph.replay
                graph.replay = lambda: replayed.append(key) or original()
                replay = graph.replay
            return replay

        decoder.runner.runnable = runner
        got = drive(decoder)
        # a alone (1 row), a+b (2), a+b+c (4 rows, also while b finishes), then c alone after a is cancelled
        assert sorted(decoder.graphs) == [(False, 1, 64), (False, 2, 64), (False, 4, 64)]
        assert fake.graph_events.count("capture_begin") == 3
        assert replayed[:3] == [(False, 1, 64), (False, 2, 64), (False, 4, 64)]
        assert replayed.count((False, 1, 64)) > 1 and fake.graph_events.count("replay") == len(replayed)
    assert got == expected
    for name, index, budget in (("b", 1, 4), ("c", 2, 6)):
        assert got[name] == _reference(model, ids[index], budget)


def test_start_captures_every_bucket_once(llama):
    model, ids = llama
    with fake_xpu(1) as fake:
        decoder = EngineCore(model, slots=8, max_cache_len=32, platform=get_platform("xpu"), buckets=[1, 8])
        decoder.start()
        assert sorted(decoder.graphs) == [(False, 1, 32), (False, 8, 32), (True, 1, 32), (True, 8, 32)]
        decoder.start()
        assert fake.graph_events.count("capture_begin") == 4 and "replay" not in fake.graph_events
        decoder.add("a", ids[0], max_new_tokens=3, eos_token_id=None)
        decoder.add("b", ids[2], max_new_tokens=3, eos_token_id=None)
        streams: dict = {}
        _step(decoder, streams)
        assert decoder.last_rows == 8  # no 2-row bucket: the next one up
        assert fake.graph_events.count("capture_begin") == 4


def test_length_buckets():
    assert length_buckets(1536) == (128, 256, 512, 1024, 1536) and length_buckets(64, 8) == (8, 16, 32, 64)
    assert length_buckets(100) == (100,)
    with pytest.raises(FastDecodeError, match="cache_buckets=\\[0\\] holds 0: each is a cache length from 1 to "
                                              "max_cache_len=16"):
        EngineCore(hwrun.load(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))[0], slots=2, max_cache_len=16,
                    cache_buckets=[0])


@pytest.mark.parametrize("family", ["llama-fused", "llama-model", "gpt2"])
def test_cache_buckets_attend_over_the_positions_reached(llama, gpt2, family):
    model, ids = gpt2 if family == "gpt2" else llama
    step = "model" if family in ("llama-model", "gpt2") else "fused"
    decoder = EngineCore(model, slots=4, max_cache_len=64, step=step, cache_buckets=length_buckets(64, 8))
    assert decoder.cache_buckets == (8, 16, 32, 64)
    seen = []
    if step == "model":
        hook = model.register_forward_pre_hook(
            lambda _, args, kwargs: seen.append(tuple(kwargs["attention_mask"].shape)), with_kwargs=True)
    prompts = {"a": [5, 9, 14], "b": list(range(40, 50)), "c": [2, 7, 11, 13]}
    budgets = {"a": 28, "b": 12, "c": 20}
    try:
        streams: dict = {}
        decoder.add("a", prompts["a"], max_new_tokens=budgets["a"], eos_token_id=None)
        columns = []
        for _ in range(6):
            _step(decoder, streams)
            columns.append(decoder.last_columns)
        decoder.add("b", prompts["b"], max_new_tokens=budgets["b"], eos_token_id=None)
        decoder.add("c", prompts["c"], max_new_tokens=budgets["c"], eos_token_id=None)
        while decoder.active:
            _step(decoder, streams)
            columns.append(decoder.last_columns)
    finally:
        if step == "model":
            hook.remove()
    # a at positions 3..8: 8 columns while its position is below 8, then 16; b's 10 prompt tokens keep 16; a's
    # last position is 30 (31 columns): 32, never all 64
    assert columns[:7] == [8, 8, 8, 8, 8, 16, 16] and columns[-1] == 32 and max(columns) == 32
    assert columns == sorted(columns)
    if step == "model":
        decode = [shape for shape in seen if shape[2] == 1]  # (rows, 1, 1, columns) decode masks
        # attention reads whole KV blocks (16 positions): the 8-column bucket attends 16, its mask hides the rest
        assert [shape[-1] for shape in decode] == [decoder.kv.span(c) for c in columns]
    for name in "abc":
        assert streams[name] == _reference(model, prompts[name], budgets[name]), name
    # the whole-batch API bounds each chunk by the furthest position it reaches: same tokens
    rows = EngineCore(model, slots=2, max_cache_len=64, step=step, check_every=4,
                       cache_buckets=length_buckets(64, 8)).generate(ids[:3], [20, 9, 25], eos_token_id=None)
    assert rows == [_reference(model, p, n) for p, n in zip(ids[:3], [20, 9, 25], strict=True)]
    # a chunk of 4 steps from position 5 ends at position 8: the chunk needs 9 columns (16), not 8
    one = EngineCore(model, slots=1, max_cache_len=64, step=step, check_every=4, cache_buckets=length_buckets(64, 8))
    prompt = [5, 9, 14, 7, 3]
    assert one.generate([prompt], 5, eos_token_id=None) == [_reference(model, prompt, 5)]
    assert one.steps == 4 and one.last_columns == 16


def test_graph_fakes_capture_one_graph_per_rows_and_length_bucket(llama):
    # The fake's graph class and capture context stand in for torch.xpu.XPUGraph / torch.xpu.graph (INTEL.md
    # "Graphs", S1; torch/xpu/graphs.py in torch 2.15), to which hwenv's test_hwenv_fake_graphs.py holds the fake.
    model, ids = llama
    eager = EngineCore(model, slots=2, max_cache_len=32, use_graphs=False)
    eager.add("a", ids[2], max_new_tokens=20, eos_token_id=None)
    expected = [eager.step()[0].token_id for _ in range(20)]
    with fake_xpu(1) as fake:
        decoder = EngineCore(model, slots=2, max_cache_len=32, platform=get_platform("xpu"),
                              cache_buckets=[8, 16])
        decoder.add("a", ids[2], max_new_tokens=20, eos_token_id=None)
        tokens = [decoder.step()[0].token_id for _ in range(20)]
        # 3 prompt tokens + 20 steps: positions 3..22, so 8, then 16, then 32 columns, one row
        assert sorted(decoder.graphs) == [(False, 1, 8), (False, 1, 16), (False, 1, 32)]
        assert fake.graph_events.count("capture_begin") == 3 and fake.graph_events.count("replay") == 20
        decoder.start(sampling=False)  # the rest: 2 rows x 3 lengths
        assert fake.graph_events.count("capture_begin") == 6
    assert tokens == expected


def test_each_bucket_compiles_once_past_dynamos_recompile_limit(llama):
    """10 compiled steps (5 row buckets x greedy/sampled) > torch._dynamo's recompile limit of 8 per code object:
    each step has its own code object, so every one is compiled (none falls back to eager) and none again later."""
    from torch._dynamo.utils import counters

    model, ids = llama
    decoder = EngineCore(model, slots=16, max_cache_len=32, compile_backend="eager", step="fused")
    before = counters["stats"]["unique_graphs"]
    decoder.start()
    assert len(decoder.runner.warmed) == 10 and counters["stats"]["unique_graphs"] - before == 10
    for index in range(16):
        decoder.add(index, ids[index % len(ids)][:4], max_new_tokens=3, eos_token_id=None)
        decoder.step()
    assert counters["stats"]["unique_graphs"] - before == 10


@pytest.mark.parametrize("fails", [False, True], ids=["compiles", "inductor-fails"])
def test_a_sampled_step_whose_filter_fails_to_compile_filters_eagerly(llama, fails, caplog):
    """Inductor failed to compile the sampled 8-row step's top-k/top-p filter on an H200 (a 1.2B Llama, bf16): the
    step retries once with the filter out of its compiled graph (logged with the error); seeded tokens unchanged.
    Where the compile succeeds, the filter stays in the graph."""
    model, ids = llama
    traced: list[list[str]] = []

    def backend(graph_module, inputs):  # a stand-in for Inductor failing on graphs that sort
        ops = [str(node.target) for node in graph_module.graph.nodes]
        if fails and any("sort" in op for op in ops):
            raise TypeError("list indices must be integers or slices, not NoneType")
        traced.append(ops)
        return graph_module.forward

    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    prompts = [ids[0][:4], ids[1][:5]]
    compiled = EngineCore(model, slots=2, max_cache_len=32, compile_backend=backend, step="fused", buckets=[2])
    with caplog.at_level("WARNING", logger="hwrun.inference.engine.graphs"):
        got = compiled.generate(prompts, 6, eos_token_id=None, sampling=sampling)
    plain = EngineCore(model, slots=2, max_cache_len=32, step="fused", buckets=[2])
    assert got == plain.generate(prompts, 6, eos_token_id=None, sampling=sampling)
    ops = [op for graph in traced for op in graph]
    assert any("mm" in op or "linear" in op or "matmul" in op for op in ops)  # the model step is compiled
    sorted_in_graph = any("sort" in op for op in ops)
    if fails:
        assert not sorted_in_graph and "list indices" in compiled.sampling_fallback
        assert "filter runs eagerly" in caplog.text and "ModelRunner" in caplog.text and "list indices" in caplog.text
    else:
        assert sorted_in_graph and compiled.sampling_fallback is None and "eagerly" not in caplog.text


def _fails_on_sort(graph_module, inputs):
    """A torch.compile backend standing in for Inductor failing on the sampling filter (any graph that sorts)."""
    if any("sort" in str(node.target) for node in graph_module.graph.nodes):
        raise TypeError("list indices must be integers or slices, not NoneType")
    return graph_module.forward


def test_the_static_decoders_sampled_step_falls_back_the_same_way(llama, caplog):
    """The static graph decoder (batch 1, batching="static") shares the fallback: its sampled step retries with
    the filter eager when the compile fails, and its seeded tokens are unchanged."""
    from hwrun.inference.decode.static import GraphDecoder

    model, ids = llama

    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    prompt = torch.tensor([ids[0][:4]])
    compiled = GraphDecoder(model, max_cache_len=32, compile_backend=_fails_on_sort, step="fused")
    with caplog.at_level("WARNING", logger="hwrun.inference.engine.graphs"):
        got = compiled.generate(prompt, 6, eos_token_id=None, sampling=sampling)
    plain = GraphDecoder(model, max_cache_len=32, step="fused")
    assert torch.equal(got, plain.generate(prompt, 6, eos_token_id=None, sampling=sampling))
    assert "list indices" in compiled.sampling_fallback and "GraphDecoder" in caplog.text


def test_one_buckets_filter_falling_back_recompiles_no_other_bucket(llama):
    """Each compiled sampled step has its own filter choice: the 2-row step's compile failing leaves the 1-row step
    that start() compiled as it was (a shared choice would fail its guards and recompile it mid-stream)."""
    model, ids = llama
    calls: list[tuple[int, bool]] = []

    def backend(graph_module, inputs):
        sorted_rows = [node.args[0].meta["example_value"].shape[0] for node in graph_module.graph.nodes
                       if "sort" in str(node.target)]  # the rows of what the filter sorts
        sorts, rows = bool(sorted_rows), (sorted_rows or [0])[0]
        calls.append((rows, sorts))
        if sorts and rows == 2:
            raise TypeError("list indices must be integers or slices, not NoneType")
        return graph_module.forward

    decoder = EngineCore(model, slots=2, max_cache_len=32, compile_backend=backend, step="fused", buckets=[1, 2])
    decoder.start()
    assert decoder.sampling_fallback is not None
    before = len(calls)
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    got = decoder.generate([ids[0][:4]], 5, eos_token_id=None, sampling=sampling)
    assert len(calls) == before  # nothing compiled again
    plain = EngineCore(model, slots=2, max_cache_len=32, step="fused", buckets=[1, 2])
    assert got == plain.generate([ids[0][:4]], 5, eos_token_id=None, sampling=sampling)


def test_a_fallback_after_a_graph_break_restores_what_the_first_graph_moved(llama):
    """With a graph break before the filter, the part before it has run when the filter's compile fails: the retry
    starts from the buffers as they were, so the cache length and position move once (the model step over a
    StaticCache, no device graphs)."""
    from hwrun.inference.decode import sampling as sampling_module
    from hwrun.inference.decode.static import GraphDecoder

    model, ids = llama
    real = sampling_module.next_tokens

    def broken_next_tokens(*args, **kwargs):
        torch._dynamo.graph_break()
        return real(*args, **kwargs)

    import hwrun.inference.decode.static as static_module

    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    prompt = torch.tensor([ids[0][:4]])
    plain = GraphDecoder(model, max_cache_len=32, step="model", use_graphs=False)
    want = plain.generate(prompt, 6, eos_token_id=None, sampling=sampling)
    static_module.next_tokens = broken_next_tokens
    try:
        compiled = GraphDecoder(model, max_cache_len=32, compile_backend=_fails_on_sort, step="model",
                                use_graphs=False)
        got = compiled.generate(prompt, 6, eos_token_id=None, sampling=sampling)
    finally:
        static_module.next_tokens = real
    assert compiled.sampling_fallback is not None
    assert [int(x) for x in compiled._cache_lengths()] == [int(x) for x in plain._cache_lengths()]
    assert int(compiled.position[0]) == int(plain.position[0])
    assert torch.equal(got, want)


def test_a_failure_other_than_compiling_is_not_taken_for_one(llama):
    """Only torch.compile's backend failures switch the filter to eager; an error while the step runs propagates."""
    model, ids = llama

    def backend(graph_module, inputs):
        def broken(*args):
            raise RuntimeError("a kernel failed")
        return broken

    decoder = EngineCore(model, slots=2, max_cache_len=32, compile_backend=backend, step="fused", buckets=[2])
    with pytest.raises(RuntimeError, match="a kernel failed"):
        decoder.generate([ids[0][:4]], 3, eos_token_id=None, sampling=SamplingParams(temperature=0.8, seed=1))
    assert decoder.sampling_fallback is None


# ---- review fixes (2026-12-05) ---------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["fused", "model"])
def test_a_one_token_prompt_admitted_beside_another_is_a_prefill_not_a_step(llama, step):
    """A one-token prompt prefilled into row 1 took the fused step's decode path (length 1), writing rows 0..0 and
    corrupting both requests; a prefill passes its rows, so it is one whatever its length."""
    model, prompts = llama
    longer, one = prompts[0], prompts[0][:1]
    decoder = EngineCore(model, slots=2, max_cache_len=48, step=step)
    decoder.add("a", longer, max_new_tokens=6, eos_token_id=None)
    decoder.add("b", one, max_new_tokens=6, eos_token_id=None)
    streams: dict = {}
    _drain(decoder, streams)
    assert streams["a"] == _reference(model, longer, 6) and streams["b"] == _reference(model, one, 6)
    rows = EngineCore(model, slots=2, max_cache_len=48, step=step, prefill_tokens=len(longer)).generate(
        [longer, one], 6, eos_token_id=None)
    assert rows == [_reference(model, longer, 6), _reference(model, one, 6)]


def test_unseeded_prompts_admitted_into_freed_rows_draw_their_own_seeds(gpt2):
    """A freed row kept the seed of the request it held (or of one moved into it): equal unseeded prompts
    admitted later repeated each other's samples."""
    model, prompts = gpt2
    torch.manual_seed(0)
    rows = EngineCore(model, slots=2, max_cache_len=32, step="model", check_every=1).generate(
        [prompts[0]] * 4, [2, 8, 8, 8], eos_token_id=None, sampling=SamplingParams(temperature=1.0))
    assert len({tuple(r) for r in rows[1:]}) == 3, rows


def test_longrope_and_dynamic_rope_are_refused_for_slots_with_the_reason():
    """Longrope switches to its long factors for the whole batch once any row passes the original context, and
    dynamic RoPE rescales from the batch's longest row: rows would change each other's tokens."""
    from hwrun.inference.engine import slot_step_support
    from transformers import AutoModelForCausalLM, LlamaConfig, Phi3Config

    phi3 = AutoModelForCausalLM.from_config(Phi3Config(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=16, pad_token_id=0,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                         "long_factor": [8.0, 16.0, 32.0, 64.0]}))
    step, why = slot_step_support(phi3, max_cache_len=48)
    assert step is None and "'longrope'" in why and "original_max_position_embeddings=16" in why
    assert slot_step_support(phi3, max_cache_len=16)[0] == "model"  # every position within the original context
    with pytest.raises(FastDecodeError, match="longrope"):
        EngineCore(phi3, slots=2, max_cache_len=48)
    llama = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}))
    step, why = slot_step_support(llama, max_cache_len=32)
    assert step is None and "'dynamic'" in why


def test_generate_compiles_few_row_buckets():
    """generate()'s slot decoder with a compiled step keeps 1, 8 and the batch (a draining batch would compile
    once per power of two mid-run otherwise); uncompiled it keeps every power of two."""
    from hwrun.inference.engine import compiled_buckets

    assert compiled_buckets(64, compiled=True) == (1, 8, 64)
    assert compiled_buckets(16, compiled=False) is None
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, _ = hwrun.load(plan)
    from hwrun.inference.decision import planned
    from hwrun.inference.generate import _decoder

    plain_decision = planned(plan, 16, decode="graphs")
    compiled_decision = dataclasses.replace(plain_decision, compile_backend="eager", buckets=(1, 8, 16))
    compiled = _decoder(model, 40, compiled_decision, plan.accelerator.platform)
    plain = _decoder(model, 40, plain_decision, plan.accelerator.platform)
    assert plain_decision.runner == "engine" and plain_decision.buckets is None
    assert compiled.buckets == (1, 8, 16) and plain.buckets == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("step", ["fused", "model"])
def test_requests_added_together_share_one_prefill_and_a_pending_one_can_move_or_leave(llama, step):
    """add() only reserves a slot; the next step() prefills every request added since in padded groups (one
    forward here). A pending request can be cancelled (no prefill, its slot freed) or moved down when a lower
    request leaves before the step; the tokens still equal model.generate's."""
    model, ids = llama
    decoder = EngineCore(model, slots=4, max_cache_len=64, step=step)
    decoder.add("a", ids[0], max_new_tokens=3, eos_token_id=None)
    decoder.add("b", ids[1], max_new_tokens=3, eos_token_id=None)
    decoder.add("c", ids[2], max_new_tokens=3, eos_token_id=None)
    assert decoder.prefills == 0 and decoder.free_slots == 1
    decoder.cancel("a")  # pending: nothing to undo; c (pending, highest) moves into slot 0
    assert decoder.free_slots == 2 and decoder.moves == 1
    streams: dict = {}
    _step(decoder, streams)
    assert decoder.prefills == 1  # b and c in one forward
    _drain(decoder, streams)
    assert streams == {"b": _reference(model, ids[1], 3), "c": _reference(model, ids[2], 3)}


def test_a_recompile_that_fails_after_the_first_run_falls_back_too():
    """with_filter_fallback keeps catching compile failures after the step first ran (a later recompile, e.g. after a
    guard fails); only the first run's buffers are kept and restored."""
    import torch._dynamo.exc as dynamo_exc
    from hwrun.inference.engine.graphs import FilterChoice, with_filter_fallback

    class Decoder:
        sampling_fallback = None

        def __init__(self):
            self.token = torch.zeros(2, dtype=torch.long)

        def step_buffers(self):
            return [self.token]

    failure = dynamo_exc.BackendCompilerFailed.__new__(dynamo_exc.BackendCompilerFailed)
    failure.inner_exception = TypeError("list indices must be integers or slices, not NoneType")
    decoder, choice, calls = Decoder(), FilterChoice(), []

    def compiled():
        calls.append(choice.filter is None)
        decoder.token.add_(1)
        if len(calls) == 2:
            raise failure

    run = with_filter_fallback(compiled, choice, decoder)
    run()
    run()  # the second call's "recompile" fails: retried with the eager filter
    assert calls == [True, True, False] and choice.filter is not None
    assert "list indices" in decoder.sampling_fallback
    with pytest.raises(ValueError, match="block=1"):
        from hwrun.inference.decode.sampling import block_cumsum

        block_cumsum(torch.rand(2, 10), block=1)
