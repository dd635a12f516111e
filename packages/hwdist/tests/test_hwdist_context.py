"""init / shutdown in this process (world size 1, gloo), its checks before any group starts,
and every collective's single-process behaviour."""

from __future__ import annotations

from datetime import timedelta

import hwdist
import hwenv
import pytest
import torch
import torch.distributed as dist
from hwdist import check_gaudi_world
from hwenv.gaudi import parse_hl_smi_csv
from hwenv.testing import HL_SMI_CSV_8

LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_group(monkeypatch):
    """Each test starts and ends with no launcher variables and no process group."""
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HWENV_DEVICE", "cpu")
    yield
    hwdist.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


def launched(monkeypatch, rank: int, world: int, local_rank: int, local_world: int) -> None:
    for name, value in zip(LAUNCH, (rank, world, local_rank, local_world, "127.0.0.1", 29999), strict=True):
        monkeypatch.setenv(name, str(value))


def test_single_process_gets_a_world_size_one_group():
    ctx = hwdist.init(timeout=30)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.device, ctx.backend) == (0, 0, 1, "cpu", "gloo")
    assert ctx.launched is False and ctx.owns_group and ctx.is_main
    assert ctx.timeout == timedelta(seconds=30)
    assert dist.is_initialized() and dist.get_world_size() == 1


def test_rank_zero_of_one_without_master_uses_the_in_memory_store(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ctx = hwdist.init()
    assert ctx.launched and ctx.world_size == 1
    assert hwdist.all_reduce(torch.ones(2)).tolist() == [1.0, 1.0]


def test_init_is_idempotent_and_refuses_another_backend():
    ctx = hwdist.init()
    assert hwdist.init() is ctx
    assert hwdist.current() is ctx
    with pytest.raises(hwdist.BackendMismatchError, match="already initialised with backend 'gloo'"):
        hwdist.init(backend="nccl")


def test_shutdown_and_context_manager():
    with hwdist.init() as ctx:
        assert hwdist.is_initialized() and ctx.world_size == 1
    assert not hwdist.is_initialized() and not dist.is_initialized()
    hwdist.shutdown()  # idempotent
    ctx2 = hwdist.init()
    assert ctx2.world_size == 1


def test_collectives_before_init_say_what_to_do():
    with pytest.raises(hwdist.NotInitializedError, match=r"call hwdist.init\(\)"):
        hwdist.all_reduce(torch.ones(1))


def test_every_collective_at_world_size_one():
    hwdist.init()
    t = torch.tensor([1.0, 2.0])
    assert hwdist.all_reduce(t) is t and t.tolist() == [1.0, 2.0]
    assert hwdist.all_reduce(torch.tensor([4.0]), "mean").tolist() == [4.0]
    assert hwdist.all_reduce(torch.tensor([4.0]), "max").tolist() == [4.0]
    assert hwdist.all_gather(torch.tensor([3, 4])).tolist() == [[3, 4]]
    obj = {"a": [1]}
    gathered = hwdist.all_gather_object(obj)
    assert gathered == [obj] and gathered[0] is not obj
    assert hwdist.broadcast(torch.tensor([5.0])).tolist() == [5.0]
    assert hwdist.reduce_scatter(torch.tensor([[1.0, 2.0]])).tolist() == [[1.0, 2.0]]
    hwdist.barrier()


def test_local_input_errors_at_world_size_one():
    hwdist.init()
    with pytest.raises(hwdist.CollectiveArgumentError, match="move it first"):
        hwdist.all_reduce(torch.zeros(2, device="meta"))
    with pytest.raises(hwdist.CollectiveArgumentError, match="use one of sum, mean, max, min"):
        hwdist.all_reduce(torch.zeros(2), "avg")
    with pytest.raises(hwdist.CollectiveArgumentError, match="use all_gather_object"):
        hwdist.all_gather([1, 2])
    with pytest.raises(hwdist.CollectiveArgumentError, match=r"src=3\) must be a rank in 0..0"):
        hwdist.broadcast(torch.zeros(1), src=3)
    with pytest.raises(hwdist.CollectiveArgumentError, match="divisible by the world size"):
        hwdist.reduce_scatter(torch.tensor(1.0))


def test_adopts_a_group_started_elsewhere_and_leaves_it_running():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ctx = hwdist.init()
    assert ctx.owns_group is False and ctx.backend == "gloo"
    assert hwdist.all_reduce(torch.ones(1)).tolist() == [1.0]
    hwdist.shutdown()
    assert dist.is_initialized()  # not ours to destroy


def test_shutdown_adopted_destroys_a_group_started_elsewhere():
    # the end of a script under torchrun after Trainer started the group (accelerate's end_training)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    hwdist.init()
    hwdist.shutdown(adopted=True)
    assert not dist.is_initialized() and not hwdist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no hwdist context at all
    hwdist.shutdown(adopted=True)
    assert not dist.is_initialized()
    hwdist.shutdown(adopted=True)  # idempotent with nothing running


def test_shutdown_frees_cyclic_holders_of_the_group_before_destroying_it(monkeypatch):
    # a finished Trainer keeps its DDP wrapper (which holds the group and its pending work) in reference
    # cycles; left to interpreter teardown, gloo can abort the process there ("terminate called")
    import gc
    import weakref

    class Holder:  # stands in for DDP(model) inside a Trainer's cycles
        pass

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    holder = Holder()
    holder.group, holder.cycle = dist.group.WORLD, holder
    alive = weakref.ref(holder)
    del holder
    seen = []
    real_destroy = dist.destroy_process_group
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: (seen.append(alive() is None),
                                                                          real_destroy(*a, **k)))
    gc.disable()  # no collection but the one shutdown makes
    try:
        hwdist.shutdown(adopted=True)
    finally:
        gc.enable()
    assert seen == [True] and not dist.is_initialized()


def test_bad_timeout_is_rejected():
    with pytest.raises(hwdist.DistEnvError, match="must be positive"):
        hwdist.init(timeout=0)


def test_inconsistent_variables_fail_before_any_group(monkeypatch):
    launched(monkeypatch, 2, 2, 0, 1)
    with pytest.raises(hwdist.DistEnvError, match="RANK=2 is not below WORLD_SIZE=2"):
        hwdist.init()
    assert not dist.is_initialized()


def test_backend_not_fitting_the_device_fails_before_any_group():
    with pytest.raises(hwdist.BackendMismatchError, match="'nccl' does not move cpu tensors"):
        hwdist.init(backend="nccl")
    assert not dist.is_initialized()


@pytest.mark.facts("X3", "X4")
def test_local_rank_beyond_visible_xpus(fake_xpu, monkeypatch):
    fake_xpu(count=2)
    monkeypatch.delenv("HWENV_DEVICE", raising=False)
    launched(monkeypatch, 3, 4, 3, 4)
    with pytest.raises(hwdist.DistEnvError, match=r"LOCAL_RANK=3 but this process sees 2 Intel GPU \(XPU\)") as info:
        hwdist.init(accel=hwenv.detect())
    assert "ZE_AFFINITY_MASK" in str(info.value)
    assert not dist.is_initialized()


@pytest.mark.facts("G8", "G6")
def test_gaudi_unsupported_module_group_fails_before_hccl(fake_gaudi, monkeypatch):
    fake_gaudi(8)
    monkeypatch.delenv("HWENV_DEVICE", raising=False)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,2")
    launched(monkeypatch, 0, 2, 0, 2)
    with pytest.raises(hwdist.GaudiWorldError, match=r"not a supported 2-device group"):
        hwdist.init(accel=hwenv.Accelerator("hpu", 2))
    assert not dist.is_initialized()


@pytest.mark.facts("G8")
def test_gaudi_world_size_must_match_the_selected_modules(fake_gaudi, monkeypatch):
    fake_gaudi(8)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5,6,7")
    launched(monkeypatch, 0, 2, 0, 2)
    with pytest.raises(hwdist.GaudiWorldError, match="2 processes on this node but HABANA_VISIBLE_MODULES selects 4"):
        hwdist.init(accel=hwenv.Accelerator("hpu", 4))


@pytest.mark.facts("G8")
def test_gaudi_world_without_selection_is_module_id_equals_local_rank(clean_device_env):
    """The bridge pins local rank r to module r (hccl `_setup_module_id`): 2 processes check {0,1},
    not device indices mapped through hl-smi (here index 0 -> module 5, index 1 -> module 4)."""
    rows = parse_hl_smi_csv(HL_SMI_CSV_8)
    assert check_gaudi_world(2, 8, {}, hl_smi_rows=rows) == (0, 1)
    assert check_gaudi_world(4, 8, {}, hl_smi_rows=rows) == (0, 1, 2, 3)
    assert check_gaudi_world(2, 8, {}) == (0, 1)  # no hl-smi needed (none on PATH here)
    assert check_gaudi_world(8, 8, {}) is None  # the whole server
    assert check_gaudi_world(1, 8, {}) is None
    with pytest.raises(hwdist.GaudiWorldError, match=r"modules \[0, 1, 2\].*groups of 2 or 4") as info:
        check_gaudi_world(3, 8, {})
    assert "{0,1} or {2,3}" in str(info.value)  # the message names the supported groups
    with pytest.raises(hwdist.GaudiWorldError, match="only 8 Gaudi device"):
        check_gaudi_world(9, 8, {})


@pytest.mark.facts("G8")
def test_gaudi_visible_modules_list_position_is_the_local_rank(clean_device_env):
    assert check_gaudi_world(2, 2, {"HABANA_VISIBLE_MODULES": "7,6"}) == (7, 6)
    with pytest.raises(hwdist.GaudiWorldError, match="not a supported 2-device group"):
        check_gaudi_world(2, 2, {"HABANA_VISIBLE_MODULES": "1,2"})


@pytest.mark.facts("G8")
@pytest.mark.parametrize("variable", ["HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES"])
def test_one_card_container_is_a_standard_run(clean_device_env, variable):
    """One process on one card (a container started with card 3) has no group rule and reads no hl-smi."""
    env = {variable: "3"}
    expected = (3,) if variable == "HABANA_VISIBLE_MODULES" else None  # an index names no module
    assert check_gaudi_world(1, 1, env, local_rank=0) == expected


@pytest.mark.facts("G8")
def test_module_pin_hls_module_id(clean_device_env):
    # one process: the pin wins and is this process's card
    assert check_gaudi_world(1, 8, {"HLS_MODULE_ID": "5"}) == (5,)
    # the bridge sets the pin from LOCAL_RANK when it is imported: rank 1 of 2 on module 1 is consistent
    assert check_gaudi_world(2, 8, {"HLS_MODULE_ID": "1"}, local_rank=1) == (0, 1)
    assert check_gaudi_world(2, 2, {"HLS_MODULE_ID": "6", "HABANA_VISIBLE_MODULES": "7,6"}, local_rank=1) == (7, 6)
    # an inherited pin puts every rank on one card: refused before HCCL starts
    with pytest.raises(hwdist.GaudiWorldError, match=r"HLS_MODULE_ID='5'.*LOCAL_RANK=0 of the 2.*module 0"):
        check_gaudi_world(2, 8, {"HLS_MODULE_ID": "5"}, local_rank=0)


@pytest.mark.facts("G8", "G15")
@pytest.mark.parametrize("variable", ["HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES"])
def test_init_in_a_one_card_container_reaches_hccl(fake_gaudi, monkeypatch, variable):
    """`hwdist.init()` with world size 1 in a container started with one card: no group error, the
    checks pass and hccl's module imports; only torch's (unregistered, fake) hccl backend fails."""
    fake_gaudi(1)
    monkeypatch.delenv("HWENV_DEVICE", raising=False)
    monkeypatch.setenv(variable, "3")
    launched(monkeypatch, 0, 1, 0, 1)
    with pytest.raises((RuntimeError, ValueError, AssertionError)) as info:  # torch: "Unknown backend type hccl"
        hwdist.init(accel=hwenv.detect(), timeout=2)
    assert not isinstance(info.value, hwdist.HwdistError), info.value
    assert "hccl" in str(info.value).lower()


@pytest.mark.facts("G8")
def test_gaudi_supported_selection_passes(clean_device_env):
    assert check_gaudi_world(4, 4, {"HABANA_VISIBLE_MODULES": "5,4,7,6"}) == (5, 4, 7, 6)
    assert check_gaudi_world(2, 2, {"HABANA_VISIBLE_MODULES": "2,3"}) == (2, 3)


@pytest.mark.facts("G8", "G15")
def test_gaudi_supported_group_reaches_hccl_import(fake_gaudi, monkeypatch):
    """With a supported group the checks pass, hccl's module imports (fake), and only then
    torch is asked for the (unregistered) hccl backend."""
    fake_gaudi(8)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1")
    launched(monkeypatch, 0, 1, 0, 1)
    with pytest.raises((RuntimeError, ValueError, AssertionError)) as info:  # torch: "Unknown backend type hccl"
        hwdist.init(accel=hwenv.Accelerator("hpu", 2), timeout=2)
    assert not isinstance(info.value, hwdist.HwdistError)
    assert "hccl" in str(info.value).lower()


@pytest.mark.parametrize("kind, backend, expected", [
    ("xpu", "xccl", "xpu:1"), ("cuda", "nccl", "cuda:1"), ("rocm", "nccl", "cuda:1"), ("hpu", "hccl", "hpu"),
    ("mps", "gloo", "cpu"), ("cpu", "gloo", "cpu"), ("cuda", "gloo", "cpu"),
])
def test_collective_device_comes_from_the_platform(kind, backend, expected):
    """ROCm binds `cuda:N` (its torch device type); Gaudi's bridge places the process (`hpu`); gloo
    reduces host tensors on every kind."""
    from hwdist.context import _collective_device

    assert _collective_device(hwenv.get_platform(kind), backend, 1) == expected


def test_context_knows_its_platform():
    rocm = hwdist.DistContext(0, 0, 1, "cuda:0", "nccl", kind="rocm")
    assert rocm.platform.kind == "rocm" and rocm.on_accelerator and rocm.to_dict()["kind"] == "rocm"
    assert not hwdist.DistContext(0, 0, 1, "cpu", "gloo", kind="mps").on_accelerator  # gloo on MPS: host tensors
    assert not hwdist.init().on_accelerator  # CPU


def test_bench_synchronises_through_hwenvs_runtime(monkeypatch):
    """Gaudi's synchronize() takes no device (bridge 1.19): bench goes through hwenv's runtime,
    which knows that, instead of torch.accelerator."""
    from hwdist import bench
    from hwenv.platforms import runtime

    calls = []
    monkeypatch.setattr(runtime, "synchronize", lambda platform, device=None: calls.append((platform.kind, device)))
    bench._sync(hwdist.DistContext(0, 0, 1, "hpu", "hccl", kind="hpu"))
    bench._sync(hwdist.DistContext(0, 0, 1, "cuda:0", "nccl", kind="rocm"))
    bench._sync(hwdist.DistContext(0, 0, 1, "cpu", "gloo", kind="cpu"))
    assert calls == [("hpu", "hpu"), ("rocm", "cuda:0")]
