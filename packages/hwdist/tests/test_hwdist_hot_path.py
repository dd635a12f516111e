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


# --- validation stays off the hot path: counted, not timed ---------------------------------------------------

_VALIDATORS = ("_prepare", "_reduce_op", "_out_problem", "_exchange", "_raise_or_exchange", "_all_reduce_problem",
               "_all_gather_problem", "_broadcast_problem", "_reduce_scatter_problem")


def _count_validation(monkeypatch) -> dict[str, int]:
    counts = dict.fromkeys(_VALIDATORS, 0)
    for name in _VALIDATORS:
        real = getattr(collectives, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(collectives, name, spy)
    return counts


@pytest.mark.parametrize("index", range(7))
def test_validation_runs_only_when_asked(monkeypatch, index):
    hwdist.init()
    counts = _count_validation(monkeypatch)
    call = _calls()[index]
    for _ in range(25):
        call()
        call(check=False)
    assert sum(counts.values()) == 0  # 50 good calls, not one check
    for _ in range(25):
        call(check=True)
    assert counts["_prepare"] == 25  # every asked-for call validates its argument once
    assert counts["_exchange"] == 0  # world size 1: nobody to compare descriptors with


def test_checks_on_for_the_group_validate_every_call(monkeypatch):
    hwdist.init(check=True)
    hwdist.all_reduce(torch.ones(2))
    collectives._fast.checked = True  # as at world size 2 with init(check=True) or HWDIST_CHECKS=1
    counts = _count_validation(monkeypatch)
    for call in _calls():
        for _ in range(3):
            call()
    assert counts["_prepare"] == 3 * len(_calls())
    counts["_prepare"] = 0
    for call in _calls():
        call(check=False)  # a per-call check=False still wins
    assert counts["_prepare"] == 0


# --- all_gather: the stacked out on gloo (one view, kept) and elsewhere (as it is) --------------------------------

@pytest.fixture
def views(monkeypatch):
    """The tensors `.view` was called on (torch.Tensor.view wrapped; undone after the test)."""
    seen = []
    real = torch._C.TensorBase.view

    def view(self, *args, **kwargs):
        seen.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "view", view)
    return seen


def test_torch_single_tensor_forms_are_used_where_torch_has_them():
    hwdist.init()
    hwdist.all_reduce(torch.ones(1))
    fast = collectives._fast
    assert fast.all_gather is getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    assert fast.reduce_scatter is getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    assert not fast.stacked and fast.keeps  # gloo: a view of out, kept
    assert {"nccl", "xccl", "hccl"} <= collectives.STACKED_GATHER and "gloo" not in collectives.STACKED_GATHER


def test_a_reused_stacked_out_is_viewed_once_and_filled_every_time(views):
    hwdist.init()
    out = torch.full((1, 2, 3), float("nan"))
    for step in range(10):
        source = torch.arange(6.0).view(2, 3) + step
        views.clear()
        assert hwdist.all_gather(source, out=out) is out
        assert torch.equal(out[0], source)
        assert [v for v in views if v is out] == ([out] if step == 0 else [])  # the first call's view is kept


def test_the_kept_view_follows_changes_to_out():
    hwdist.init()
    out = torch.empty(1, 4)
    hwdist.all_gather(torch.zeros(4), out=out)

    def gathered(value: float) -> list[float]:
        hwdist.all_gather(torch.full((4,), value), out=out)
        return out.flatten().tolist()

    before = out._version
    assert gathered(1.0) == [1.0] * 4 and out._version > before  # writes still count for autograd
    out.zero_()  # in place: version bump
    assert gathered(2.0) == [2.0] * 4
    out.set_(torch.empty(8).untyped_storage(), 0, (1, 4))  # new memory, version bump
    assert gathered(3.0) == [3.0] * 4
    out.data = torch.empty(1, 4)  # new memory, no version bump: the data pointer tells
    assert gathered(4.0) == [4.0] * 4
    flat = torch.empty(6)  # one out for inputs of other shapes (gloo refuses the kept view; made anew)
    assert hwdist.all_gather(torch.ones(2, 3), out=flat) is flat and flat.tolist() == [1.0] * 6
    assert hwdist.all_gather(torch.full((3, 2), 5.0), out=flat).tolist() == [5.0] * 6
    assert hwdist.all_gather(torch.full((6,), 6.0), out=flat).tolist() == [6.0] * 6
    square = torch.empty(2, 2)  # (world_size * 2, 2): the form gloo takes for a (2, 2) input
    hwdist.all_gather(torch.zeros(2, 2), out=square)
    square.t_()  # not contiguous any more: refused as before, not filled through the kept view
    with pytest.raises(hwdist.CollectiveArgumentError, match="contiguous"):
        hwdist.all_gather(torch.zeros(2, 2), out=square)


def test_an_out_of_the_wrong_size_is_still_refused_after_a_kept_view():
    hwdist.init()
    out = torch.empty(1, 4)
    hwdist.all_gather(torch.zeros(4), out=out)
    with pytest.raises(hwdist.CollectiveArgumentError, match=r"all_gather\(out=...\) must be"):
        hwdist.all_gather(torch.zeros(5), out=out)
    assert hwdist.all_gather(torch.ones(4), out=out).tolist() == [[1.0] * 4]


def test_shutdown_lets_go_of_the_last_out():
    import gc
    import weakref

    hwdist.init()
    out = torch.empty(1, 4)
    hwdist.all_gather(torch.zeros(4), out=out)
    ref = weakref.ref(out)
    del out
    gc.collect()
    assert ref() is not None  # kept with its view until the next out or shutdown
    hwdist.shutdown()
    gc.collect()
    assert ref() is None


def test_out_none_keeps_nothing():
    hwdist.init()
    assert hwdist.all_gather(torch.arange(3.0)).tolist() == [[0.0, 1.0, 2.0]]
    assert collectives._fast.gather is None


def test_backends_that_take_the_stacked_out_get_it_as_is(views):
    hwdist.init()
    hwdist.all_reduce(torch.ones(1))
    fast = collectives._fast
    given = []
    fast.stacked, fast.keeps, fast.all_gather = True, False, lambda target, source: given.append((target, source))
    source, out = torch.ones(2, 3), torch.empty(1, 2, 3)  # as on nccl, xccl, hccl
    views.clear()
    for _ in range(3):
        assert hwdist.all_gather(source, out=out) is out
    assert all(target is out and src is source for target, src in given) and len(given) == 3
    assert views == [] and fast.gather is None


def test_gloo_gets_the_chunked_form_of_a_stacked_out(views):
    hwdist.init()
    hwdist.all_reduce(torch.ones(1))
    fast = collectives._fast
    given = []
    fast.all_gather = lambda target, source: given.append((tuple(target.shape), tuple(source.shape)))
    hwdist.all_gather(torch.ones(2, 3), out=torch.empty(1, 2, 3))
    hwdist.all_gather(torch.ones(4), out=torch.empty(4))
    hwdist.all_gather(torch.tensor(1.0), out=torch.empty(1))
    assert given == [((2, 3), (2, 3)), ((4,), (4,)), ((1,), (1,))]


def test_an_out_made_in_inference_mode_gathers_and_is_not_kept():
    """Inference tensors have no version counter: the gloo path gathers into them without keeping a view
    (a review found a CollectiveError here)."""
    hwdist.init()
    with torch.inference_mode():
        out = torch.empty(1, 4)
        hwdist.all_gather(torch.ones(4), out=out)
        hwdist.all_gather(torch.full((4,), 2.0), out=out)
    assert out.tolist() == [[2.0, 2.0, 2.0, 2.0]]


def test_zero_size_inputs_gather_into_a_stacked_out():
    """A zero-size dimension other than dim 0: the view of `out` names its sizes (-1 cannot be inferred)."""
    hwdist.init()
    out = torch.empty(1, 2, 0)
    assert hwdist.all_gather(torch.empty(2, 0), out=out).shape == (1, 2, 0)
