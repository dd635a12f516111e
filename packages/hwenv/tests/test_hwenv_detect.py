"""Detection (X3, G5, G12): real CPU, fake XPU / Gaudi / CUDA, the HWENV_DEVICE override."""

import hwenv
import pytest
from hwenv import DeviceOverrideError, detect


def test_cpu_machine_detects_cpu(clean_device_env):
    accel = detect()
    assert accel.kind == "cpu" and accel.device == "cpu" and accel.count == 1
    assert any(reason.startswith("xpu:") for reason in accel.reasons)
    assert accel.torch_version is not None


@pytest.mark.facts("X3")
def test_fake_four_xpus(fake_xpu):
    fake_xpu(count=4, bf16=False)
    accel = detect()
    assert (accel.kind, accel.count, accel.device, accel.bf16) == ("xpu", 4, "xpu:0", False)
    assert len(accel.memory) == 4


@pytest.mark.facts("G1", "G12")
def test_fake_gaudi_has_bf16_always(fake_gaudi):
    fake_gaudi(count=8)
    accel = detect()
    assert (accel.kind, accel.count, accel.device, accel.bf16) == ("hpu", 8, "hpu", True)
    assert accel.names[0] == "GAUDI2"


def test_fake_cuda_capability(fake_cuda):
    fake_cuda(count=2, capability=(8, 0))
    accel = detect()
    assert (accel.kind, accel.count, accel.capability) == ("cuda", 2, (8, 0))


def test_two_claiming_platforms_are_an_error_naming_both(fake_gaudi, fake_xpu, monkeypatch):
    fake_xpu(count=1)
    fake_gaudi(count=2)
    with pytest.raises(hwenv.PlatformConflictError, match=r"Intel Gaudi \(HPU\).*Intel GPU \(XPU\).*HWENV_DEVICE"):
        detect()
    monkeypatch.setenv("HWENV_DEVICE", "xpu")  # the override chooses between them
    assert detect().kind == "xpu"


def test_override_picks_a_kind(fake_xpu, monkeypatch):
    fake_xpu(count=2)
    monkeypatch.setenv("HWENV_DEVICE", "cpu")
    assert detect().kind == "cpu" and detect().source == "HWENV_DEVICE"


@pytest.mark.parametrize("value", ["tpu", "gpu", "XPU2"])
def test_override_unknown_kind_is_an_error(monkeypatch, value):
    monkeypatch.setenv("HWENV_DEVICE", value)
    with pytest.raises(DeviceOverrideError, match=f"HWENV_DEVICE='{value}'"):
        detect()


def test_override_to_missing_device_is_an_error_not_cpu(clean_device_env, monkeypatch):
    monkeypatch.setenv("HWENV_DEVICE", "xpu")
    with pytest.raises(DeviceOverrideError, match="not usable here"):
        detect()


def test_broken_stack_becomes_a_reason(monkeypatch, clean_device_env):
    import torch

    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.xpu, "is_available", broken)
    accel = detect()
    assert accel.kind == "cpu"
    assert any("driver exploded" in reason for reason in accel.reasons)


def test_accelerator_rejects_unknown_kind():
    with pytest.raises(DeviceOverrideError):
        hwenv.Accelerator("tpu")
