"""hwcompile asks the platform (issue 24): routing from `Platform.compile_backend`, every kind in the table."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import hwcompile
import hwenv
import pytest
import torch
from hwcompile.routing import TABLE_CASES, missing_table_kinds
from hwcompile.testing import routing_warnings, stand_in_hpu_backend
from hwenv.platforms import Platform

SOURCE = Path(hwcompile.__file__).resolve().parent
KIND_NAMES = "hpu|xpu|rocm|cuda|mps|cpu"
#: A device kind compared to a string literal (`kind == "hpu"`, `kind in ("xpu", "cuda")`, `"hpu" != kind`).
KIND_COMPARISON = re.compile(
    rf"""(==|!=)\s*["']({KIND_NAMES})["']|["']({KIND_NAMES})["']\s*(==|!=)"""
    rf"""|\bin\s*[(\[{{]\s*["']({KIND_NAMES})["']"""
)


def _f(x):
    return torch.sin(x) * 2 + x


@pytest.fixture
def plugin_platform():
    """Register a dummy plug-in kind with its own compile backend (as an entry point would), then remove it."""
    platform = Platform(kind="npu", device_type="npu", display_name="Test NPU (plug-in)", probe="tests:probe",
                        priority=60, compile_backend="npu_backend")
    hwenv.platforms.register(platform, origin="test plug-in")
    try:
        yield platform
    finally:
        hwenv.platforms.unregister("npu")


def test_the_routing_table_has_a_row_for_every_registered_kind():
    kinds = [platform.kind for platform in hwenv.platforms()]
    assert "rocm" in kinds and missing_table_kinds() == ()
    shown = {row[0] for row in hwcompile.routing_table()}
    assert set(kinds) <= shown
    assert "| rocm | None (default) | `'inductor'` | no |" in hwcompile.routing_table_markdown()


def test_a_new_kind_without_a_table_row_is_reported(plugin_platform):
    assert missing_table_kinds() == ("npu",)
    assert all(kind != "npu" for kind, _ in TABLE_CASES)


def test_routing_follows_the_platform_compile_backend_not_the_kind_name(plugin_platform, caplog):
    caplog.set_level(logging.WARNING)
    decision = hwcompile.route_backend("npu", "inductor")
    assert (decision.backend, decision.rerouted, decision.warned) == ("npu_backend", True, True)
    assert hwcompile.route_backend("npu", "npu_backend").backend == "npu_backend"
    assert hwcompile.route_backend("npu", "hpu_backend").backend == "npu_backend"  # Gaudi's is not its own
    warnings = [r.getMessage() for r in routing_warnings(caplog.records)]
    assert len(warnings) == 2  # 'inductor' and 'hpu_backend', once each
    assert all("Test NPU (plug-in)" in w and "using 'npu_backend'" in w for w in warnings)
    assert hwcompile.own_backend(plugin_platform) == "npu_backend"


def test_compile_on_a_plugin_kind_uses_its_backend(plugin_platform):
    x = torch.randn(3)
    with stand_in_hpu_backend("npu_backend") as npu_backend:
        torch.testing.assert_close(hwcompile.compile(_f, "inductor", accel="npu")(x), _f(x))
    assert len(npu_backend.graphs) == 1
    with pytest.raises(hwcompile.CompileBackendMissingError, match="'npu_backend'.*Test NPU") as error:
        hwcompile.compile(_f, accel="npu")  # not registered any more, and the platform names no plugin
    assert not isinstance(error.value, hwcompile.HpuBackendMissingError)


@pytest.mark.parametrize("requested", [None, "inductor", "aot_eager"])
def test_rocm_keeps_the_requested_backend(requested, caplog):
    caplog.set_level(logging.WARNING)
    decision = hwcompile.route_backend(hwenv.Accelerator("rocm"), requested)
    assert decision.backend == ("inductor" if requested is None else requested) and not decision.rerouted
    assert "AMD GPU (ROCm)" in decision.reason and routing_warnings(caplog.records) == []


def test_rocm_patch_is_a_no_op_and_training_keeps_inductor():
    original = torch.compile
    with hwcompile.patch_torch_compile("rocm") as patch:
        assert not patch.active and torch.compile is original and "AMD GPU (ROCm)" in patch.reason
    assert hwcompile.training_arguments("rocm") == {"torch_compile": True, "torch_compile_backend": "inductor"}


@pytest.mark.parametrize("kind", [platform.kind for platform in hwenv.platforms()])
def test_every_kind_is_accepted_as_a_string_or_an_accelerator(kind):
    by_name = hwcompile.route_backend(kind, "aot_eager")
    by_accelerator = hwcompile.route_backend(hwenv.Accelerator(kind), "aot_eager")
    assert by_name.backend == by_accelerator.backend and by_name.kind == by_accelerator.kind == kind
    expected = hwenv.get_platform(kind).compile_backend
    assert by_name.backend == ("aot_eager" if expected == "inductor" else expected)


def test_no_device_kind_is_compared_to_a_string_in_hwcompile():
    offences = []
    for path in sorted(SOURCE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if KIND_COMPARISON.search(code) and "platform-boundary:" not in line:
                offences.append(f"{path.name}:{number}: {line.strip()}")
    assert offences == [], "ask the platform (hwenv.get_platform / accel.platform) instead:\n" + "\n".join(offences)


def test_the_kind_comparison_pattern_catches_what_it_should():
    for bad in ['acc.kind == "hpu"', "if kind != 'xpu':", 'kind in ("xpu", "cuda")', '"hpu" == kind']:
        assert KIND_COMPARISON.search(bad), bad
    for fine in ['hwenv.get_platform("hpu")', 'backend == "hpu_backend"', 'kind == other']:
        assert not KIND_COMPARISON.search(fine), fine
