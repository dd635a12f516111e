"""`hwenv doctor` reads selections with the parser hwdist launch uses (issue 27 point 6)."""

from __future__ import annotations

import pytest
from hwenv import diagnose


def _problems(report, code):
    return [p for p in report.problems if p.code == code]


@pytest.mark.parametrize(("modules", "named"), [("9", "[9]"), ("0,2", "[0, 2]"), ("0,1,2", "[0, 1, 2]"),
                                                ("0,x", "'x'")])
def test_invalid_gaudi_modules_are_a_problem(clean_device_env, monkeypatch, modules, named):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", modules)
    found = _problems(diagnose(), "invalid-gaudi-selection")
    assert len(found) == 1 and named in found[0].message and found[0].severity == "error"
    assert "HABANA_VISIBLE_MODULES" in found[0].fix


def test_a_supported_group_is_no_problem(clean_device_env, monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "5,4,7,6")
    assert _problems(diagnose(), "invalid-gaudi-selection") == []


def test_disagreeing_gaudi_variables_are_a_problem(clean_device_env, fake_hl_smi, monkeypatch):
    fake_hl_smi()  # index 0 -> module 5, index 1 -> module 4
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1")
    monkeypatch.setenv("HABANA_VISIBLE_DEVICES", "0,1")
    found = _problems(diagnose(), "invalid-gaudi-selection")
    assert len(found) == 1 and "disagree" in found[0].message and "unset HABANA_VISIBLE_DEVICES" in found[0].fix
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "4,5")  # the same cards: agreement is no problem
    assert _problems(diagnose(), "invalid-gaudi-selection") == []


def test_the_pin_is_left_to_the_pin_check(clean_device_env, monkeypatch):
    monkeypatch.setenv("HLS_MODULE_ID", "x")
    report = diagnose()
    assert _problems(report, "invalid-gaudi-selection") == [] and _problems(report, "gaudi-module-pin")


@pytest.mark.parametrize(("variable", "value"), [("CUDA_VISIBLE_DEVICES", "0,x"), ("HIP_VISIBLE_DEVICES", "1,1"),
                                                 ("ROCR_VISIBLE_DEVICES", "-1"), ("CUDA_VISIBLE_DEVICES", "")])
def test_invalid_index_lists_are_a_problem(clean_device_env, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    found = _problems(diagnose(), "invalid-device-selection")
    assert len(found) == 1 and f"{variable}={value!r}" in found[0].message


def test_uuids_are_a_warning_not_an_error(clean_device_env, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f6b,GPU-1a2b")
    report = diagnose()
    assert [p.severity for p in _problems(report, "uuid-selection")] == ["warning"]
    assert _problems(report, "invalid-device-selection") == []


def test_indices_are_not_checked_against_the_narrowed_count(fake_cuda, monkeypatch):
    """torch counts the devices the variable leaves: 0,3 on a 4-GPU machine is 2 devices, and valid."""
    fake_cuda(count=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert _problems(diagnose(), "invalid-device-selection") == []


def test_fewer_devices_than_entries_is_a_problem(fake_cuda, monkeypatch):
    """0,3 on a 2-GPU machine: CUDA stops at 3, torch sees one device."""
    fake_cuda(count=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    found = _problems(diagnose(), "invalid-device-selection")
    assert len(found) == 1 and "names 2 device(s), but torch sees 1" in found[0].message


def test_valid_selections_are_no_problem(clean_device_env, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "3")
    report = diagnose()
    assert not _problems(report, "invalid-device-selection") and not _problems(report, "invalid-gaudi-selection")


@pytest.mark.parametrize(("variable", "value", "code"), [("PT_HPU_LAZY_MODE", "yes", "lazy-mode-malformed"),
                                                         ("PT_ENABLE_INT64_SUPPORT", "2", "int64-flag-malformed")])
def test_malformed_gaudi_flags_are_named_off_gaudi_too(clean_device_env, monkeypatch, variable, value, code):
    monkeypatch.setenv(variable, value)
    report = diagnose()
    found = _problems(report, code)
    assert len(found) == 1 and repr(value) in found[0].message
    assert not _problems(report, "lazy-mode-blocks-compile")  # no Gaudi here: only the malformed value


def test_well_formed_gaudi_flags_off_gaudi_are_no_problem(clean_device_env, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "1")
    assert diagnose().problems == ()
