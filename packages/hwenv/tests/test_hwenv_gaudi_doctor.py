"""`hwenv doctor` on Gaudi (issue 23 points 2, 3, 8; issue 24 point 6): no false alarms, the findings users need."""

from __future__ import annotations

import pytest
from hwenv import diagnose
from hwenv.versions import accelerate_sees_gaudi


def codes(report):
    return {problem.code for problem in report.problems}


def problem(report, code):
    return next(p for p in report.problems if p.code == code)


@pytest.mark.facts("G5")
def test_no_accelerate_is_no_accelerate_error(fake_gaudi, override_versions):
    # transformers' is_torch_hpu_available skips the accelerate gate when accelerate is not installed
    fake_gaudi(8)
    override_versions(accelerate=None)
    assert "accelerate-too-old-for-gaudi" not in codes(diagnose())
    assert accelerate_sees_gaudi() is True
    assert accelerate_sees_gaudi("1.4.0") is False and accelerate_sees_gaudi("1.5.0") is True


@pytest.mark.parametrize(("plugin", "lazy_mode", "mode_word"), [("1.19.0", None, "lazy"), ("1.22.0", None, "eager"),
                                                                ("1.22.0", "1", "lazy")])
@pytest.mark.facts("G2")
def test_the_mode_follows_the_plugin_version(fake_gaudi, plugin, lazy_mode, mode_word):
    fake_gaudi(8, plugin_version=plugin, lazy_mode=lazy_mode)
    report = diagnose()
    assert any(note.startswith(f"Gaudi execution mode: {mode_word}") for note in report.notes), report.notes
    assert ("lazy-mode-blocks-compile" in codes(report)) is (mode_word == "lazy")


@pytest.mark.parametrize("value", ["true", "yes", ""])
def test_malformed_lazy_mode_names_the_value(fake_gaudi, monkeypatch, value):
    fake_gaudi(8)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", value)
    found = problem(diagnose(), "lazy-mode-malformed")
    assert repr(value) in found.message


def test_int64_off_in_eager_mode_on_gaudi2_is_a_problem(fake_gaudi, monkeypatch):
    fake_gaudi(8, lazy_mode="0")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "false")
    found = problem(diagnose(), "int64-disabled")
    assert "'false'" in found.message and "int32" in found.message


def test_int64_unset_in_eager_mode_is_not_a_problem(fake_gaudi):
    fake_gaudi(8, lazy_mode="0")
    report = diagnose()
    assert not codes(report) & {"int64-disabled", "int64-flag-unsupported", "int64-flag-malformed"}
    assert any("on by default in eager mode" in note for note in report.notes)


@pytest.mark.facts("G4")
def test_int64_in_lazy_mode_is_unsupported_not_a_missing_setting(fake_gaudi):
    fake_gaudi(8, lazy_mode="1")
    report = diagnose()
    assert "int64-disabled" not in codes(report)
    note = next(note for note in report.notes if note.startswith("int64: unsupported here"))
    assert "lazy mode" in note and "PT_HPU_LAZY_MODE=0" in note


def test_int64_on_gaudi1_is_unsupported(fake_gaudi, monkeypatch):
    fake_gaudi(8, name="GAUDI", lazy_mode="0")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "1")
    report = diagnose()
    assert "int64-disabled" not in codes(report)
    assert "Gaudi 1" in problem(report, "int64-flag-unsupported").message


def test_malformed_int64_flag_names_the_value(fake_gaudi, monkeypatch):
    fake_gaudi(8, lazy_mode="0")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "on")
    assert "'on'" in problem(diagnose(), "int64-flag-malformed").message


def test_module_pin_is_reported(fake_gaudi):
    fake_gaudi(8, hls_module_id="3")
    report = diagnose()
    assert report.environment["HLS_MODULE_ID"] == "3"
    assert any(note.startswith("HLS_MODULE_ID=3 pins this process to Gaudi module 3") for note in report.notes)


def test_module_pin_outside_the_visible_modules_is_an_error(fake_gaudi):
    fake_gaudi(8, hls_module_id="3", visible_modules="4,5")
    assert "set_device" in problem(diagnose(), "gaudi-module-pin").message


def test_habana_visible_devices_is_said_to_be_read_only_at_container_start(fake_gaudi, monkeypatch):
    """Issue 41.3: HabanaAI/habana-container-runtime's OCI hook reads `HABANA_VISIBLE_DEVICES` when a container
    starts (`container_config.go` `getDevicesFromEnvvar`) and sets `HABANA_VISIBLE_MODULES` in it (README); the
    bridge (gaudi-pytorch-bridge 1.19) never reads it. Inside a container: a note. Outside: a warning and the fix."""
    fake_gaudi(1)
    monkeypatch.setenv("HABANA_VISIBLE_DEVICES", "4")
    monkeypatch.setattr("hwenv.gaudi.selecting.in_container", lambda: (True, "/.dockerenv exists"))
    report = diagnose()
    note = next(note for note in report.notes if note.startswith("HABANA_VISIBLE_DEVICES=4"))
    assert "read by the habana container runtime when this container started (/.dockerenv exists)" in note
    assert "habana-visible-devices-outside-container" not in codes(report)
    monkeypatch.setattr("hwenv.gaudi.selecting.in_container", lambda: (False, "no container marker"))
    found = problem(diagnose(), "habana-visible-devices-outside-container")
    assert "the Gaudi bridge never does, so it selects no card here" in found.message
    assert "hwenv exec --devices M" in found.fix and "docker run --runtime=habana -e HABANA_VISIBLE_DEVICES=4" in found.fix


def test_one_module_without_a_pin_on_bare_metal_is_a_warning(fake_gaudi, monkeypatch):
    """Issue 41.4: bridge 1.19 `device.cpp` acquires any free card unless `HLS_MODULE_ID` names one, and
    `_setup_module_id` pins only ranks of a distributed run; one module alone does not pin a bare-metal process."""
    fake_gaudi(8)
    monkeypatch.setattr("hwenv.gaudi.selecting.in_container", lambda: (False, "no container marker"))
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "3")
    found = problem(diagnose(), "gaudi-module-not-pinned")
    assert "an unpinned process acquires any free card" in found.message and "HLS_MODULE_ID=3" in found.fix
    monkeypatch.setenv("HLS_MODULE_ID", "3")
    assert "gaudi-module-not-pinned" not in codes(diagnose())
    monkeypatch.delenv("HLS_MODULE_ID")
    monkeypatch.setattr("hwenv.gaudi.selecting.in_container", lambda: (True, "/.dockerenv exists"))
    assert "gaudi-module-not-pinned" not in codes(diagnose())  # a one-card container has no other card to take


@pytest.mark.parametrize(("name", "shown"), [("GAUDI2", "Gaudi 2"), ("GAUDI3", "Gaudi 3"), ("GAUDI", "Gaudi 1")])
def test_known_generation_is_a_note(fake_gaudi, name, shown):
    fake_gaudi(8, name=name, lazy_mode="0")
    report = diagnose()
    assert "unknown-gaudi-generation" not in codes(report)
    assert any(note.startswith(f"Gaudi generation: {name} is {shown}") for note in report.notes)


def test_unknown_generation_gets_the_newest_rules_and_a_warning(fake_gaudi):
    fake_gaudi(8, name="GAUDI4", lazy_mode="0")
    report = diagnose()
    found = problem(report, "unknown-gaudi-generation")
    assert found.severity == "warning" and "'GAUDI4'" in found.message and "Gaudi 3" in found.message
    assert "int64-disabled" not in codes(report)  # newest rules: int64 on by default in eager mode
