"""The fakes carry the real APIs' names and signatures: fail when torch.xpu / torch.cuda disagree."""

import ast
import inspect
from pathlib import Path

import pytest
import torch
from hwenv.testing import _fake_device_functions, fake_cuda, fake_xpu

XPU_FAKED = ("is_available", "device_count", "get_device_name", "is_bf16_supported", "get_device_properties",
             "get_device_capability", "mem_get_info", "current_device", "set_device", "synchronize")
ACCELERATOR_FAKED = ("current_accelerator", "device_count", "is_available", "current_device_index",
                     "set_device_index", "synchronize", "get_memory_info")


def _parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_fake_xpu_functions_match_installed_torch_xpu():
    # The XPU fake has its own functions now (hierarchy, mem_get_info, torch's bf16 body); this used to
    # check the shared `_fake_device_functions`, which the CUDA and Gaudi fakes still use.
    real = {name: getattr(torch.xpu, name) for name in XPU_FAKED}  # AttributeError = torch renamed it
    with fake_xpu(1) as fake:
        assert set(fake.functions) == set(XPU_FAKED)
        for name, function in fake.functions.items():
            assert _parameters(function) == _parameters(real[name]), name


def test_fake_accelerator_functions_match_installed_torch_accelerator():
    real = {name: getattr(torch.accelerator, name) for name in ACCELERATOR_FAKED}
    with fake_xpu(1) as fake:
        assert set(fake.accelerator) == set(ACCELERATOR_FAKED)
        for name, function in fake.accelerator.items():
            assert _parameters(function) == _parameters(real[name]), name


def _xpu_device_properties_fields():
    """The fields of `_XpuDeviceProperties` as the installed torch declares them (torch/_C/__init__.pyi)."""
    stub = Path(torch.__file__).parent / "_C" / "__init__.pyi"
    tree = ast.parse(stub.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_XpuDeviceProperties")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


def test_fake_xpu_properties_have_exactly_torchs_fields():
    fields = _xpu_device_properties_fields()
    assert {"total_memory", "has_bfloat16_conversions", "has_fp64", "is_integrated_gpu", "name"} <= fields
    with fake_xpu(1):
        assert set(vars(torch.xpu.get_device_properties(0))) == fields


def _is_pure_python(function):
    return inspect.isfunction(inspect.unwrap(function))


@pytest.mark.parametrize("count", [0, 1, 3])
@pytest.mark.parametrize(("native", "integrated"), [(True, False), (False, False), (False, True)])
def test_torchs_pure_python_functions_give_the_fakes_answers(count, native, integrated):
    """Run the installed torch's own Python bodies on the fake's primitives: defaults included, they must agree."""
    real_bf16, real_available, real_name = torch.xpu.is_bf16_supported, torch.xpu.is_available, torch.xpu.get_device_name
    real_acc = {name: getattr(torch.accelerator, name) for name in ("device_count", "is_available")}
    assert all(_is_pure_python(f) for f in (real_bf16, real_available, real_name, *real_acc.values()))
    assert inspect.signature(real_bf16).parameters["including_emulation"].default is True
    with fake_xpu(count, native_bf16=native, integrated=integrated) as fake:
        fake_bf16 = fake.functions["is_bf16_supported"]
        for call in (lambda f: f(), lambda f: f(True), lambda f: f(False), lambda f: f(including_emulation=False)):
            assert call(real_bf16) == call(fake_bf16)
        assert real_bf16() is (count > 0)  # the default call is True on every available XPU, native or not
        assert real_available() == fake.functions["is_available"]()
        assert real_acc["device_count"]() == torch.xpu.device_count() == count
        assert real_acc["is_available"]() == (count > 0)
        if count:
            assert real_name(count - 1) == fake.functions["get_device_name"](count - 1)


def test_fake_cuda_functions_match_installed_torch_cuda():
    fakes = _fake_device_functions(1, ["x"], True, 1)
    for name in ("is_available", "device_count", "get_device_name", "get_device_properties", "current_device",
                 "set_device", "synchronize"):
        assert [p[0] for p in _parameters(fakes[name])] == [p[0] for p in _parameters(getattr(torch.cuda, name))], name


def test_fakes_restore_the_real_functions():
    originals = {name: getattr(torch.xpu, name) for name in ("is_available", "device_count")}
    cuda_original = torch.cuda.is_available
    with fake_xpu(2), fake_cuda(1):
        assert torch.xpu.device_count() == 2 and torch.cuda.is_available()
    assert all(getattr(torch.xpu, name) is fn for name, fn in originals.items())
    assert torch.cuda.is_available is cuda_original


def test_fake_gaudi_restores_torch_and_sys_modules():
    import sys

    from hwenv.testing import fake_gaudi

    compile_before = torch.compile
    with fake_gaudi(4):
        from transformers.utils.import_utils import is_torch_hpu_available

        assert is_torch_hpu_available() is True  # transformers now patches torch.compile ...
    assert torch.compile is compile_before  # ... and the fake undid it
    assert "habana_frameworks" not in sys.modules and not hasattr(torch, "hpu")
