"""What the Gaudi fake does, as the bridge does it (gaudi-pytorch-bridge 1.19, INTEL.md S8; issue 23 point 9)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from hwenv.testing import GiB, fake_gaudi


def test_bridge_signatures_without_parameters():
    with fake_gaudi(8) as fake:
        assert torch.hpu.is_bf16_supported() is True
        with pytest.raises(TypeError):
            torch.hpu.is_bf16_supported(including_emulation=False)
        assert torch.hpu.synchronize() is None
        with pytest.raises(TypeError):
            torch.hpu.synchronize(0)
        assert fake.hpu is torch.hpu is sys.modules["torch.hpu"]  # torch._register_device_module


def test_device_properties_are_a_string_and_memory_comes_from_mem_get_info():
    with fake_gaudi(8, memory=96 * GiB):
        properties = torch.hpu.get_device_properties()
        assert isinstance(properties, str) and properties.startswith("(sramBaseAddress=")
        assert f"dramSize={96 * GiB}" in properties
        assert torch.hpu.mem_get_info() == (96 * GiB, 96 * GiB) == torch.hpu.mem_get_info(0)
        assert torch.hpu.memory_stats()["Limit"] == 96 * GiB
        with pytest.raises(AssertionError, match="Invalid device id"):
            torch.hpu.mem_get_info(8)


def test_device_name_is_the_same_for_every_index_and_checked():
    with fake_gaudi(2, name="GAUDI3"):
        assert [torch.hpu.get_device_name(i) for i in range(2)] == ["GAUDI3", "GAUDI3"]
        assert torch.hpu.get_device_name("hpu:1") == "GAUDI3"
        with pytest.raises(AssertionError, match="Invalid device id"):
            torch.hpu.get_device_name(2)
        with pytest.raises(ValueError, match="Expected a hpu device"):
            torch.hpu.get_device_name("cpu")


def test_set_device_allows_only_index_0_with_fewer_than_8_devices_and_no_selection():
    with fake_gaudi(2):
        torch.hpu.set_device(0)
        assert "HLS_MODULE_ID" not in os.environ  # nothing pinned: the device is acquired by type
        with pytest.raises(AssertionError, match="the only supported device idx is 0"):
            torch.hpu.set_device(1)


def test_set_device_pins_the_module_through_habana_visible_modules(monkeypatch):
    with fake_gaudi(2):
        monkeypatch.setenv("HABANA_VISIBLE_MODULES", "6,7")
        torch.hpu.set_device(1)
        assert os.environ["HLS_MODULE_ID"] == "7" and torch.hpu.current_device() == 1
    assert "HLS_MODULE_ID" not in os.environ  # the fake undid the bridge's pin


def test_set_device_on_a_full_server_pins_index_as_module():
    with fake_gaudi(8):
        torch.hpu.set_device(3)
        assert os.environ["HLS_MODULE_ID"] == "3"


def test_an_existing_pin_wins_over_the_requested_index(monkeypatch):
    with fake_gaudi(8, hls_module_id="5"):
        torch.hpu.set_device(0)
        assert os.environ["HLS_MODULE_ID"] == "5" and torch.hpu.current_device() == 5


@pytest.mark.parametrize(("local_rank", "world_size", "visible", "pin"),
                         [("1", "2", None, "1"), ("1", "2", "4,5", "5"), ("0", "1", None, None), (None, "2", None, None)])
def test_importing_the_plugin_pins_the_module_from_the_local_rank(monkeypatch, local_rank, world_size, visible, pin):
    for name, value in (("LOCAL_RANK", local_rank), ("WORLD_SIZE", world_size)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    before = os.environ.get("HLS_MODULE_ID")
    with fake_gaudi(8, visible_modules=visible):
        assert os.environ.get("HLS_MODULE_ID") == pin
    assert os.environ.get("HLS_MODULE_ID") == before


@pytest.mark.parametrize(("plugin", "lazy_mode", "lazy"), [("1.19.0", None, True), ("1.22.0", None, False),
                                                           ("1.22.0", "1", True), ("1.19.0", "0", False)])
def test_lazy_or_eager_is_fixed_at_import(monkeypatch, plugin, lazy_mode, lazy):
    with fake_gaudi(8, plugin_version=plugin, lazy_mode=lazy_mode) as fake:
        from habana_frameworks.torch.utils.internal import is_lazy

        assert is_lazy() is lazy and fake.lazy is lazy
        monkeypatch.setenv("PT_HPU_LAZY_MODE", "0" if lazy else "1")  # too late: read once at import
        assert is_lazy() is lazy
        # hpu/__init__.py re-exports the graph API only in lazy mode; the graphs module is always there
        assert hasattr(torch.hpu, "wrap_in_hpu_graph") is lazy
        from habana_frameworks.torch.hpu.graphs import HPUGraph, wrap_in_hpu_graph

        assert HPUGraph and wrap_in_hpu_graph


def test_hpu_graph_names_work_on_a_module():
    with fake_gaudi(8, lazy_mode="1"):
        model = torch.nn.Linear(2, 2)
        wrapped = torch.hpu.wrap_in_hpu_graph(model)
        assert wrapped is model and callable(model.clear_cache)
        assert model(torch.ones(1, 2)).shape == (1, 2)
        graph = torch.hpu.HPUGraph()
        with torch.hpu.graph(graph):
            pass
        graph.replay()


def test_detected_memory_comes_from_mem_get_info_of_the_current_card():
    # issue 23 point 4: the properties are a string, so the probe reads mem_get_info() (bridge hpu/memory.py)
    import hwenv
    from hwenv.platforms import get_platform, runtime

    with fake_gaudi(8, memory=64 * GiB):
        accel = hwenv.detect()
        assert accel.memory == (64 * GiB,) * 8 and "mem_get_info" in accel.memory_source
        assert runtime.mem_get_info(get_platform("hpu"), 3) == (64 * GiB, 64 * GiB)
