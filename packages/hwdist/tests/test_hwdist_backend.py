"""backend_for / ddp_backend per device, with hwenv's fakes; checked against the real
transformers.TrainingArguments."""

from __future__ import annotations

import importlib.machinery
import sys
import types

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
    choice = hwdist.backend_for(hwenv.Accelerator("xpu", 4, torch_version="2.8.0"))
    assert choice.name == "xccl" and "2.8.0" in choice.reason


def test_old_torch_with_oneccl_bindings_uses_ccl(monkeypatch):
    module = types.ModuleType("oneccl_bindings_for_pytorch")
    module.__spec__ = importlib.machinery.ModuleSpec("oneccl_bindings_for_pytorch", loader=None)
    monkeypatch.setitem(sys.modules, "oneccl_bindings_for_pytorch", module)
    choice = hwdist.backend_for(hwenv.Accelerator("xpu", 2, torch_version="2.5.1"))
    assert choice.name == "ccl"
    assert "older than 2.7" in choice.reason and "oneccl_bindings_for_pytorch" in choice.reason
    assert choice.ddp_backend is None  # current Transformers has no 'ccl' choice: left to Transformers
    assert "not among TrainingArguments choices" in choice.reason


def test_old_torch_without_bindings_is_an_error(monkeypatch):
    monkeypatch.setattr(backend_module, "_oneccl_installed", lambda: False)
    with pytest.raises(hwdist.BackendUnavailableError, match=r"XCCL needs torch >= 2.7"):
        hwdist.backend_for(hwenv.Accelerator("xpu", 2, torch_version="2.5.1"))


def test_old_transformers_names_the_intel_backend_ccl(monkeypatch):
    monkeypatch.setattr(backend_module, "training_arguments_choices", lambda: ("nccl", "gloo", "mpi", "ccl", "hccl"))
    choice = hwdist.backend_for(hwenv.Accelerator("xpu", 2, torch_version="2.8.0"))
    assert choice.name == "xccl" and choice.ddp_backend == "ccl"


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


def test_cuda_cpu_and_mps(fake_cuda):
    fake_cuda(count=1)
    assert hwdist.backend_for(hwenv.detect()).name == "nccl"
    assert hwdist.ddp_backend(hwenv.Accelerator("cuda", 8)) == "nccl"
    assert hwdist.backend_for(hwenv.Accelerator("cpu")).name == "gloo"
    mps = hwdist.backend_for(hwenv.Accelerator("mps"))
    assert mps.name == "gloo" and "MPS" in mps.reason


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
                                   hwenv.Accelerator("cuda", 2), hwenv.Accelerator("cpu")], ids=lambda a: a.kind)
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
            assert path.name == "backend.py", f"{path.name} may not touch habana_frameworks (only the hccl import)"


def test_stable_ddp_backends_are_accepted_by_the_real_training_arguments():
    """The values answered without importing TrainingArguments must be real choices."""
    from hwdist.backend import STABLE_DDP_BACKENDS

    assert STABLE_DDP_BACKENDS <= set(training_arguments_choices())
