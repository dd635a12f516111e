"""The engine's step without host-device stalls (issue 35.4's async scheduling, the part built): the tokens a step
reports were produced before it, so their copy to the host is queued before the step and the host waits for that
copy alone, on an event, while the step runs; the block table reaches the device in one non-blocking copy, only
when a row changed, into the same storage (captured graphs stay valid); no whole-device synchronize. Counted
through a fake device event on CPU; greedy tokens still equal Transformers' under joins, leaves, preemption and
chunked prefill."""

from __future__ import annotations

import pytest
import torch
from hwenv.platforms import runtime
from hwrun.inference.engine import EngineCore
from hwrun.inference.engine.transfers import Transfers
from hwrun.testing.families import build_tiny_family

PROMPTS = [[(3 * i + k) % 80 + 4 for i in range(n)] for k, n in ((1, 11), (5, 19), (9, 7), (2, 23))]
BUDGETS = [21, 14, 26, 9]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_family("llama", tmp_path_factory.mktemp("async") / "llama")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def _greedy(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model.generate(torch.tensor([seq]), max_new_tokens=1, do_sample=False, pad_token_id=0)[0, -1]))
    return seq[len(prompt):]


class FakeEvent:
    """A device event that logs what the engine does with it (CPU work is done when queued: always passed)."""

    log: list[str] = []

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("wait")

    def query(self):
        return True


def _fake_device(engine, monkeypatch):
    """Give `engine` a device with events (the CPU's copies are synchronous, so the values stay right) and log
    its runs and any whole-device synchronize."""
    log = FakeEvent.log = []
    engine.kv.transfers.event_class = FakeEvent
    run = engine.runner.run

    def logged_run(*args, **kwargs):
        log.append("run")
        return run(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "run", logged_run)
    monkeypatch.setattr(runtime, "synchronize", lambda *a, **k: log.append("synchronize"))
    return log


@pytest.mark.parametrize("step", ["fused", "model"])
def test_each_step_waits_once_for_its_tokens_after_the_step_is_queued(model, monkeypatch, step):
    per_token = EngineCore(model, slots=1, max_cache_len=16, step=step).kv_report.bytes_per_token
    engine = EngineCore(model, slots=4, max_cache_len=64, step=step, prefill_chunk=8,
                        kv_cache_memory=7 * 16 * per_token)  # a small pool: preemption happens too
    log = _fake_device(engine, monkeypatch)
    table = engine.kv.table.data_ptr()
    streams: dict = {}
    for index in range(3):
        engine.add(index, PROMPTS[index], max_new_tokens=BUDGETS[index], eos_token_id=None)
    decode_steps = 0
    for turn in range(300):
        if turn == 4:
            engine.add(3, PROMPTS[3], max_new_tokens=BUDGETS[3], eos_token_id=None)
        start, copies = len(log), engine.kv.table_copies
        events = engine.step()
        mine = log[start:]
        if "run" in mine:
            decode_steps += 1
            at = mine.index("run")
            # the read of the reported tokens is queued before the step, and waited for after it is queued
            assert mine[:at].count("wait") == 0 and mine[at:].count("wait") == 1, mine
        assert engine.kv.table_copies - copies <= 1 + engine.prefills  # at most one table copy per forward
        for event in events:
            streams.setdefault(event.request_id, []).append(event.token_id)
        if 3 in streams and not engine.active:
            break
    assert "synchronize" not in log and decode_steps > 20
    assert engine.scheduler.preemptions > 0
    assert engine.kv.table.data_ptr() == table  # the captured steps' table: same storage
    assert torch.equal(engine.kv.table.cpu(), engine.kv.host_table)
    for index in range(4):
        assert streams[index] == _greedy(model, PROMPTS[index], BUDGETS[index]), f"request {index}"


def test_the_table_is_copied_only_when_a_row_changed(model):
    engine = EngineCore(model, slots=2, max_cache_len=64, step="fused")
    engine.add("a", PROMPTS[2], max_new_tokens=20, eos_token_id=None)  # 7 prompt tokens: blocks at 16, 32
    engine.step()  # the prefill (its blocks) and the first decode step
    copies = engine.kv.table_copies
    for _ in range(6):  # positions 8..13: inside its first block
        engine.step()
    assert engine.kv.table_copies == copies
    while engine.kv.table_copies == copies:
        engine.step()  # a step that writes position 16 gets a second block: one copy
    assert engine.kv.rows[0] and len(engine.kv.rows[0]) == 2 and engine.kv.table_copies == copies + 1


def test_transfers_without_a_device_are_plain_copies():
    transfers = Transfers(None, torch.device("cpu"))
    assert not transfers.pinned and transfers.event_class is None and transfers.record() is None
    source = torch.arange(12).reshape(3, 4)
    assert transfers.read_later(source, [2, 0], [1, 3])() == [9, 3] and transfers.waits == 0
    moved = transfers.to_device([1, 2, 3])
    assert moved.dtype == torch.long and moved.tolist() == [1, 2, 3]


def test_logprobs_are_read_without_waiting_before_the_step(model, monkeypatch):
    from hwrun.inference.decode import SamplingParams

    engine = EngineCore(model, slots=2, max_cache_len=64, step="fused")
    log = _fake_device(engine, monkeypatch)
    engine.add("lp", PROMPTS[0], max_new_tokens=6, eos_token_id=None, sampling=SamplingParams(logprobs=2))
    events = []
    while engine.active:
        start = len(log)
        events += engine.step()
        mine = log[start:]
        assert mine.count("run") == 1 and "wait" not in mine[:mine.index("run")], mine
    assert [e.token_id for e in events] == _greedy(model, PROMPTS[0], 6)
    for event, expected in zip(events, _greedy_logprobs(model, PROMPTS[0], [e.token_id for e in events]), strict=True):
        assert event.top[0][0] == event.token_id and len(event.top) == 2
        assert abs(event.logprob - expected) < 1e-4


def _greedy_logprobs(model, prompt, tokens):
    seq = list(prompt) + list(tokens)
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0, len(prompt) - 1:-1].float()
    return [float(row.log_softmax(-1)[t]) for row, t in zip(logits, tokens, strict=True)]


#: Tensor calls that make the host wait for a device (on a GPU): reads of values, and truth tests.
HOST_READS = {"item", "tolist", "__bool__", "nonzero", "cpu", "numpy", "__int__", "__float__", "__index__"}


@pytest.mark.parametrize("step", ["fused", "model"])
def test_a_steady_decode_step_reads_the_device_once(model, step):
    """Traced on CPU with a torch function mode: in steady decoding (no joins, no new blocks) a step's only host
    read is the one `tolist` of its reported tokens' host buffer, and every tensor made from host values goes
    through `transfers` (pinned, non-blocking where the device allows)."""
    from collections import Counter

    from torch.overrides import TorchFunctionMode

    class Reads(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in HOST_READS or name == "tensor":
                self.seen[name] += 1
            return func(*args, **(kwargs or {}))

    engine = EngineCore(model, slots=4, max_cache_len=64, step=step)
    for index in range(3):
        engine.add(index, [5 + index, 9, 14, 22], max_new_tokens=12, eos_token_id=None)
    for _ in range(2):
        engine.step()  # the prefills, the first blocks
    with Reads() as reads:
        for _ in range(5):  # positions 5..9: inside the first block
            assert len(engine.step()) == 3
    assert dict(reads.seen) == {"tolist": 5, "tensor": 5}  # per step: the token read, its index (transfers)
