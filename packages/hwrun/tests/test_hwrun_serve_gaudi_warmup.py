"""The slot engine's warm-up reports each (rows, cache length) bucket as it is captured (issue 35.5): on the Gaudi
fake (hwenv.testing, lazy mode: HPU graphs record), `SlotsBackend.start(progress=...)` gets one line per bucket, in
ascending shape, each after its bucket's captures and before the next bucket's; through a server whose engine core
builds that backend, the same lines reach the start-up log (`Progress` messages) before the engine is ready. An eager
CPU engine has nothing to capture and reports nothing. Source of what the fake records: gaudi-pytorch-bridge 1.19.0
(../shared/INTEL.md S8: `habana_frameworks/torch/hpu/graphs.py` `HPUGraph`, exported only in lazy mode), to which
packages/hwenv/tests/test_hwenv_fake_graphs.py holds the fake's graph classes."""

from __future__ import annotations

import re

import hwrun
import pytest
from hwenv.platforms import get_platform
from hwenv.testing import fake_gaudi
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore
from hwrun.inference.engine.choosing import KINDS
from hwrun.serve.backend_slots import SlotsBackend

#: The buckets of `_engine()`: rows 1, 2, 4 (powers of two and the slots) x cache lengths 16 and 40.
SHAPES = [(1, 16), (1, 40), (2, 16), (2, 40), (4, 16), (4, 40)]
LINE = re.compile(r"warm-up: bucket (\d+)/(\d+) \((\d+) rows? x (\d+) cache positions\): (\d+) HPU graphs captured "
                  r"in \d+\.\d\d s")


@pytest.fixture(scope="module")
def loaded():
    return hwrun.load(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))


def _engine(model, **options):
    return EngineCore(model, slots=4, max_cache_len=40, cache_buckets=(16,), platform=get_platform("hpu"), **options)


def _check_lines(lines):
    found = [LINE.fullmatch(line) for line in lines]
    assert all(found), lines
    numbers = [tuple(int(g) for g in match.groups()) for match in found]
    assert numbers == [(i, len(SHAPES), rows, columns, len(KINDS)) for i, (rows, columns) in enumerate(SHAPES, 1)]


def test_the_warm_up_reports_each_bucket_in_order_on_the_gaudi_fake(loaded):
    model, _ = loaded
    with fake_gaudi(1, lazy_mode="1") as fake:
        core = _engine(model)
        assert core.use_graphs and core.graph_tools.api == "hpu_graphs"
        backend = SlotsBackend(core, sampling_class=SamplingParams, eos_token_id=None)
        lines, captured = [], []

        def progress(line):
            lines.append(line)
            captured.append(fake.graph_events.count("capture_end"))  # the captures done when the line came

        backend.start(progress=progress)
        _check_lines(lines)
        # each line comes once its bucket's six step kinds are captured, before the next bucket's captures
        assert captured == [len(KINDS) * i for i in range(1, len(SHAPES) + 1)]
        assert fake.graph_events.count("capture_begin") == len(SHAPES) * len(KINDS) and "replay" not in fake.graph_events
        assert core.runner.progress is None  # the callback does not outlive the start
        again: list[str] = []
        backend.start(progress=again.append)  # a second start captures nothing and says so
        assert [line.split(": ", 2)[2] for line in again] == ["warm already"] * len(SHAPES)
        assert fake.graph_events.count("capture_begin") == len(SHAPES) * len(KINDS)


def test_an_eager_engine_has_nothing_to_warm_and_reports_nothing(loaded):
    model, _ = loaded
    core = EngineCore(model, slots=2, max_cache_len=40, use_graphs=False)
    lines: list[str] = []
    SlotsBackend(core, sampling_class=SamplingParams, eos_token_id=None).start(progress=lines.append)
    assert lines == [] and core.runner.warmed  # every bucket is marked warm: nothing to capture or compile


def test_the_warm_up_lines_reach_the_server_start_up_log_before_it_is_ready(loaded):
    from hwrun.serve.backend import EngineChoice
    from hwrun.serve.config import ServeConfig
    from hwrun.serve.server import ServerThread
    from hwrun.serve.startup import Loaded

    model, tokenizer = loaded

    def loader(plan, config):  # what start-up does for a slot engine, on the fake: build it, then start it
        backend = SlotsBackend(_engine(model), sampling_class=SamplingParams, eos_token_id=None, tokenizer=tokenizer)
        backend.start()  # no progress given: the engine core's START_PROGRESS sends each line to the front
        return Loaded(tokenizer=tokenizer, choice=EngineChoice("slots", "test: the Gaudi fake"), max_model_len=40,
                      max_model_len_reason="test", eos_ids=(), backend=backend, load_seconds=0.0, warm_seconds=0.0)

    lines: list[str] = []
    with fake_gaudi(1, lazy_mode="1"):
        config = ServeConfig(port=0, max_concurrency=4, max_queue=4, model_id="tiny", max_model_len=40)
        with ServerThread(config, hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), loader=loader, say=lines.append):
            pass
    warm = [line for line in lines if line.startswith("warm-up: ")]
    _check_lines(warm)
    engine_line = next(i for i, line in enumerate(lines) if line.startswith("engine: slots"))
    assert lines.index(warm[-1]) < engine_line  # said while the engine started, before it was ready
