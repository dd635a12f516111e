"""Issue 41.5: `PT_ENABLE_INT64_SUPPORT` is planned only where the Gaudi bridge supports it.

gaudi-pytorch-bridge 1.19 `scripts/env_flags.yaml` (`PT_ENABLE_INT64_SUPPORT`: "supported only for non-lazy
mode (PT_HPU_LAZY_MODE=0) and Gaudi2 or newer"), `common/eager/utils.cpp` `IsInt64Supported` (false on a
device named "GAUDI"): a plan in lazy mode or on Gaudi 1 exports nothing and says why; eager mode on Gaudi 2+
exports `PT_ENABLE_INT64_SUPPORT=1` (Transformers' int64 token ids, G4). The rule is hwenv's
(`hwenv.run_environment`), asked through the platform, never a kind string.
"""

from __future__ import annotations

import hwenv
import hwrun
import pytest
from hwrun.testing import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-gaudi-env")))


@pytest.mark.facts("G4")
@pytest.mark.parametrize("plugin, lazy_mode", [("1.19.0", None), ("1.20.0", None), ("1.22.0", "1")])
def test_lazy_mode_plans_no_int64(fake_gaudi, tiny, plugin, lazy_mode):
    fake_gaudi(8, plugin_version=plugin, lazy_mode=lazy_mode)
    plan = hwrun.plan(tiny)
    assert plan.env == {}
    assert "PT_ENABLE_INT64_SUPPORT not set: int64 is not supported in lazy mode" in plan.reasons["env"]
    assert "PT_HPU_LAZY_MODE=0" in plan.reasons["env"]  # the fix, for int64


@pytest.mark.facts("G4")
def test_gaudi_1_plans_no_int64_even_in_eager_mode(fake_gaudi, tiny):
    fake_gaudi(8, name="GAUDI", lazy_mode="0")
    plan = hwrun.plan(tiny)
    assert plan.env == {} and "not supported on Gaudi 1" in plan.reasons["env"]


@pytest.mark.facts("G4")
def test_eager_gaudi_2_plans_int64_and_says_why(fake_gaudi, tiny):
    fake_gaudi(8, name="GAUDI2", lazy_mode="0")
    plan = hwrun.plan(tiny)
    assert plan.env == {"PT_ENABLE_INT64_SUPPORT": "1"}
    assert "token ids are int64 (G4)" in plan.reasons["env"] and "on by default in eager mode" in plan.reasons["env"]


def test_planning_for_another_gaudi_reads_its_generation(monkeypatch, tiny):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    first = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI",)))
    third = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI3",)))
    assert first.env == {} and third.env == {"PT_ENABLE_INT64_SUPPORT": "1"}
    assert hwrun.plan(tiny, device=hwenv.Accelerator("xpu", 1)).env == {}
