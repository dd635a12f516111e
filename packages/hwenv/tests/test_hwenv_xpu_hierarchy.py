"""ZE_FLAT_DEVICE_HIERARCHY (Level Zero spec PROG.rst "Device Hierarchy"/"Affinity Mask"; compute-runtime
parseAffinityMask): the value is read and validated, masks are read in its device model, and the count hwstack
plans with is what torch.xpu.device_count() reports."""

import pytest
import torch
from hwenv.errors import AffinityMaskError, DeviceHierarchyError, HwenvError
from hwenv.hierarchy import (
    DEFAULT_HIERARCHY,
    HIERARCHY_VARIABLE,
    DeviceHierarchy,
    exposed_devices,
    parse_hierarchy,
    read_hierarchy,
)
from hwenv.selection import Selection, current_selection, select
from hwenv.testing import fake_xpu
from hypothesis import given, settings
from hypothesis import strategies as st


def test_unset_is_the_flat_driver_default_and_not_explicit():
    assert DEFAULT_HIERARCHY == "FLAT"
    assert read_hierarchy({}) == DeviceHierarchy("FLAT", explicit=False)
    assert "unset" in read_hierarchy({}).describe() and "default" in read_hierarchy({}).describe()
    for value in ("FLAT", "COMPOSITE", "COMBINED"):
        model = read_hierarchy({HIERARCHY_VARIABLE: value})
        assert model.value == value and model.explicit
        assert f"{HIERARCHY_VARIABLE}={value}" in model.describe()


@pytest.mark.parametrize("value", ["flat", "Composite", "", " FLAT", "TILE", "1"])
def test_any_other_value_is_an_error_naming_it(value):
    # the driver compares case-sensitively and silently falls back to its default (compute-runtime)
    with pytest.raises(DeviceHierarchyError) as error:
        parse_hierarchy(value)
    message = str(error.value)
    assert repr(value) in message and "FLAT, COMPOSITE, COMBINED" in message and "unset" in message
    assert isinstance(error.value, HwenvError) and isinstance(error.value, ValueError)


def test_tiles_are_devices_except_under_composite():
    assert parse_hierarchy("FLAT").tiles_are_devices and parse_hierarchy("COMBINED").tiles_are_devices
    assert not parse_hierarchy("COMPOSITE").tiles_are_devices
    assert parse_hierarchy("COMPOSITE").subdevice_entries_allowed
    assert not parse_hierarchy("FLAT").subdevice_entries_allowed


def _cards_tiles(devices):
    return [(d.card, d.tiles) for d in devices]


# The spec's own examples: two parent devices with four tiles each (PROG.rst, "Affinity Mask", version >= 1.7).
@pytest.mark.parametrize(("mask", "expected"), [
    ("0, 1", [(0, (0, 1, 2, 3)), (1, (0, 1, 2, 3))]),
    ("0", [(0, (0, 1, 2, 3))]),
    ("1", [(1, (0, 1, 2, 3))]),                 # reported as device handle 0
    ("0.0", [(0, (0,))]),
    ("1.1, 1.2", [(1, (1, 2))]),                # one device, tiles 1 and 2
    ("0.2, 1.3, 1.0, 0.3", [(0, (2, 3)), (1, (0, 3))]),  # order unchanged
])
def test_composite_matches_the_spec_examples(mask, expected):
    devices = exposed_devices(2, 4, "COMPOSITE", mask)
    assert _cards_tiles(devices) == expected
    assert [d.index for d in devices] == list(range(len(expected)))


@pytest.mark.parametrize(("mask", "expected"), [
    ("0, 1, 2, 3, 4, 5, 6, 7", [(c, (t,)) for c in (0, 1) for t in range(4)]),
    ("0", [(0, (0,))]),
    ("1", [(0, (1,))]),
    ("0, 4", [(0, (0,)), (1, (0,))]),
    ("1, 2, 7", [(0, (1,)), (0, (2,)), (1, (3,))]),
    ("0.0", []),                                # not valid under FLAT: the driver skips it
])
@pytest.mark.parametrize("hierarchy", ["FLAT", "COMBINED"])
def test_flat_and_combined_match_the_spec_examples(mask, expected, hierarchy):
    assert _cards_tiles(exposed_devices(2, 4, hierarchy, mask)) == expected


def test_two_two_tile_cards_are_four_devices_flat_and_two_composite():
    assert len(exposed_devices(2, 2)) == 4  # unset: FLAT
    assert len(exposed_devices(2, 2, "COMPOSITE")) == 2
    assert len(exposed_devices(2, 2, "COMBINED")) == 4


def test_flat_mask_with_subdevices_is_refused_naming_hierarchy_and_fix(clean_device_env):
    # before: select("xpu", "0.1") was accepted and counted one device; under FLAT it exposes none
    with pytest.raises(AffinityMaskError) as error:
        select("xpu", "0.1")
    message = str(error.value)
    assert "ZE_FLAT_DEVICE_HIERARCHY=FLAT" in message and "driver default" in message
    assert "'0,1'" in message and "COMPOSITE" in message and "'0.1'" in message
    with pytest.raises(AffinityMaskError, match="COMBINED"):
        select("xpu", "0,1.1", hierarchy="COMBINED")


def test_composite_subdevices_of_one_card_are_one_device(clean_device_env):
    assert select("xpu", "1.1,1.2", hierarchy="COMPOSITE").count == 1
    assert select("xpu", "0,1.0,1.1", hierarchy="COMPOSITE").count == 2
    assert select("xpu", "0,1,2", hierarchy="FLAT").count == 3
    assert Selection("xpu", ("0.2", "1.3", "1.0", "0.3"), hierarchy="COMPOSITE").count == 2


def test_select_reads_the_hierarchy_from_the_environment_and_the_keyword_wins(monkeypatch, clean_device_env):
    monkeypatch.setenv(HIERARCHY_VARIABLE, "COMPOSITE")
    selection = select("xpu", "1.1,1.2")
    assert selection.count == 1 and selection.hierarchy == "COMPOSITE"
    assert selection.env()[HIERARCHY_VARIABLE] == "COMPOSITE"  # the user's setting travels with the child
    with pytest.raises(AffinityMaskError, match="FLAT"):
        select("xpu", "1.1,1.2", hierarchy="FLAT")
    monkeypatch.setenv(HIERARCHY_VARIABLE, "flat")
    with pytest.raises(DeviceHierarchyError, match="'flat'"):
        select("xpu", "0")


def test_env_carries_the_hierarchy_only_when_set(clean_device_env):
    assert HIERARCHY_VARIABLE not in select("xpu", "0,1").env()
    assert select("xpu", "0,1").hierarchy is None
    assert HIERARCHY_VARIABLE not in select("xpu").env()
    assert select("xpu", hierarchy="COMBINED").env() == {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
                                                           HIERARCHY_VARIABLE: "COMBINED"}


def test_current_selection_reads_the_mapping_not_os_environ(monkeypatch):
    monkeypatch.setenv(HIERARCHY_VARIABLE, "FLAT")
    env = {"ZE_AFFINITY_MASK": "0,1.0,1.1", HIERARCHY_VARIABLE: "COMPOSITE"}
    selection = current_selection("xpu", env)
    assert selection.count == 2 and selection.hierarchy == "COMPOSITE"
    with pytest.raises(AffinityMaskError):
        current_selection("xpu", {"ZE_AFFINITY_MASK": "0.1"})  # unset in the mapping: FLAT
    assert current_selection("xpu", {"ZE_AFFINITY_MASK": "0.1"}, hierarchy="COMPOSITE").count == 1
    with pytest.raises(DeviceHierarchyError):
        current_selection("xpu", {HIERARCHY_VARIABLE: "TILE"})


masks = st.lists(
    st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 1))), min_size=1, max_size=6, unique=True
)


@settings(max_examples=60, deadline=None)
@given(masks, st.sampled_from(["FLAT", "COMPOSITE", "COMBINED"]))
def test_planned_count_equals_what_torch_xpu_device_count_reports(items, hierarchy):
    """Selection.count (what hwdist launch starts) == the fake driver's torch.xpu.device_count() in the child."""
    mask = ",".join(str(d) if s is None else f"{d}.{s}" for d, s in items)
    with fake_xpu(2, tiles=2, hierarchy=hierarchy):  # the parent: two 2-tile cards, no mask yet
        try:
            selection = select("xpu", mask, hierarchy=hierarchy, device_count=torch.xpu.device_count())
        except AffinityMaskError:
            return  # refused before anything runs (sub-devices under FLAT, duplicates, beyond the devices)
        with fake_xpu(2, tiles=2, hierarchy=hierarchy, affinity_mask=selection.env()["ZE_AFFINITY_MASK"]):
            assert selection.count == torch.xpu.device_count()  # what the child reports
        assert selection.count == len(exposed_devices(2, 2, hierarchy, mask))
