"""A bounded soak of `hwrun serve` (issue 42): the real server (HTTP front + engine-core process, the shipped tiny
model, CPU) under 32 seeded clients for 20 s after a 5 s warm-up, clients leaving streams and whole answers at
random points. Every request finishes or is cancelled by its client (none hangs, fails or is refused), the server
counts exactly the requests the clients sent and ends idle, both processes' RSS stays within `RSS_BOUND_MIB` and
their open descriptors at the baseline's count, and SIGTERM ends both with exit 0. The same code runs for 10
minutes at 64 streams as `python tools/soak_serve.py` (its figures are in docs/reliability.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import soak_serve  # noqa: E402


@pytest.mark.slow
def test_a_bounded_soak_keeps_every_request_accounted_for_and_memory_and_files_flat():
    # 20 s after 5 s (issue 40.2; 40 s after 10 s before): 1,328 and 1,527 requests at load 3, 686 beside two busy
    # loops (1,544 in 40 s at load 4.7), 2026-12-06. Each must finish or be cancelled and be counted, descriptors stay
    # at the baseline (one leaked fails), RSS moved 0.1-0.5 MiB of the 16 MiB bound; 25 s less of both cores.
    report = soak_serve.soak(20, 32, warmup_seconds=5, seed=42)
    assert report.problems == [], report.summary()
    assert report.requests["finished"] > 0 and report.requests["cancelled"] > 0


def _report(**changes) -> soak_serve.SoakReport:
    reading = soak_serve.Reading(600.0, 1100.0, 25, 12)
    report = soak_serve.SoakReport(16, 30, 10, 0, requests={"finished": 5, "cancelled": 5},
                                   server={"ok": 6, "cancelled": 4}, baseline=reading, final=reading, exit_code=0)
    for name, value in changes.items():
        setattr(report, name, value)
    return report


LEAKS = [
    pytest.param({}, [], id="flat"),
    pytest.param({"final": soak_serve.Reading(600.0, 1100.0, 26, 12)}, ["front holds 1 more open descriptors"],
                 id="a-socket-left-open"),
    pytest.param({"final": soak_serve.Reading(600.0, 1100.0 + soak_serve.RSS_BOUND_MIB + 1, 25, 12)},
                 ["core's RSS grew"], id="core-memory-grew"),
    pytest.param({"requests": {"finished": 5, "cancelled": 4, "hang": 1}}, ["neither finished nor cancelled"],
                 id="a-hang"),
    pytest.param({"server": {"ok": 6, "cancelled": 3}}, ["the server counted 9 requests"], id="a-request-lost"),
    pytest.param({"server": {"ok": 5, "cancelled": 4, "error": 1}}, ["otherwise than ok or cancelled"],
                 id="a-server-error"),
    pytest.param({"exit_code": 1}, ["exit 1, not 0"], id="sigterm-exit-1"),
]


@pytest.mark.parametrize(("changes", "problems"), LEAKS)
def test_the_soak_judge_fails_on_each_kind_of_leak(changes, problems):
    report = _report(**changes)
    soak_serve._judge(report, soak_serve.RSS_BOUND_MIB, soak_serve.FD_SLACK)
    assert len(report.problems) == len(problems), report.problems
    for problem, words in zip(report.problems, problems, strict=True):
        assert words in problem
