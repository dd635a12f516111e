"""fake_xpu models the real stack (torch/xpu, Level Zero, Accelerate 1.16), and hwenv's XPU probe reads it the
way the real one must be read: native bf16 with including_emulation=False, memory from mem_get_info."""

import os

import hwenv
import pytest
import torch
from hwenv.testing import GiB, fake_xpu


def test_device_count_follows_hierarchy_and_mask(monkeypatch):
    with fake_xpu(2, tiles=2):
        assert torch.xpu.device_count() == 4  # unset = FLAT: every tile is a device
        monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
        assert torch.xpu.device_count() == 2
        monkeypatch.setenv("ZE_AFFINITY_MASK", "0,1.0,1.1")
        assert torch.xpu.device_count() == 2
        monkeypatch.setenv("ZE_AFFINITY_MASK", "1.1")
        assert torch.xpu.device_count() == 1
        monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "FLAT")
        assert torch.xpu.device_count() == 0  # '1.1' is skipped under FLAT, as the driver does
        monkeypatch.setenv("ZE_AFFINITY_MASK", "3,1")
        assert torch.xpu.device_count() == 2 and torch.xpu.is_available()
        monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMBINED")
        assert torch.xpu.device_count() == 2


def test_memory_is_shared_by_the_tiles_of_a_card():
    with fake_xpu(1, tiles=2, memory=128 * GiB, hierarchy="FLAT"):
        assert torch.xpu.mem_get_info(1) == (64 * GiB, 64 * GiB)
    with fake_xpu(1, tiles=2, memory=128 * GiB, hierarchy="COMPOSITE", free_memory=100 * GiB):
        assert torch.xpu.mem_get_info(0) == (100 * GiB, 128 * GiB)
        assert torch.xpu.get_device_properties(0).total_memory == 128 * GiB


@pytest.mark.parametrize(("native", "default", "strict"), [(True, True, True), (False, True, False)])
def test_is_bf16_supported_is_torchs(native, default, strict):
    # before: the fake returned its bf16 flag for every call, so the default call could be False
    with fake_xpu(1, native_bf16=native):
        assert torch.xpu.is_bf16_supported() is default
        assert torch.xpu.is_bf16_supported(including_emulation=False) is strict
        assert torch.xpu.get_device_properties().has_bfloat16_conversions is native
    with fake_xpu(0, native_bf16=native):
        assert torch.xpu.is_bf16_supported() is False  # only when no XPU is available


def test_bf16_keyword_is_the_old_name_of_native_bf16():
    with fake_xpu(1, bf16=False) as fake:
        assert fake.native_bf16 is False and torch.xpu.is_bf16_supported(including_emulation=False) is False
    with pytest.raises(TypeError, match="disagree"), fake_xpu(1, bf16=True, native_bf16=False):
        pass


def test_integrated_gpu_cannot_report_free_memory():
    with fake_xpu(1, integrated=True, name="Intel(R) Graphics [0x7d55]"):
        assert torch.xpu.get_device_properties(0).is_integrated_gpu is True
        with pytest.raises(RuntimeError, match=r"\(Intel\(R\) Graphics \[0x7d55\]\) doesn't support querying the "
                                               r"available free memory"):
            torch.xpu.mem_get_info(0)
    with fake_xpu(1, integrated=True, free_memory_query=True):
        assert torch.xpu.mem_get_info(0)[1] == 64 * GiB


def test_torch_accelerator_answers_xpu_so_accelerate_uses_it():
    from accelerate.state import PartialState
    from accelerate.utils.imports import get_torch_accelerator_backend

    PartialState._reset_state()
    try:
        with fake_xpu(2):
            assert torch.accelerator.current_accelerator() == torch.device("xpu")
            assert torch.accelerator.device_count() == 2 and torch.accelerator.is_available()
            torch.accelerator.set_device_index(1)
            assert torch.accelerator.current_device_index() == 1 == torch.xpu.current_device()
            assert torch.accelerator.get_memory_info(1) == torch.xpu.mem_get_info(1)
            assert get_torch_accelerator_backend() == ("xpu", torch.xpu)
            # Accelerate 1.16 state.py default_device: torch.device(device_type), without an index, when
            # not distributed (a real XPU machine gives the same); the distributed path adds local_rank.
            assert PartialState().device == torch.device("xpu")
    finally:
        PartialState._reset_state()


def test_everything_is_undone_on_exit(monkeypatch):
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE")
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0")
    names = ("current_accelerator", "device_count", "is_available", "current_device_index", "set_device_index",
             "set_device_idx", "current_device_idx", "synchronize", "get_memory_info")
    accelerator = {name: getattr(torch.accelerator, name) for name in names}
    xpu = {name: getattr(torch.xpu, name) for name in ("device_count", "mem_get_info", "is_bf16_supported",
                                                        "get_device_capability")}
    before = torch.accelerator.current_accelerator()
    with fake_xpu(2, tiles=2, hierarchy="COMBINED", affinity_mask="1,2"):
        assert os.environ["ZE_FLAT_DEVICE_HIERARCHY"] == "COMBINED" and torch.xpu.device_count() == 2
        assert torch.accelerator.current_accelerator() != before
    assert all(getattr(torch.accelerator, name) is fn for name, fn in accelerator.items())
    assert all(getattr(torch.xpu, name) is fn for name, fn in xpu.items())
    assert torch.accelerator.current_accelerator() == before
    assert os.environ["ZE_FLAT_DEVICE_HIERARCHY"] == "COMPOSITE" and os.environ["ZE_AFFINITY_MASK"] == "0"


def test_probe_reports_emulated_bf16_with_the_true_reason(clean_device_env):
    with fake_xpu(1, native_bf16=False, integrated=True):
        result = hwenv.run_probe("xpu")
    assert result.bf16 is False  # the default call would have said True
    assert "including_emulation=False" in result.bf16_source and "integrated" in result.bf16_source
    assert "emulation" in result.bf16_source
    with fake_xpu(1, native_bf16=True):
        assert hwenv.run_probe("xpu").bf16 is True


def test_probe_without_including_emulation_reads_the_property_not_the_default_call(monkeypatch, clean_device_env):
    with fake_xpu(1, native_bf16=False):
        monkeypatch.setattr(torch.xpu, "is_bf16_supported", lambda: True)  # an older torch's signature
        result = hwenv.run_probe("xpu")
    assert result.bf16 is False and "has_bfloat16_conversions" in result.bf16_source


def test_probe_memory_from_mem_get_info_or_total_memory_said(clean_device_env):
    with fake_xpu(2, memory=48 * GiB):
        result = hwenv.run_probe("xpu")
    assert result.memory == (48 * GiB, 48 * GiB) and result.memory_source.startswith("torch.xpu.mem_get_info")
    assert result.details["mem_get_info"] == "supported"
    with fake_xpu(1, memory=16 * GiB, integrated=True):
        result = hwenv.run_probe("xpu")
    assert result.memory == (16 * GiB,)
    assert "mem_get_info failed" in result.memory_source and "total_memory" in result.memory_source
    assert "shares it with the host" in result.memory_source
    assert result.details["mem_get_info"] == "unsupported" and result.details["is_integrated_gpu"] == "True"
