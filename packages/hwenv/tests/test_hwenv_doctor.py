"""`hwenv doctor` reports (G3-G5, X4, X5, X17) on this CPU machine and on simulated XPU and Gaudi machines."""

import json

import pytest
from hwenv import diagnose
from hwenv.cli import main


def codes(report):
    return [problem.code for problem in report.problems]


def test_cpu_machine_report(clean_device_env, capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "Accelerator: CPU" in out and "Problems: none" in out
    assert "hpu   not available: habana_frameworks" in out


@pytest.mark.facts("X3")
def test_simulated_four_xpu_report(fake_xpu, capsys, monkeypatch):
    # the device report only: offline (CI sets HF_HUB_OFFLINE) Transformers' own Hub-kernel loads are a real problem
    # here, which test_hwenv_hub_kernels.py covers
    monkeypatch.setenv("USE_HUB_KERNELS", "NO")
    fake_xpu(count=4, bf16=True)
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["accelerator"]["kind"] == "xpu" and data["accelerator"]["count"] == 4
    assert data["accelerator"]["device"] == "xpu:0" and data["problems"] == []
    assert data["ok"] is True


@pytest.mark.facts("X17")
def test_xpu_with_emulated_bf16_is_reported_as_emulated_not_unsupported(fake_xpu):
    """Issue 41.7: torch/xpu/__init__.py `is_bf16_supported()` (including_emulation=True) says yes on every
    available XPU; the fake's `native_bf16=False` GPU is such a one: bf16 runs, emulated, and doctor says so."""
    import hwenv

    fake_xpu(count=1, bf16=False)
    report = diagnose()
    assert "bf16-emulated" in codes(report) and "bf16-unsupported" not in codes(report)
    found = next(p for p in report.problems if p.code == "bf16-emulated")
    assert "emulated, not natively" in found.message and "TrainingArguments(bf16=True)" in found.message
    accel = hwenv.detect()
    assert accel.bf16 is False and accel.bf16_emulated is True


@pytest.mark.facts("G4", "G5")
def test_simulated_eight_gaudi_report(fake_gaudi, capsys):
    fake_gaudi(count=8)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "Intel Gaudi (HPU)" in out and "count=8" in out and "device=hpu" in out
    # The fake plugin is 1.22 (eager by default), where int64 is on by default on Gaudi2 (bridge
    # env_flags.yaml): no int64 problem any more, a note instead (it used to be a false "int64-disabled").
    assert "int64-disabled" not in out and "int64: int64 is on by default in eager mode" in out
    assert "Gaudi execution mode: eager" in out and "Gaudi generation: GAUDI2 is Gaudi 2" in out


@pytest.mark.facts("G4")
def test_gaudi_with_int64_set_has_no_problem(fake_gaudi, monkeypatch):
    fake_gaudi(count=8)
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "1")
    assert codes(diagnose()) == []


@pytest.mark.facts("G3", "G5")
def test_old_accelerate_explains_is_torch_hpu_available(fake_gaudi, monkeypatch):
    fake_gaudi(count=8, accelerate_version="1.4.0")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "1")
    report = diagnose()
    problem = next(p for p in report.problems if p.code == "accelerate-too-old-for-gaudi")
    assert "is_torch_hpu_available() returns False" in problem.message and "1.4.0" in problem.message
    assert "accelerate>=1.5.0" in problem.fix


@pytest.mark.facts("G2")
def test_lazy_mode_is_reported(fake_gaudi, monkeypatch):
    fake_gaudi(count=8, lazy_mode="1")
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "1")
    report = diagnose()
    assert "lazy-mode-blocks-compile" in codes(report)
    assert any("lazy" in note for note in report.notes)


@pytest.mark.facts("X4", "X5")
def test_exported_mask_leaks_and_order_warning(fake_xpu, monkeypatch):
    fake_xpu(count=4)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0,2")
    found = codes(diagnose())
    assert "exported-selection" in found and "unstable-xpu-order" in found


def test_invalid_exported_mask_is_an_error(fake_xpu, monkeypatch):
    # ZE_AFFINITY_MASK=0,5 on a two-device machine: the driver skips 5, so torch counts one device (the
    # probe's count is the masked one; issue 27: ordinals are not compared with it)
    fake_xpu(count=1)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0,5")
    assert "invalid-affinity-mask" in codes(diagnose())
    fake_xpu(count=2)  # on six devices 0,5 is two of them (what torch counts), and valid
    assert "invalid-affinity-mask" not in codes(diagnose())


def test_bad_override_is_reported_not_raised(clean_device_env, monkeypatch, capsys):
    monkeypatch.setenv("HWENV_DEVICE", "tpu")
    assert main(["doctor", "--strict"]) == 1
    assert "detection-failed" in capsys.readouterr().out


@pytest.mark.facts("X1", "X2")
def test_torch_without_xpu_backend_is_reported(clean_device_env, tmp_path, monkeypatch):
    tool = tmp_path / "xpu-smi"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert "torch-without-xpu" in codes(diagnose())


def test_no_plugin_means_no_accelerate_gaudi_problem(clean_device_env):
    from hwenv.testing import override_versions

    with override_versions(accelerate=None, torch=None):
        assert "accelerate-too-old-for-gaudi" not in codes(diagnose())
