"""KV use in `/metrics` (issue 35.2 and 35.4): the slot engine's blocks in use, prefix-cache queries and hits,
preemptions and requests waiting for blocks travel from the engine core with every `Batch` and are rendered in
Prometheus text by the front. A served request sharing a system prompt with an earlier one makes the hit counter
rise; a forced small pool makes preemptions rise, and the served tokens still equal Transformers' greedy. A served
long prompt joining running streams is prefilled in chunks (issue 35.3) between their decode steps, and every
request's tokens still equal Transformers' greedy."""

from __future__ import annotations

import asyncio

import hwrun
import msgspec
import pytest
import torch
from hwrun.inference.engine import EngineCore
from hwrun.inference.engine.kv_memory import KVStats
from hwrun.serve.backend_slots import SlotsBackend
from hwrun.serve.engine import Engine, EngineRequest
from hwrun.serve.ipc import Batch
from hwrun.serve.metrics import Metrics
from hwrun.serve.protocol import Sampling

GREEDY = Sampling(temperature=0.0)
SYSTEM = [(7 * i) % 90 + 5 for i in range(40)]  # two full blocks of 16 and 8 more tokens


@pytest.fixture(scope="module")
def model():
    return hwrun.load(hwrun.plan())[0]


def _greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


async def _started(engine) -> None:
    """Start the front's engine on the running loop and wait (up to 5 s) until it is ready or failed."""
    engine.start(asyncio.get_running_loop())
    for _ in range(500):
        if engine.state in ("ready", "failed"):
            break
        await asyncio.sleep(0.01)


def _serve(backend, waves):
    """Each wave of requests served through a front over a thread core, one wave after the other; (tokens by
    request id, the front's Engine, the /metrics text after the last wave)."""
    engine = Engine(lambda: backend, max_concurrency=backend.capacity, max_queue=8)
    tokens: dict[str, list[int]] = {}

    async def main():
        await _started(engine)
        for wave in waves:
            done = {r.request_id: asyncio.Event() for r in wave}
            for request in wave:
                tokens[request.request_id] = []

                def sink(event, rid=request.request_id, done=done):
                    tokens[rid].extend(event.token_ids)
                    if event.finished:
                        done[rid].set()
                engine.submit(request, sink)
            await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done.values())), 60)
        for _ in range(100):  # the batch that finished the last request carries the counters after it
            if engine.running == 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.to_thread(engine.stop)

    asyncio.run(main())
    return tokens, engine, Metrics(kv_stats=lambda: engine.kv_stats).render()


def _serve_joining(backend, running, joining, after: int):
    """Serve `running` through a front over a thread core, then submit `joining` once each running request has
    `after` tokens (it joins while they decode); the tokens by request id."""
    engine = Engine(lambda: backend, max_concurrency=backend.capacity, max_queue=8)
    tokens: dict[str, list[int]] = {}

    async def main():
        await _started(engine)
        assert engine.state == "ready"
        done = {r.request_id: asyncio.Event() for r in [*running, joining]}

        def submit(request):
            tokens[request.request_id] = []

            def sink(event, rid=request.request_id):
                tokens[rid].extend(event.token_ids)
                if event.finished:
                    done[rid].set()
            engine.submit(request, sink)
        for request in running:
            submit(request)
        for _ in range(3000):
            if all(len(tokens[r.request_id]) >= after for r in running):
                break
            await asyncio.sleep(0.001)
        assert not any(done[r.request_id].is_set() for r in running), "the streams ended before the join"
        submit(joining)
        await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done.values())), 60)
        await asyncio.to_thread(engine.stop)

    asyncio.run(main())
    return tokens


def _value(text, name):
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def test_kv_stats_cross_the_ipc_and_render_as_gauges_and_counters():
    stats = KVStats(blocks=200, used_blocks=50, queried_tokens=320, hit_tokens=64, preemptions=3, waiting_for_blocks=2)
    assert stats.usage == 0.25 and KVStats(*stats.as_list()) == stats
    batch = Batch([], 1, 0, 3, 7, stats.as_list())
    encoded = msgspec.msgpack.encode(batch)
    assert msgspec.msgpack.decode(encoded, type=Batch).kv == stats.as_list()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(Batch([], 1, 0, 3, 7)), type=Batch).kv is None
    text = Metrics(kv_stats=lambda: stats.as_list()).render()
    assert "hwrun_kv_cache_usage_ratio 0.250000" in text and "hwrun_kv_cache_used_blocks 50" in text
    assert "# TYPE hwrun_prefix_cache_queries_total counter" in text and "hwrun_prefix_cache_hits_total 64" in text
    assert "hwrun_preemptions_total 3" in text and "hwrun_requests_waiting_for_blocks 2" in text
    assert "# TYPE hwrun_requests_waiting_for_blocks gauge" in text
    assert "hwrun_kv_cache_usage_ratio" not in Metrics().render()  # the transformers engine has no blocks


def test_a_served_shared_system_prompt_raises_the_prefix_hit_counter(model):
    core = EngineCore(model, slots=2, max_cache_len=96, prefill_chunk=64)
    backend = SlotsBackend(core, sampling_class=hwrun.inference.decode.SamplingParams, eos_token_id=None)
    first, second = [*SYSTEM, 9, 12, 3], [*SYSTEM, 21, 4]
    tokens, engine, text = _serve(backend, [[EngineRequest("a", tuple(first), 5, GREEDY)],
                                            [EngineRequest("b", tuple(second), 6, GREEDY)]])
    assert tokens["a"] == _greedy(model, first, 5) and tokens["b"] == _greedy(model, second, 6)
    assert _value(text, "hwrun_prefix_cache_hits_total") == 32  # b found a's two full blocks
    assert _value(text, "hwrun_prefix_cache_queries_total") == 64  # a looked up 2 blocks, b 2
    assert _value(text, "hwrun_preemptions_total") == 0 and _value(text, "hwrun_kv_cache_used_blocks") == 0
    assert _value(text, "hwrun_requests_waiting_for_blocks") == 0


def test_a_forced_small_pool_raises_preemptions_and_keeps_the_tokens(model):
    per_token = EngineCore(model, slots=1, max_cache_len=16).kv_report.bytes_per_token
    core = EngineCore(model, slots=3, max_cache_len=64, prefill_chunk=16, kv_cache_memory=5 * 16 * per_token,
                      prefix_caching=False)
    assert core.kv.num_blocks == 5
    backend = SlotsBackend(core, sampling_class=hwrun.inference.decode.SamplingParams, eos_token_id=None)
    prompts = [[(3 * i + k) % 80 + 4 for i in range(n)] for k, n in ((1, 11), (5, 13), (9, 7))]
    requests = [EngineRequest(str(i), tuple(p), 18, GREEDY) for i, p in enumerate(prompts)]
    tokens, engine, text = _serve(backend, [requests])
    for i, prompt in enumerate(prompts):
        assert tokens[str(i)] == _greedy(model, prompt, 18), f"request {i}"
    assert _value(text, "hwrun_preemptions_total") == core.scheduler.preemptions > 0
    assert engine.kv_stats is not None and KVStats(*engine.kv_stats).blocks == 5


def test_the_scheduler_counts_requests_waiting_for_blocks(model):
    per_token = EngineCore(model, slots=1, max_cache_len=16).kv_report.bytes_per_token
    core = EngineCore(model, slots=3, max_cache_len=64, prefill_chunk=64, kv_cache_memory=3 * 16 * per_token,
                      prefix_caching=False)
    core.add("long", list(range(5, 45)), max_new_tokens=4, eos_token_id=None)  # 40 + 1 positions: all 3 blocks
    core.add("next", list(range(5, 12)), max_new_tokens=4, eos_token_id=None)
    core.step()
    stats = core.kv_stats()
    assert stats.used_blocks == 3 and stats.usage == 1.0 and stats.waiting_for_blocks == 1
    while core.active:
        core.step()
    assert core.kv_stats().used_blocks == 0 and core.kv_stats().waiting_for_blocks == 0


def test_a_served_long_prompt_joining_running_streams_is_prefilled_in_chunks(model):
    core = EngineCore(model, slots=3, max_cache_len=96, prefill_chunk=16, prefix_caching=False)
    assert core.prefill_chunk == 16
    plans: list[tuple[str, int, int, bool, frozenset[str]]] = []  # (request, start, tokens, last, decoding then)
    plan = core.scheduler.prefill_plan

    def recording_plan(*args, **kwargs):
        decoding = frozenset(r.request_id for r in core.scheduler.decoding())
        forwards = plan(*args, **kwargs)
        for forward in forwards:
            for chunk in forward:
                request = core.scheduler.requests[core.kv.owner[chunk.slot]]
                plans.append((request.request_id, chunk.start, len(chunk.tokens), chunk.last, decoding))
        return forwards

    core.scheduler.prefill_plan = recording_plan
    backend = SlotsBackend(core, sampling_class=hwrun.inference.decode.SamplingParams, eos_token_id=None)
    streams = [[(5 * i + k) % 80 + 4 for i in range(6)] for k in (1, 2)]
    long = [(11 * i + 3) % 90 + 5 for i in range(40)]
    running = [EngineRequest(f"s{k}", tuple(p), 80, GREEDY) for k, p in enumerate(streams)]
    tokens = _serve_joining(backend, running, EngineRequest("long", tuple(long), 8, GREEDY), after=3)
    assert tokens["long"] == _greedy(model, long, 8)
    for k, prompt in enumerate(streams):
        assert tokens[f"s{k}"] == _greedy(model, prompt, 80), f"stream {k}"
    chunks = [(start, size, last, decoding) for rid, start, size, last, decoding in plans if rid == "long"]
    assert [(start, size, last) for start, size, last, _ in chunks] == [(0, 16, False), (16, 16, False), (32, 8, True)]
    assert all(decoding == {"s0", "s1"} for *_, decoding in chunks)  # each chunk's step also decoded both streams
