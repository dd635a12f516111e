"""Gaudi lazy/eager follows the bridge (INTEL.md S8, S12): unset = lazy up to 1.20, eager from 1.21.0; any value but "0" is lazy.

Sources: gaudi-pytorch-bridge 1.19 `scripts/env_flags.yaml` (`PT_HPU_LAZY_MODE: default: 1`) and
`torch/utils/internal.py` (`is_lazy`: `!= "0"`); HabanaAI/Gaudi-tutorials PR 131 (2025-05-23, "Lazy mode is
no longer the default execution mode ... since 1.21.0"); huggingface/optimum-habana PRs 1889/1921 (explicit
`PT_HPU_LAZY_MODE=1` in the lazy examples for 1.21).
"""

from __future__ import annotations

import pytest
from hwenv.gaudi import GaudiMode, execution_mode
from hwenv.testing import override_versions


@pytest.mark.parametrize("version, lazy", [
    ("1.19.0.561", True), ("1.19.2", True), ("1.18.0", True), ("1.9.0", True),
    ("1.20.0", True), ("1.20.1.97", True), ("1.21.0", False), ("1.22.0", False), ("2.0.0", False),
])
@pytest.mark.facts("G2")
def test_unset_follows_the_plugin_version(version, lazy):
    mode = execution_mode({}, plugin_version=version)
    assert mode.lazy is lazy
    assert version in mode.reason and "unset" in mode.reason


@pytest.mark.facts("G2")
@pytest.mark.parametrize("value, lazy", [("0", False), ("1", True), ("true", True), ("", True), (" 0", True), ("2", True)])
def test_set_value_is_parsed_like_the_bridge(value, lazy):
    # The bridge: lazy = value != "0" (read once at plugin import); the version does not matter then.
    for version in ("1.19.0", "1.22.0"):
        mode = execution_mode({"PT_HPU_LAZY_MODE": value}, plugin_version=version)
        assert mode.lazy is lazy
        assert mode.value == value
    assert execution_mode({"PT_HPU_LAZY_MODE": value}).malformed is (value not in ("0", "1"))


def test_installed_version_is_read_when_not_given():
    with override_versions(habana_torch_plugin="1.19.0"):
        assert execution_mode({}).lazy is True
    with override_versions(habana_torch_plugin="1.21.1"):
        assert execution_mode({}).lazy is False


def test_unknown_version_assumes_the_current_default_and_says_so():
    with override_versions(habana_torch_plugin=None):
        mode = execution_mode({})
    assert mode == GaudiMode(False, mode.reason, None, None)
    assert "unknown" in mode.reason and "assumed" in mode.reason
    assert mode.name == "eager"


def test_mode_is_frozen():
    with pytest.raises(AttributeError):
        execution_mode({}, plugin_version="1.19.0").lazy = False  # type: ignore[misc]


@pytest.mark.facts("G2")
def test_gaudi_1_20_unset_is_lazy_everywhere_hwstack_decides():
    """Issue 41.2: on 1.20.x with `PT_HPU_LAZY_MODE` unset the bridge runs lazy (eager only from 1.21.0,
    HabanaAI/Gaudi-tutorials PR 131), so hwstack must not compile, must keep HPU graphs and must not export
    int64 there (bridge 1.19 `scripts/env_flags.yaml`: int64 only in eager mode)."""
    from hwenv.gaudi import int64_status, validate_gaudi_flags

    mode = execution_mode({}, plugin_version="1.20.1")
    assert mode.lazy and "1.20.1 defaults to lazy (<= 1.20)" in mode.reason
    assert validate_gaudi_flags({}, plugin_version="1.20.0").lazy
    assert not int64_status({}, device_name="GAUDI2", plugin_version="1.20.0").supported
    assert int64_status({}, device_name="GAUDI2", plugin_version="1.21.0").enabled
