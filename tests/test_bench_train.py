"""tools/bench/train.py's combining of repeated runs (no timing here: the figures are made up)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "bench" / "train.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(config, tokens, peak=10, gpu=None):
    return {"config": config, "tokens_per_s": tokens, "median_step_s": 8192 / tokens, "peak_bytes": peak, "gpu": gpu}


def test_repeated_configs_become_one_row_each_with_the_median_in_first_run_order():
    rows = _bench().combine_runs([_run("plain", 70.0, peak=16), _run("hwrun", 85.0, gpu={"sm_clock_mhz": 1965}),
                                  _run("plain", 74.0, peak=17), _run("hwrun", 86.0), _run("qlora", 30.0)])
    assert [r["config"] for r in rows] == ["plain", "hwrun", "qlora"]
    plain, hwrun, qlora = rows
    assert plain["tokens_per_s"] == 72.0 and plain["runs_tokens_per_s"] == [70, 74]
    assert plain["median_step_s"] == (8192 / 70 + 8192 / 74) / 2
    assert plain["peak_bytes"] == 17  # the largest peak of its runs
    assert hwrun["gpu_runs"] == [{"sm_clock_mhz": 1965}, None]
    assert "runs_tokens_per_s" not in qlora and qlora["tokens_per_s"] == 30.0


def test_a_failed_repeat_is_listed_and_left_out_of_the_median():
    rows = _bench().combine_runs([_run("hwrun", 85.0), {"config": "hwrun", "error": "timed out after 150s"},
                                  {"config": "plain", "error": "boom"}])
    hwrun, plain = rows
    assert hwrun["tokens_per_s"] == 85.0 and hwrun["runs_tokens_per_s"] == [85, "timed out after 150s"]
    assert plain == {"config": "plain", "error": "boom"}
