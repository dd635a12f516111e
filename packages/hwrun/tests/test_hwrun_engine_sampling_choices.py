"""Several choices of one prompt (`n`), extra stop ids, and grammar masks in hwrun's engine (issue 36.3 / 36.2): the
prompt is prefilled once and its K/V copied into the other choices' slots (fused and model step), greedy choices all
equal `model.generate`'s, seeded choices differ from each other and repeat run to run; a grammar matcher (a fake
allowing a fixed set of ids) sees every token in order, its bitmask is applied inside the step, a finished grammar
ends its choice with "stop" and a rejected token ends it with an error event."""

from __future__ import annotations

import hwrun
import pytest
import torch
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore
from hwrun.testing.families import build_tiny_family

TEXTS = ["The king said", "Once upon a time there was a little house", "It was"]


@pytest.fixture(scope="module")
def llama():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return model, [tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("gpt2", tmp_path_factory.mktemp("choices") / "gpt2")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def _generate(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def _run(engine, requests, steps=200):
    for request in requests:
        engine.add(**request)
    tokens, events = {}, []
    for _ in range(steps):
        if not engine.active:
            break
        for event in engine.step():
            events.append(event)
            if event.token_id is not None:
                tokens.setdefault((event.request_id, event.index), []).append(event.token_id)
    assert not engine.active
    return tokens, events


class FakeMatcher:
    """Allows only `allowed` ids; finished after `length` tokens; records what it accepted."""

    def __init__(self, allowed, length=None, reject=False):
        self.allowed, self.length, self.reject = sorted(allowed), length, reject
        self.accepted = []

    def fill(self, bitmask, row):
        bitmask[row] = 0
        for token in self.allowed:
            word, bit = divmod(token, 32)
            bitmask[row, word] |= (1 << bit) if bit < 31 else -(1 << 31)

    def accept(self, token):
        if self.reject or token not in self.allowed:
            return False
        self.accepted.append(token)
        return True

    @property
    def finished(self):
        return self.length is not None and len(self.accepted) >= self.length


@pytest.mark.parametrize("family, step", [("llama", "fused"), ("llama", "model"), ("gpt2", "model")])
def test_choices_share_one_prefill_and_greedy_ones_equal_generate(llama, gpt2, family, step):
    model, ids = llama if family == "llama" else (gpt2, [[5, 9, 14, 22, 31], [2, 7, 11], [40, 41]])
    engine = EngineCore(model, slots=6, max_cache_len=64, step=step, prefill_chunk=3)  # a prompt in chunks
    tokens, events = _run(engine, [dict(request_id="n3", input_ids=ids[1], max_new_tokens=7, n=3, eos_token_id=None),
                                   dict(request_id="one", input_ids=ids[0], max_new_tokens=5, eos_token_id=None)])
    expected = _generate(model, ids[1], 7)
    assert [tokens[("n3", i)] for i in range(3)] == [expected] * 3
    assert tokens[("one", 0)] == _generate(model, ids[0], 5)
    assert {e.index for e in events if e.request_id == "n3" and e.finished} == {0, 1, 2}
    chunks_of = -(-len(ids[1]) // 3) + -(-len(ids[0]) // 3)  # the n=3 prompt prefilled once, in chunks
    assert engine.prefills <= chunks_of


def test_seeded_choices_differ_from_each_other_and_repeat(llama):
    model, ids = llama
    sampling = SamplingParams(temperature=1.2, seed=7)
    runs = []
    for _ in range(2):
        engine = EngineCore(model, slots=4, max_cache_len=64)
        tokens, _ = _run(engine, [dict(request_id="r", input_ids=ids[0], max_new_tokens=8, n=4, sampling=sampling,
                                       eos_token_id=None)])
        runs.append([tokens[("r", i)] for i in range(4)])
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) == 4
    alone, _ = _run(EngineCore(model, slots=4, max_cache_len=64),
                    [dict(request_id="r", input_ids=ids[0], max_new_tokens=8, sampling=sampling, eos_token_id=None)])
    assert alone[("r", 0)] == runs[0][0]  # choice 0 is the request as if n were 1


def test_choices_need_free_slots_and_one_choice_can_be_cancelled(llama):
    model, ids = llama
    engine = EngineCore(model, slots=3, max_cache_len=64)
    with pytest.raises(FastDecodeError, match="n=4 choices"):
        engine.add("a", ids[0], max_new_tokens=3, n=4)
    engine.add("b", ids[0], max_new_tokens=3)
    with pytest.raises(FastDecodeError, match="2 of 3 slots free for its 3 choice"):
        engine.add("a", ids[0], max_new_tokens=3, n=3)
    engine.cancel("b")
    engine.add("a", ids[1], max_new_tokens=6, n=3, eos_token_id=None)
    engine.step()
    engine.cancel("a", 1)
    assert engine.free_slots == 1 and engine.active == {"a"}
    tokens = {}
    while engine.active:
        for event in engine.step():
            tokens.setdefault(event.index, []).append(event.token_id)
    assert sorted(tokens) == [0, 2] and tokens[0] == tokens[2] == _generate(model, ids[1], 6)[1:]


def test_a_cancelled_leader_hands_its_prefill_to_the_next_choice(llama):
    model, ids = llama
    engine = EngineCore(model, slots=3, max_cache_len=64, prefill_chunk=2)
    engine.add("a", ids[1], max_new_tokens=4, n=3, eos_token_id=None)
    engine.step()  # the leader's first chunk
    engine.cancel("a", 0)
    tokens, _ = _run(engine, [])
    assert tokens[("a", 1)] == tokens[("a", 2)] == _generate(model, ids[1], 4)


def test_extra_stop_ids_end_a_choice_with_stop(llama):
    model, ids = llama
    expected = _generate(model, ids[0], 8)
    stop = expected[3]
    engine = EngineCore(model, slots=2, max_cache_len=64)
    tokens, events = _run(engine, [dict(request_id="a", input_ids=ids[0], max_new_tokens=8, eos_token_id=[stop])])
    assert tokens[("a", 0)] == expected[: expected.index(stop) + 1]
    assert events[-1].finish_reason == "stop"


def test_a_grammar_mask_constrains_every_token_and_ends_the_choice(llama):
    model, ids = llama
    allowed = {15, 42, 300, 1031, 2047}
    grammar, free = FakeMatcher(allowed, length=5), None
    engine = EngineCore(model, slots=3, max_cache_len=64)
    tokens, events = _run(engine, [
        dict(request_id="g", input_ids=ids[0], max_new_tokens=12, eos_token_id=None, matchers=[grammar],
             sampling=SamplingParams(temperature=1.0, seed=5)),
        dict(request_id="free", input_ids=ids[1], max_new_tokens=6, eos_token_id=None, matchers=free)])
    assert set(tokens[("g", 0)]) <= allowed and len(tokens[("g", 0)]) == 5
    assert grammar.accepted == tokens[("g", 0)]
    assert [e.finish_reason for e in events if e.request_id == "g" and e.finished] == ["stop"]
    assert tokens[("free", 0)] == _generate(model, ids[1], 6)  # an unconstrained row in the masked step


def test_choices_each_get_their_own_matcher(llama):
    model, ids = llama
    matchers = [FakeMatcher({100, 200}, length=3), FakeMatcher({300}, length=2)]
    engine = EngineCore(model, slots=2, max_cache_len=64)
    tokens, _ = _run(engine, [dict(request_id="g", input_ids=ids[2], max_new_tokens=9, n=2, matchers=matchers,
                                   eos_token_id=None)])
    assert set(tokens[("g", 0)]) <= {100, 200} and len(tokens[("g", 0)]) == 3
    assert tokens[("g", 1)] == [300, 300]


def test_a_rejected_token_ends_the_choice_with_an_error_event(llama):
    model, ids = llama
    engine = EngineCore(model, slots=2, max_cache_len=64)
    tokens, events = _run(engine, [
        dict(request_id="bad", input_ids=ids[0], max_new_tokens=8, eos_token_id=None,
             matchers=[FakeMatcher({15, 42}, reject=True)]),
        dict(request_id="ok", input_ids=ids[1], max_new_tokens=4, eos_token_id=None)])
    (failed,) = [e for e in events if e.request_id == "bad" and e.finished]
    assert failed.finish_reason == "error" and failed.token_id is None and "grammar rejected token" in failed.error
    assert tokens[("ok", 0)] == _generate(model, ids[1], 4)
    assert engine.free_slots == 2


def test_a_replayed_graph_reads_each_steps_mask_from_its_fixed_buffer(llama):
    from hwenv.platforms import get_platform
    from hwenv.testing import fake_xpu

    model, ids = llama
    with fake_xpu(1) as fake:
        engine = EngineCore(model, slots=2, max_cache_len=48, platform=get_platform("xpu"), buckets=[2])
        engine.start(processed=True)
        captured = fake.graph_events.count("capture_begin")
        grammar = FakeMatcher({15, 42, 300}, length=6)
        tokens, _ = _run(engine, [dict(request_id="g", input_ids=ids[0], max_new_tokens=10, eos_token_id=None,
                                       matchers=[grammar]),
                                  dict(request_id="free", input_ids=ids[2], max_new_tokens=6, eos_token_id=None)])
        assert fake.graph_events.count("capture_begin") == captured and "replay" in fake.graph_events
    assert len(tokens[("g", 0)]) == 6 and set(tokens[("g", 0)]) <= {15, 42, 300}
    assert grammar.accepted == tokens[("g", 0)]
    assert tokens[("free", 0)] == _generate(model, ids[2], 6)
