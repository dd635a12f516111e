"""What `hwrun plan` refuses before work starts (issue 27 point 6): `hwenv.validate_gaudi_flags` and
`hwenv.validate_selection`, with the rules `hwenv doctor` reports (the two must agree)."""

from __future__ import annotations

import hwenv
import pytest
from hwenv import diagnose, parse_hl_smi_csv
from hwenv.testing import HL_SMI_CSV_8

# ---- PT_HPU_LAZY_MODE / PT_ENABLE_INT64_SUPPORT (gaudi-pytorch-bridge 1.19) -----------------------------

#: Values the bridge does not read as one mode: hccl's int() fails ('yes', '', 'true'), the C++ flag reads
#: 2/3 as internal lazy variants, and ' 0' / '00' / '+1' read differently by the string and number sides.
MALFORMED_LAZY = ("yes", "2", "", "true", " 0", "00", "+1", "3", "lazy")
MALFORMED_INT64 = ("yes", "2", "on", " 1", "enabled")


@pytest.mark.parametrize("value", MALFORMED_LAZY)
def test_malformed_lazy_mode_raises_naming_value_accepted_values_and_fix(value):
    with pytest.raises(hwenv.GaudiFlagError) as info:
        hwenv.validate_gaudi_flags({"PT_HPU_LAZY_MODE": value}, plugin_version="1.22.0")
    message = str(info.value)
    assert f"PT_HPU_LAZY_MODE={value!r}" in message
    assert "'0' (eager) or '1' (lazy)" in message and "Fix: set PT_HPU_LAZY_MODE=0" in message
    assert isinstance(info.value, hwenv.HwenvError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", MALFORMED_INT64)
def test_malformed_int64_flag_raises_naming_value_and_accepted_values(value):
    with pytest.raises(hwenv.GaudiFlagError) as info:
        hwenv.validate_gaudi_flags({"PT_ENABLE_INT64_SUPPORT": value}, plugin_version="1.22.0")
    assert f"PT_ENABLE_INT64_SUPPORT={value!r}" in str(info.value)
    assert "1, true, 0 or false" in str(info.value) and "Fix:" in str(info.value)


def test_the_reason_follows_the_bridge_source():
    def reason(value):
        with pytest.raises(hwenv.GaudiFlagError) as info:
            hwenv.validate_gaudi_flags({"PT_HPU_LAZY_MODE": value}, plugin_version="1.22.0")
        return str(info.value)

    assert "int()" in reason("yes") and "empty" in reason("")
    assert "Wrong PT plugin library loaded" in reason(" 0")
    assert "internal lazy debugging variants" in reason("2")
    assert "hpu/graphs.py and autoload" in reason("+1")


def test_both_malformed_are_named_in_one_error():
    with pytest.raises(hwenv.GaudiFlagError) as info:
        hwenv.validate_gaudi_flags({"PT_HPU_LAZY_MODE": "yes", "PT_ENABLE_INT64_SUPPORT": "2"})
    assert "PT_HPU_LAZY_MODE='yes'" in str(info.value) and "PT_ENABLE_INT64_SUPPORT='2'" in str(info.value)


@pytest.mark.parametrize(("env", "lazy"), [
    ({"PT_HPU_LAZY_MODE": "0"}, False),
    ({"PT_HPU_LAZY_MODE": "1"}, True),
    ({}, False),  # unset: the plugin's default, eager from 1.21.0
    ({"PT_HPU_LAZY_MODE": "0", "PT_ENABLE_INT64_SUPPORT": "TRUE"}, False),
    ({"PT_HPU_LAZY_MODE": "0", "PT_ENABLE_INT64_SUPPORT": "false"}, False),
    ({"PT_HPU_LAZY_MODE": "0", "PT_ENABLE_INT64_SUPPORT": ""}, False),  # the bridge reads empty as unset
])
def test_accepted_values_return_the_mode_loading_uses(env, lazy):
    mode = hwenv.validate_gaudi_flags(env, plugin_version="1.22.0")
    assert mode.lazy is lazy


def test_flags_default_to_os_environ(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "maybe")
    with pytest.raises(hwenv.GaudiFlagError, match="'maybe'"):
        hwenv.validate_gaudi_flags()


@pytest.mark.parametrize("value", (*MALFORMED_LAZY, "0", "1"))
def test_doctor_reports_exactly_what_validate_gaudi_flags_refuses(clean_device_env, monkeypatch, value):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", value)
    codes = {p.code for p in diagnose().problems}
    try:
        hwenv.validate_gaudi_flags()
        refused = False
    except hwenv.GaudiFlagError:
        refused = True
    assert ("lazy-mode-malformed" in codes) is refused is (value not in ("0", "1"))


def test_an_empty_int64_flag_is_a_doctor_note_not_a_problem(fake_gaudi, monkeypatch):
    fake_gaudi(count=1)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "")
    report = diagnose()
    assert not [p for p in report.problems if p.code.startswith("int64")]
    assert any("PT_ENABLE_INT64_SUPPORT is set but empty" in note for note in report.notes)


# ---- device selections --------------------------------------------------------------------------------

ROWS = parse_hl_smi_csv(HL_SMI_CSV_8)

#: (kind, environment, a fragment of the error, or None when the selection is valid)
SELECTIONS = [
    ("hpu", {"HABANA_VISIBLE_MODULES": "9"}, "[9] do not exist"),
    ("hpu", {"HABANA_VISIBLE_MODULES": "0,1,2"}, "group of 3"),
    ("hpu", {"HABANA_VISIBLE_MODULES": "0,2"}, "not a supported 2-device group"),
    ("hpu", {"HABANA_VISIBLE_MODULES": ""}, "HABANA_VISIBLE_MODULES='' is empty"),
    ("hpu", {"HABANA_VISIBLE_MODULES": "0,x"}, "HABANA_VISIBLE_MODULES='0,x' is invalid"),
    ("hpu", {"HABANA_VISIBLE_DEVICES": ""}, "HABANA_VISIBLE_DEVICES='' is empty"),
    ("hpu", {"HABANA_VISIBLE_MODULES": "0,1", "HABANA_VISIBLE_DEVICES": "0,1"}, "disagree"),
    ("hpu", {"HLS_MODULE_ID": "x"}, "HLS_MODULE_ID='x' is not a module ID"),
    ("hpu", {"HLS_MODULE_ID": "3", "HABANA_VISIBLE_MODULES": "0,1"}, "HLS_MODULE_ID=3 is not in"),
    ("hpu", {"HABANA_VISIBLE_MODULES": "5,4,7,6"}, None),
    ("hpu", {"HABANA_VISIBLE_MODULES": "3"}, None),
    ("hpu", {"HABANA_VISIBLE_DEVICES": "4"}, None),
    ("hpu", {"HABANA_VISIBLE_MODULES": "4,5", "HABANA_VISIBLE_DEVICES": "0,1"}, None),  # the same cards by hl-smi
    ("xpu", {"ZE_AFFINITY_MASK": "0.0"}, "not valid under ZE_FLAT_DEVICE_HIERARCHY=FLAT"),
    ("xpu", {"ZE_AFFINITY_MASK": ""}, None),  # the driver reads "" as unset: every device (issue 41.7)
    ("xpu", {"ZE_AFFINITY_MASK": "default"}, None),  # compute-runtime's flag default, also no mask
    ("xpu", {"ZE_AFFINITY_MASK": " "}, "ZE_AFFINITY_MASK=' ' is blank"),
    ("xpu", {"ZE_AFFINITY_MASK": "a"}, "ZE_AFFINITY_MASK='a' is invalid"),
    ("xpu", {"ZE_FLAT_DEVICE_HIERARCHY": "flat"}, "ZE_FLAT_DEVICE_HIERARCHY='flat'"),
    ("xpu", {"ZE_AFFINITY_MASK": "0.1,1", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, None),
    ("xpu", {"ZE_AFFINITY_MASK": "0,2"}, None),
    ("cuda", {"CUDA_VISIBLE_DEVICES": "-1"}, "CUDA_VISIBLE_DEVICES='-1' is invalid"),
    ("cuda", {"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES='' is empty"),
    ("cuda", {"CUDA_VISIBLE_DEVICES": "0,0"}, "lists 0 twice"),
    ("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-8f6b,GPU-1a2b"}, None),  # the runtime accepts UUIDs
    ("cuda", {"CUDA_VISIBLE_DEVICES": "1,0"}, None),
    ("rocm", {"CUDA_VISIBLE_DEVICES": "x"}, "CUDA_VISIBLE_DEVICES='x' is invalid"),  # named as set, not HIP_
    ("rocm", {"HIP_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "0,0"}, "ROCR_VISIBLE_DEVICES='0,0' lists 0 twice"),
    ("cpu", {"CUDA_VISIBLE_DEVICES": "x"}, None),  # the CPU has no selection
]


@pytest.mark.parametrize(("kind", "env", "fragment"), SELECTIONS)
def test_validate_selection(kind, env, fragment):
    if fragment is None:
        assert isinstance(hwenv.validate_selection(kind, env, hl_smi_rows=ROWS), hwenv.Selection)
        return
    with pytest.raises(hwenv.HwenvError) as info:
        hwenv.validate_selection(kind, env, hl_smi_rows=ROWS)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("kind", "env", "fragment"), [s for s in SELECTIONS if s[2] is not None])
def test_every_refusal_says_how_to_fix_it(kind, env, fragment):
    with pytest.raises(hwenv.HwenvError) as info:
        hwenv.validate_selection(kind, env, hl_smi_rows=ROWS)
    text = str(info.value).lower()
    assert any(word in text for word in ("fix:", "unset", "use ", "set ", "list ")), text


def test_the_selection_is_returned():
    assert hwenv.validate_selection("hpu", {"HABANA_VISIBLE_MODULES": "5,4"}).devices == ("5", "4")
    assert hwenv.validate_selection("cuda", {"CUDA_VISIBLE_DEVICES": "1,0"}).env() == {"CUDA_VISIBLE_DEVICES": "1,0"}
    assert hwenv.validate_selection("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-8f6b"}).count == 1
    assert hwenv.validate_selection("xpu", {}).devices == ()


def test_a_count_below_the_entries_is_refused():
    with pytest.raises(hwenv.SelectionError, match="names 2 device"):
        hwenv.validate_selection("cuda", {"CUDA_VISIBLE_DEVICES": "0,3"}, device_count=1)
    with pytest.raises(hwenv.SelectionError, match="driver exposes 1"):
        hwenv.validate_selection("xpu", {"ZE_AFFINITY_MASK": "0,1"}, device_count=1)
    assert hwenv.validate_selection("cuda", {"CUDA_VISIBLE_DEVICES": "0,3"}, device_count=2).devices == ("0", "3")
    # several variables: the runtime applies them in turn, so the count is not compared with any one of them
    assert hwenv.validate_selection("rocm", {"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0"},
                                    device_count=1).devices == ("0", "1")


def test_an_unknown_kind_is_a_platform_error():
    with pytest.raises(hwenv.PlatformError, match="'tpu'"):
        hwenv.validate_selection("tpu", {})


def test_selection_defaults_to_os_environ(clean_device_env, monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1,2")
    with pytest.raises(hwenv.GaudiGroupError):
        hwenv.validate_selection("hpu")


_DOCTOR_CODES = {"invalid-gaudi-selection", "gaudi-module-pin", "invalid-affinity-mask", "invalid-device-hierarchy",
                 "invalid-device-selection"}


@pytest.mark.parametrize(("kind", "env", "fragment"), SELECTIONS)
def test_doctor_reports_an_error_exactly_where_validate_selection_refuses(clean_device_env, fake_hl_smi, monkeypatch,
                                                                         kind, env, fragment):
    fake_hl_smi()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    errors = {p.code for p in diagnose().problems if p.severity == "error"} & _DOCTOR_CODES
    refused = fragment is not None
    assert bool(errors) is refused or kind == "cpu", (errors, fragment)
