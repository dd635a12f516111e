"""backend_for / ddp_backend per device, with hwenv's fakes; checked against the real
transformers.TrainingArguments."""

from __future__ import annotations

import sys

import hwdist
import hwenv
import pytest
from hwdist import backend as backend_module
from hwdist.backend import ensure_available, training_arguments_choices
from hwenv.gaudi import PLUGIN_INSTALL_HINT


@pytest.fixture(autouse=True, scope="module")
def _transformers_read_before_fakes():
    """Import TrainingArguments once with the real devices: importing transformers' trainer code
    while fake_xpu is active makes it call into the (uncompiled) real torch.xpu."""
    assert training_arguments_choices()


@pytest.fixture
def xccl(monkeypatch):
    """Set what torch.distributed.distributed_c10d.is_xccl_available() returns."""
    from torch.distributed import distributed_c10d

    def set_available(value: bool) -> None:
        monkeypatch.setattr(distributed_c10d, "is_xccl_available", lambda: value)

    return set_available


@pytest.mark.facts("X18")
def test_xpu_uses_xccl_built_into_torch(fake_xpu, xccl):
    fake_xpu(count=2)
    xccl(True)
    choice = hwdist.backend_for(hwenv.detect())
    assert choice.name == "xccl" and choice.ddp_backend == "xccl"
    assert "XCCL built in" in choice.reason and "X18" in choice.reason
    assert "2.7" not in choice.reason
    ensure_available("xccl", "xpu")  # no error


@pytest.mark.facts("X18", "X1")
def test_xpu_torch_without_xccl_names_the_fix(fake_xpu, xccl):
    fake_xpu(count=2)
    xccl(False)
    choice = hwdist.backend_for(hwenv.detect())
    assert choice.name == "xccl" and "has no XCCL" in choice.reason
    with pytest.raises(hwdist.BackendUnavailableError, match=r"is_xccl_available\(\) is False"):
        ensure_available("xccl", "xpu")


def test_xpu_for_another_machine_decides_by_its_torch_version():
    choice = hwdist.backend_for(hwenv.Accelerator("xpu", 4, torch_version="2.8.0"))  # the floor
    assert choice.name == "xccl" and "torch 2.8.0 (>= 2.8) has XCCL built in" in choice.reason


@pytest.mark.facts("X18")
@pytest.mark.parametrize("version", ["2.7.1", "2.5.1"])
def test_xpu_torch_below_2_8_is_an_error_naming_the_fix(version):
    """XCCL is in torch's source from 2.7, but the 2.7 XPU wheels were built without it (INTEL.md);
    oneCCL's `ccl` backend for older torch is gone from hwdist."""
    with pytest.raises(hwdist.BackendUnavailableError) as info:
        hwdist.backend_for(hwenv.Accelerator("xpu", 2, torch_version=version))
    message = str(info.value)
    assert f"needs torch >= 2.8, not torch {version}" in message
    assert "intel/torch-xpu-ops #1318" in message and "download.pytorch.org/whl/xpu" in message
    assert isinstance(info.value, ImportError)


def test_the_oneccl_ccl_path_is_gone():
    from hwdist import rules

    assert "ccl" not in rules.BACKENDS
    assert not hasattr(backend_module, "ONECCL_MODULE") and not hasattr(backend_module, "_oneccl_installed")


def test_transformers_without_xccl_leaves_ddp_backend_unset(monkeypatch):
    monkeypatch.setattr(backend_module, "training_arguments_choices", lambda: ("nccl", "gloo", "mpi", "ccl", "hccl"))
    choice = hwdist.backend_for(hwenv.Accelerator("xpu", 2, torch_version="2.8.0"))
    assert choice.name == "xccl" and choice.ddp_backend is None
    assert "not among TrainingArguments choices" in choice.reason


def test_rocm_is_rccl_through_the_nccl_name():
    choice = hwdist.backend_for(hwenv.Accelerator("rocm", 2))
    assert choice.name == "nccl" and choice.ddp_backend == "nccl"
    assert "RCCL through the nccl name" in choice.reason
    ensure_available("nccl", "cuda")  # ROCm's tensors are torch's "cuda" device type


def test_every_registered_kind_has_a_row_in_hwdists_table():
    from hwdist.rules import BACKENDS, DIST_RULES

    kinds = [platform.kind for platform in hwenv.platforms()]
    assert "rocm" in kinds
    assert [kind for kind in kinds if kind not in DIST_RULES] == []
    assert [p.kind for p in hwenv.platforms() if p.dist_backend not in BACKENDS] == []


def test_backend_comes_from_the_platform_not_the_kind_name():
    """A kind hwdist has never heard of (a plug-in) gets its platform's backend and a reason from its data."""
    from hwdist.rules import DIST_RULES

    dummy = hwenv.Platform(kind="dummynpu", device_type="cuda", display_name="Dummy NPU", probe="x:y", priority=5,
                           visible_devices=("DUMMY_VISIBLE",), selection_grammar="indices", dist_backend="nccl",
                           dist_backend_note="through a test")
    hwenv.register_platform(dummy, origin="test")
    try:
        assert "dummynpu" not in DIST_RULES
        choice = hwdist.backend_for(hwenv.Accelerator("dummynpu", 2))
        assert choice.name == "nccl"
        assert choice.reason == "Dummy NPU: nccl (through a test), from its platform (no hwdist row)"
    finally:
        from hwenv.platforms import unregister

        unregister("dummynpu")


@pytest.mark.facts("G15")
def test_gaudi_uses_hccl_and_imports_its_module_lazily(fake_gaudi):
    fake_gaudi(8)
    choice = hwdist.backend_for(hwenv.detect())
    assert choice.name == "hccl" and choice.ddp_backend == "hccl" and "G15" in choice.reason
    ensure_available("hccl", "hpu")  # the fake habana_frameworks.torch.distributed.hccl imports


@pytest.mark.facts("G15", "G3")
def test_gaudi_without_plugin_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)  # import raises ImportError
    with pytest.raises(hwdist.BackendUnavailableError) as info:
        ensure_available("hccl", "hpu")
    assert "habana_frameworks.torch.distributed.hccl" in str(info.value)
    assert PLUGIN_INSTALL_HINT in str(info.value)
    assert isinstance(info.value, ImportError)


def test_cuda_cpu_and_mps_unchanged(fake_cuda):
    fake_cuda(count=1)
    assert hwdist.backend_for(hwenv.detect()).name == "nccl"
    assert hwdist.ddp_backend(hwenv.Accelerator("cuda", 8)) == "nccl"
    assert hwdist.backend_for(hwenv.Accelerator("cpu")).name == "gloo"
    mps = hwdist.backend_for(hwenv.Accelerator("mps"))
    assert mps.name == "gloo" and "MPS" in mps.reason
    assert hwdist.backend_for(hwenv.Accelerator("cpu")).reason == "CPU: gloo"  # hwrun plan prints it
    assert hwdist.backend_for(hwenv.Accelerator("cuda", 8)).reason == "CUDA: NCCL"


def test_backend_that_does_not_fit_the_device_is_rejected():
    with pytest.raises(hwdist.BackendMismatchError, match=r"'nccl' does not move cpu tensors"):
        ensure_available("nccl", "cpu")
    with pytest.raises(hwdist.BackendMismatchError, match=r"'gloo' does not move hpu tensors"):
        ensure_available("gloo", "hpu")


def test_choices_are_read_from_the_real_training_arguments():
    import dataclasses

    from transformers import TrainingArguments

    field = next(f for f in dataclasses.fields(TrainingArguments) if f.name == "ddp_backend")
    assert training_arguments_choices() == tuple(field.metadata["choices"])
    assert "xccl" in training_arguments_choices() and "hccl" in training_arguments_choices()


@pytest.mark.facts("X18", "G15")
@pytest.mark.parametrize("accel", [hwenv.Accelerator("xpu", 2, torch_version="2.8.0"), hwenv.Accelerator("hpu", 8),
                                   hwenv.Accelerator("rocm", 2), hwenv.Accelerator("cuda", 2),
                                   hwenv.Accelerator("cpu")], ids=lambda a: a.kind)
def test_ddp_backend_is_accepted_by_transformers_argument_parser(accel, tmp_path):
    from transformers import HfArgumentParser, TrainingArguments

    value = hwdist.ddp_backend(accel)
    parser = HfArgumentParser(TrainingArguments)  # enforces the field's choices, as `--ddp_backend` would
    assert parser.parse_args(["--output_dir", str(tmp_path), "--ddp_backend", value]).ddp_backend == value
    with pytest.raises(SystemExit):
        parser.parse_args(["--output_dir", str(tmp_path), "--ddp_backend", "ccl"])  # gone from Transformers 5


def test_readme_backend_table_is_generated_from_the_code():
    from pathlib import Path

    from hwdist.backend import backend_table

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert backend_table() in readme, "README's backend table is stale: paste hwdist.backend.backend_table()"


def test_layer_rule_no_direct_torch_xpu_or_hpu():
    from pathlib import Path

    source = Path(__file__).parents[1] / "src" / "hwdist"
    for path in source.glob("*.py"):
        text = path.read_text()
        assert "torch.xpu" not in text and "torch.hpu" not in text, path
        if "habana_frameworks" in text:
            assert path.name == "rules.py", f"{path.name} may not touch habana_frameworks (only the hccl module name)"


def test_stable_ddp_backends_are_accepted_by_the_real_training_arguments():
    """The values answered without importing TrainingArguments must be real choices."""
    from hwdist.backend import STABLE_DDP_BACKENDS

    assert STABLE_DDP_BACKENDS <= set(training_arguments_choices())
