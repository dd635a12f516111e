"""Real processes on this machine (gloo, loopback): every collective at 2 and 4 ranks, a rank
that leaves early, mismatches that must error instead of hanging."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("hwdist_worker.py")
DEVICE_VARIABLES = ("ZE_AFFINITY_MASK", "HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DEVICE_VARIABLES and not k.startswith(("RANK", "LOCAL_", "WORLD_", "MASTER_"))}
    env.update(HWENV_DEVICE="cpu", OMP_NUM_THREADS="1", HWDIST_TEST_TIMEOUT="10", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _load_worker():
    spec = importlib.util.spec_from_file_location("hwdist_test_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forked_rank(worker, env: dict[str, str], scenario: str, out: str) -> None:
    import hwdist.context

    os.environ.clear()
    os.environ.update(env)
    hwdist.context._current = None  # a fresh process as far as hwdist is concerned
    sys.argv = [str(WORKER), scenario, out]
    worker.main()


def run_ranks(world_size: int, scenario: str, out: Path, deadline: float = 60.0,
              timeout_s: int = 10) -> dict[int, dict]:
    """Start `world_size` real processes with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_*). They are forked from this (torch-importing) process, so no rank pays for a fresh
    torch import; each then builds its own gloo group over loopback."""
    import torch.distributed as dist

    assert not dist.is_initialized(), "a test left a process group running; forked ranks would inherit it"
    out.mkdir(parents=True, exist_ok=True)
    worker = _load_worker()
    port = str(free_port())
    context = multiprocessing.get_context("fork")
    procs = []
    for rank in range(world_size):
        env = worker_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                         LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                         HWDIST_TEST_TIMEOUT=str(timeout_s))
        proc = context.Process(target=_forked_rank, args=(worker, env, scenario, str(out)), daemon=True)
        proc.start()
        procs.append(proc)
    end = time.monotonic() + deadline
    for proc in procs:
        proc.join(max(end - time.monotonic(), 0.1))
    hung = [p for p in procs if p.is_alive()]
    for proc in hung:
        proc.kill()
    if hung:
        pytest.fail(f"{scenario} with {world_size} ranks hung past {deadline} s")
    results = {}
    for rank in range(world_size):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing (exit code {procs[rank].exitcode})"
        results[rank] = json.loads(path.read_text())
        assert "crash" not in results[rank], results[rank]["crash"]
    return results


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(2, "collectives+exit", tmp_path_factory.mktemp("two"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return run_ranks(4, "collectives", tmp_path_factory.mktemp("four"))


@pytest.fixture(params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, two_ranks, four_ranks):
    return two_ranks if request.param == 2 else four_ranks


def test_context_from_launcher_variables(ranks):
    n = len(ranks)
    for rank, result in ranks.items():
        ctx = result["context"]
        assert (ctx["rank"], ctx["local_rank"], ctx["world_size"]) == (rank, rank, n)
        assert ctx["backend"] == "gloo" and ctx["device"] == "cpu" and ctx["timeout_s"] == 10.0
        assert result["again_same"] is True


def test_all_reduce_sum_mean_max_min(ranks):
    n = len(ranks)
    for result in ranks.values():
        assert result["sum"] == [n * (n + 1) / 2, n * (n + 1)]
        assert result["mean"] == pytest.approx([(n + 1) / 2, 10 * (n - 1) / 2])
        assert result["max"] == [n - 1, 0]
        assert result["min"] == [0, -(n - 1)]
        assert result["sum_int"] == [n * (n + 1) // 2, 100 * n]
        assert result["sum_bf16"] == [n * (n + 1) / 2] * 3


def test_all_reduce_non_contiguous_in_place(ranks):
    n = len(ranks)
    expected = [[n * (3 * i + j) + n * (n - 1) / 2 for i in range(2)] for j in range(3)]
    for result in ranks.values():
        assert result["sum_noncontiguous"] == expected
        assert result["sum_noncontiguous_same_object"] is True


def test_all_gather_tensors_and_objects(ranks):
    n = len(ranks)
    for result in ranks.values():
        assert result["gather"] == [[r, 10 * r] for r in range(n)]
        assert result["gather_2d_shape"] == [n, 2, 3]
        assert result["gather_object"] == [{"rank": r, "text": "x" * r} for r in range(n)]


def test_out_buffers_are_filled_and_returned(ranks):
    n = len(ranks)
    for result in ranks.values():
        assert result["gather_out_reused"] is True and result["gather_out"] == [float(r) for r in range(n)]
        assert result["gather_out_kept"] == (
            [[float(r + 10 * step) for r in range(n)] for step in range(3)] + [[float(r + 100) for r in range(n)]]
            + [[float(r + dims) for r in range(n)] for dims in (2, 2, 1)])
        assert result["reduce_scatter_out_reused"] is True
        assert result["reduce_scatter_out"] == [[n * (n + 1) / 2] * 3]


def test_broadcast_from_last_rank(ranks):
    n = len(ranks)
    for result in ranks.values():
        assert result["broadcast"] == [10.0 * (n - 1)] * 3


def test_reduce_scatter_sum_mean_max(ranks):
    n = len(ranks)
    for rank, result in ranks.items():
        assert result["reduce_scatter"] == [n * (2 * rank + j) + n * (n - 1) / 2 for j in range(2)]
        assert result["reduce_scatter_mean"] == pytest.approx([(2 * rank + j) + (n - 1) / 2 for j in range(2)])
        assert result["reduce_scatter_max"] == [(2 * rank + j) * n for j in range(2)]
        assert result["barrier"] is True


@pytest.mark.parametrize("case, kind, words", [
    ("shape_mismatch", "CollectiveMismatchError", ["float32[2]", "float32[3]"]),
    ("dtype_mismatch", "CollectiveMismatchError", ["float32[2]", "float64[2]"]),
    ("op_mismatch", "CollectiveMismatchError", ["all_reduce", "broadcast"]),
    ("reduce_op_mismatch", "CollectiveMismatchError", ["op=sum", "op=max"]),
    ("broadcast_src_mismatch", "CollectiveMismatchError", ["src=0", "src=1"]),
    ("barrier_mismatch", "CollectiveMismatchError", ["rank 0: barrier", "rank 1: all_reduce float32[2]"]),
    ("mean_int", "CollectiveArgumentError", ["floating-point", "int64"]),
    ("reduce_scatter_indivisible", "CollectiveArgumentError", ["divisible by the world size"]),
    ("gather_bad_out", "CollectiveArgumentError", ["all_gather(out=...) must be", "float32"]),
])
def test_mismatch_is_an_error_on_every_rank(ranks, case, kind, words):
    for rank, result in ranks.items():
        error = result[case]
        assert error is not None, f"rank {rank} got no error for {case}"
        assert error["type"] == kind
        for word in words:
            assert word in error["message"], (case, error["message"])


@pytest.mark.parametrize("case, words", [
    ("unchecked_mean_int", ["floating-point", "int64"]),
    ("unchecked_reduce_scatter_indivisible", ["divisible by the world size"]),
    ("unchecked_gather_bad_out", ["all_gather(out=...) must be", "float32"]),
    ("unchecked_bad_op", ["op='bogus') is not supported"]),
])
def test_bad_input_on_every_rank_is_refused_with_checks_off(ranks, case, words):
    """Checks are off by default (issue 29): a bad argument every rank passes is still hwdist's error on each."""
    for rank, result in ranks.items():
        error = result[case]
        assert error is not None and error["type"] == "CollectiveArgumentError", (rank, case, error)
        assert all(word in error["message"] for word in words), error["message"]


def test_invalid_input_on_one_rank_stops_all_ranks(ranks):
    for rank, result in ranks.items():
        error = result["bad_op_on_rank0"]
        assert error["type"] == "CollectiveArgumentError"
        assert ("op='bogus') is not supported" in error["message"]) if rank == 0 else ("rank(s) [0]" in error["message"])


def test_mismatches_neither_hang_nor_desync(ranks):
    for result in ranks.values():
        assert result["mismatch_seconds"] < 5  # far below the 10 s timeout: detected, not timed out
        assert result["after_errors_sum"] == [len(ranks)]
        assert result.get("initialized_after_shutdown", False) is False


def test_rank_that_exits_early_fails_the_others_within_the_timeout(two_ranks):
    error = two_ranks[0]["early_exit"]
    assert error is not None and error["type"] == "CollectiveError"
    assert "all_reduce failed on rank 0 of 2 (gloo, timeout 10 s)" in error["message"]
    assert "peer rank" in error["message"]
    assert two_ranks[0]["early_exit_seconds"] < 10 + 5


def test_bench_rows_are_correct_and_follow_nccl_tests_formulas(ranks):
    n = len(ranks)
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "broadcast": 1.0}
    rows = ranks[0]["bench"]
    assert {r["op"] for r in rows} == set(factors) and len(rows) == 8
    for row in rows:
        assert row["correct"] is True
        assert row["busbw"] == pytest.approx(row["algbw"] * factors[row["op"]])
        assert row["algbw"] == pytest.approx(row["size"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["overhead"] == pytest.approx(row["time_us"] / row["raw_time_us"])
    sizes = {(r["op"], r["size"]) for r in rows}
    assert ("all_reduce", 4096) in sizes and ("all_gather", 4096) in sizes
    assert all(r["size"] % (2 * n) == 0 for r in rows if r["op"] in ("all_gather", "reduce_scatter"))
    assert [r["op"] for r in ranks[1]["bench"]] == [r["op"] for r in rows]  # every rank ran the same rows


def test_rank_that_never_calls_fails_the_others_after_the_timeout(tmp_path):
    results = run_ranks(2, "stuck", tmp_path, timeout_s=2)
    error = results[0]["stuck"]
    assert error is not None and error["type"] == "CollectiveError"
    assert "timeout 2 s" in error["message"]
    assert 1.5 < results[0]["stuck_seconds"] < 2 + 4  # the timeout, not a hang
