"""The fakes carry the real APIs' names and signatures: fail when torch.xpu / torch.cuda disagree."""

import inspect

import torch
from hwenv.testing import _fake_device_functions, fake_cuda, fake_xpu


def _parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_fake_xpu_functions_match_installed_torch_xpu():
    fakes = _fake_device_functions(1, ["x"], True, 1)
    for name, fake in fakes.items():
        real = getattr(torch.xpu, name)  # AttributeError = the real module renamed it
        assert _parameters(fake) == _parameters(real), name


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
