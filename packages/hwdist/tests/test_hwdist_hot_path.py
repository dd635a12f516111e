"""The collectives' hot path (issue 29 point 5): checks are opt-in, per-group decisions are cached, and a bad
argument still ends in hwdist's error. Structure, not timing: the overhead figures are in
docs/benchmarks/collectives.md (tools/bench/collectives_overhead.py)."""

from __future__ import annotations

import hwdist
import pytest
import torch
import torch.distributed as dist
from hwdist import collectives

LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_group(monkeypatch):
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("HWDIST_CHECKS", raising=False)
    monkeypatch.setenv("HWENV_DEVICE", "cpu")
    yield
    hwdist.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


def _calls():
    x, out, big = torch.ones(4), torch.empty(1, 4), torch.ones(2, 3)
    return [lambda **kw: hwdist.all_reduce(x, **kw), lambda **kw: hwdist.all_reduce(x, "max", **kw),
            lambda **kw: hwdist.broadcast(x, 0, **kw), lambda **kw: hwdist.all_gather(x, out=out, **kw),
            lambda **kw: hwdist.all_gather(big, **kw), lambda **kw: hwdist.reduce_scatter(big, **kw),
            lambda **kw: hwdist.reduce_scatter(x, out=torch.empty(4), **kw)]


def test_checks_are_off_by_default_and_opt_in():
    assert hwdist.init().check is False
    hwdist.shutdown()
    assert hwdist.init(check=True).check is True


@pytest.mark.parametrize(("value", "check"), [("1", True), ("0", False), ("", False)])
def test_hwdist_checks_variable_sets_the_default(monkeypatch, value, check):
    monkeypatch.setenv("HWDIST_CHECKS", value)
    assert hwdist.init().check is check
    hwdist.shutdown()
    assert hwdist.init(check=not check).check is (not check)  # an explicit check= wins


def test_a_malformed_hwdist_checks_is_refused(monkeypatch):
    monkeypatch.setenv("HWDIST_CHECKS", "yes")
    with pytest.raises(hwdist.DistEnvError, match="HWDIST_CHECKS='yes' is not 0 or 1"):
        hwdist.init()
    assert not dist.is_initialized()


def test_good_calls_skip_every_check(monkeypatch):
    hwdist.init()

    def forbidden(*args, **kwargs):
        raise AssertionError("a check ran on the hot path")

    for name in ("_prepare", "_reduce_op", "_out_problem", "_exchange", "_raise_or_exchange"):
        monkeypatch.setattr(collectives, name, forbidden)
    for call in _calls():
        call()


def test_check_true_runs_the_checks(monkeypatch):
    hwdist.init()
    seen = []
    real = collectives._prepare
    monkeypatch.setattr(collectives, "_prepare", lambda *a: seen.append(a[0]) or real(*a))
    for call in _calls():
        call(check=True)
    assert seen == ["all_reduce", "all_reduce", "broadcast", "all_gather", "all_gather", "reduce_scatter",
                    "reduce_scatter"]


def test_init_check_true_runs_them_for_every_call(monkeypatch):
    hwdist.init(check=True)
    seen = []
    real = collectives._prepare
    monkeypatch.setattr(collectives, "_prepare", lambda *a: seen.append(a[0]) or real(*a))
    hwdist.all_reduce(torch.ones(2))
    assert seen == []  # world size 1: nothing to compare across ranks, so the hot path stays
    collectives._fast.checked = True  # as at world size 2 with checks on
    hwdist.all_reduce(torch.ones(2))
    assert seen == ["all_reduce"]


def test_the_per_group_decisions_are_cached_and_follow_a_new_context():
    first = hwdist.init()
    hwdist.all_reduce(torch.ones(1))
    cached = collectives._fast
    assert cached.ctx is first and cached.ops["sum"] == dist.ReduceOp.SUM and "mean" not in cached.ops  # gloo
    hwdist.all_reduce(torch.ones(1))
    assert collectives._fast is cached
    hwdist.shutdown()
    second = hwdist.init()
    hwdist.all_reduce(torch.ones(1))
    assert collectives._fast.ctx is second and collectives._fast is not cached


def test_results_are_unchanged_on_the_hot_path():
    hwdist.init()
    assert hwdist.all_reduce(torch.tensor([2.0, 3.0]), "mean").tolist() == [2.0, 3.0]  # gloo: the checked path
    assert hwdist.all_gather(torch.tensor([[1, 2], [3, 4]])).tolist() == [[[1, 2], [3, 4]]]
    out = torch.empty(1, 2)
    assert hwdist.all_gather(torch.tensor([5.0, 6.0]), out=out) is out and out.tolist() == [[5.0, 6.0]]
    flat = torch.empty(2)  # a flat out is filled as it is (no view on the hot path)
    assert hwdist.all_gather(torch.tensor([5.0, 6.0]), out=flat) is flat and flat.tolist() == [5.0, 6.0]
    view = torch.arange(6.0).view(2, 3).t()
    assert hwdist.all_reduce(view) is view  # not contiguous: copied and written back
    assert hwdist.reduce_scatter(torch.ones(2, 2), "max").tolist() == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize(("call", "words"), [
    (lambda: hwdist.all_reduce(torch.zeros(2, device="meta")), "move it first"),
    (lambda: hwdist.all_reduce([1.0, 2.0]), "takes a torch.Tensor"),
    (lambda: hwdist.all_reduce(torch.zeros(2), ["sum"]), "is not supported"),
    (lambda: hwdist.all_reduce(torch.zeros(2, dtype=torch.int64), "mean"), "floating-point"),
    (lambda: hwdist.all_gather(torch.zeros(2), out=torch.empty(1, 3)), "all_gather(out=...) must be"),
    (lambda: hwdist.all_gather(torch.zeros(2), out=torch.empty(1, 2, dtype=torch.float64)), "all_gather(out=...)"),
    (lambda: hwdist.all_gather(torch.zeros(2), out=[0.0, 0.0]), "all_gather(out=...)"),
    (lambda: hwdist.reduce_scatter(torch.zeros(2), out=torch.empty(3)), "reduce_scatter(out=...) must be"),
    (lambda: hwdist.reduce_scatter(torch.tensor(1.0)), "divisible by the world size"),
    (lambda: hwdist.broadcast(torch.zeros(1), src=True), "must be a rank"),
])
def test_bad_arguments_are_still_hwdists_errors_with_checks_off(call, words):
    hwdist.init()
    with pytest.raises(hwdist.CollectiveArgumentError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()
