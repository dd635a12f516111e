"""`hwrun generate --timings`: the wall time per phase (start-up, plan, load, generate) in the stderr summary and
in `--json`, so a slow start can be read phase by phase (issue 29)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from hwrun.cli.timings import PhaseClock, seconds_since_process_start


def test_phases_accumulate_in_order_and_the_total_includes_start_up(monkeypatch):
    ticks = iter([10.0, 10.5, 12.0, 12.25])  # start, plan, load, plan again
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr("hwrun.cli.timings.seconds_since_process_start", lambda: 2.0)
    clock = PhaseClock()
    clock.mark("plan")
    clock.mark("load")
    clock.mark("plan")
    assert clock.as_dict() == {"start-up": 2.0, "plan": 0.75, "load": 1.5, "total": 4.25}
    assert clock.summary() == ("timings: start-up 2.00s (interpreter and imports), plan 0.75s, load 1.50s, "
                               "total 4.25s")


def test_without_proc_the_start_up_is_unknown_not_zero(monkeypatch):
    monkeypatch.setattr("hwrun.cli.timings.seconds_since_process_start", lambda: None)
    clock = PhaseClock()
    clock.mark("generate")
    assert clock.as_dict()["start-up"] is None
    assert "start-up" not in clock.summary(first_token=0.5) and "(first token after 0.50s)" in clock.summary(0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_start_is_read_from_proc():
    seconds = seconds_since_process_start()
    assert seconds is not None and 0.0 <= seconds < 24 * 3600


def test_generate_prints_and_returns_its_timings(capsys):
    import hwrun
    from hwrun.cli.main import main

    assert main(["generate", "--model", hwrun.DEFAULT_MODEL, "--device", "cpu", "--max-new-tokens", "4",
                 "--timings", "The king said"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("[timings: ") and ", plan " in line and ", load " in line and "first token after" in line
    assert main(["generate", "--model", hwrun.DEFAULT_MODEL, "--device", "cpu", "--max-new-tokens", "4",
                 "--timings", "--json", "The king said"]) == 0
    timings = json.loads(capsys.readouterr().out)["timings"]
    assert list(timings) == ["start-up", "plan", "load", "generate", "total"]
    assert all(value >= 0 for value in timings.values() if value is not None)
    assert timings["total"] >= timings["plan"] + timings["load"] + timings["generate"]
