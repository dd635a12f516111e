"""Never compile in lazy mode on Gaudi: the mode as the bridge decides it, from hwenv.gaudi.execution_mode (G2)."""

from __future__ import annotations

import hwcompile
import hwenv
import pytest
import torch
from hwenv.gaudi import execution_mode

GAUDI = hwenv.Accelerator("hpu", 8)


def _f(x):
    return x.cos() * 3


@pytest.mark.facts("G2")
def test_unset_on_gaudi_1_19_is_lazy_and_refused_before_any_work(dynamo_gaudi, hpu_backend):
    dynamo_gaudi(8, plugin_version="1.19.0")  # PT_HPU_LAZY_MODE unset: lazy is that release's default
    original = torch.compile
    for attempt in (lambda: hwcompile.compile(_f, accel=GAUDI),
                    lambda: hwcompile.patch_torch_compile(GAUDI),
                    lambda: hwcompile.training_arguments(GAUDI)):
        with pytest.raises(hwcompile.LazyModeError) as error:
            attempt()
        message = str(error.value)
        assert "habana-torch-plugin 1.19.0 defaults to lazy" in message and "PT_HPU_LAZY_MODE=0" in message
    assert hpu_backend.graphs == [] and torch.compile is original and not hwcompile.is_patched()
    assert hwcompile.training_arguments(GAUDI, compile=False) == {"torch_compile": False}


@pytest.mark.facts("G2")
def test_unset_on_a_newer_gaudi_is_eager_and_compiles(dynamo_gaudi, hpu_backend):
    dynamo_gaudi(8, plugin_version="1.21.0")
    mode = hwcompile.check_eager_mode()
    assert not mode.lazy and "defaults to eager" in mode.reason
    x = torch.randn(3)
    torch.testing.assert_close(hwcompile.compile(_f, accel=GAUDI)(x), _f(x))
    assert len(hpu_backend.graphs) == 1


@pytest.mark.facts("G2")
@pytest.mark.parametrize("value", ["true", "", " 0", "2"])
def test_any_value_but_0_is_lazy_as_the_bridge_parses_it(dynamo_gaudi, hpu_backend, value):
    dynamo_gaudi(8, lazy_mode=value)
    assert hwcompile.lazy_mode()
    with pytest.raises(hwcompile.LazyModeError, match="every value but '0' as lazy"):
        hwcompile.compile(_f, accel=GAUDI)
    assert hpu_backend.graphs == []


@pytest.mark.parametrize(("environ", "version"), [
    ({}, "1.19.2"), ({}, "1.21.0"), ({}, None), ({"PT_HPU_LAZY_MODE": "0"}, "1.19.0"),
    ({"PT_HPU_LAZY_MODE": "1"}, "1.22.0"), ({"PT_HPU_LAZY_MODE": "yes"}, "1.22.0"),
])
def test_hwcompile_mode_is_hwenv_execution_mode(environ, version):
    assert hwcompile.gaudi_mode(environ, plugin_version=version) == execution_mode(environ, plugin_version=version)
    assert hwcompile.lazy_mode(environ, plugin_version=version) is execution_mode(environ,
                                                                                  plugin_version=version).lazy


@pytest.mark.parametrize("kind", ["cpu", "cuda", "xpu", "rocm"])
def test_only_a_platform_with_a_lazy_mode_is_checked(kind, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert hwcompile.check_compile_mode(hwenv.get_platform(kind)) is None
    assert hwcompile.training_arguments(kind)["torch_compile"] is True
