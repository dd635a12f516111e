"""`hwrun.testing.launch_cpu_workers` past its timeout kills the launcher and every rank it started (killing the
launcher alone left two ranks spinning both cores of a test machine, issue 40)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from hwrun.testing import launch_cpu_workers

RANK = """
import os, sys, time
with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"]), "w") as out:
    out.write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_launch_past_its_timeout_leaves_no_rank_running(tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(RANK)
    with pytest.raises(subprocess.TimeoutExpired):
        launch_cpu_workers(script, str(tmp_path), timeout=20)
    pids = [int((tmp_path / f"rank-{rank}").read_text()) for rank in (0, 1)]  # both ranks had started
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def test_a_gloo_abort_relaunches_once_from_empty_outputs_and_other_failures_do_not(tmp_path):
    from hwrun.testing import relaunch_after_gloo_abort

    out = tmp_path / "out"
    results = [subprocess.CompletedProcess([], -6, "", "exitcode  : -6 (pid: 1)  (SIGABRT)"),
               subprocess.CompletedProcess([], 0, "done", "")]
    seen = []

    def launch():
        seen.append(out.exists())
        out.mkdir(exist_ok=True)
        return results[len(seen) - 1]

    with pytest.warns(UserWarning, match="aborted \\(SIGABRT\\)"):
        assert relaunch_after_gloo_abort(launch, [out]).returncode == 0
    assert seen == [False, False]  # the second launch found the first's folder removed

    failed = subprocess.CompletedProcess([], 1, "", "Traceback: ValueError")
    calls = []
    assert relaunch_after_gloo_abort(lambda: calls.append(1) or failed, [out]) is failed and calls == [1]
    twice = subprocess.CompletedProcess([], -6, "", "(SIGABRT)")
    calls.clear()
    with pytest.warns(UserWarning):
        assert relaunch_after_gloo_abort(lambda: calls.append(1) or twice, [out]) is twice
    assert calls == [1, 1]  # a second abort is returned, not retried again
