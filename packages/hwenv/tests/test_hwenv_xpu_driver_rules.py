"""The XPU device count held to the driver's rules as written in intel/compute-runtime (issue 41 points 7-8).

The earlier count test compared two hwstack models with each other (hwenv's `Selection.count` and the fake's
`device_count`). Here both are held to `driver_devices` below, a statement-for-statement transliteration of the
driver (intel/compute-runtime, snapshot e37c60bf, 2026-08-22):
- `shared/source/os_interface/device_factory.cpp` `prepareDeviceEnvironments`: `setDeviceHierarchyMode`, then
  `sortNeoDevices`, then `parseAffinityMask`: the mask is read *after* the sort;
- `shared/source/execution_environment/execution_environment.cpp` `comparePciIdBusNumber` (the sort: without
  `ZE_ENABLE_PCI_ID_DEVICE_ORDER` discrete before integrated, then PCI domain/bus/device/function),
  `setDeviceHierarchyMode` (exact `COMPOSITE`/`FLAT`/`COMBINED`, else the family default), and
  `parseAffinityMask` (returns early for `""` and `"default"`; FLAT/COMBINED: tiles are devices, `X.Y` entries
  and ordinals beyond the tiles skipped; COMPOSITE: `X` keeps card X, `X.Y` keeps tile Y of card X, one device
  per card). `shared/source/debug_settings/release_variables_base.inl`: the mask's default is "default".
The transliteration is itself checked against the driver's own unit tests' expectations
(`level_zero/core/test/unit_tests/sources/device/test_l0_device.cpp`, fixture 4 root devices x 2 sub-devices;
`shared/test/unit_test/execution_environment/execution_environment_tests.cpp` `ExecutionEnvironmentSortTests`;
`shared/test/unit_test/device/neo_device_tests.cpp`), so it cannot drift into agreeing with hwstack instead.
"""

from __future__ import annotations

import itertools

import pytest
from hwenv import HwenvError, SelectionError, select
from hwenv.hierarchy import Card, driver_order, exposed_devices

# ---- the driver, transliterated ---------------------------------------------------------------------------

def _compare_pci_id_bus_number(a: Card, b: Card, pci_order: bool) -> bool:
    """`ExecutionEnvironment::comparePciIdBusNumber(rootDeviceEnvironment1, rootDeviceEnvironment2)`: a < b."""
    if not pci_order:
        if a.integrated != b.integrated:
            return b.integrated  # "return isIntegrated2;": the discrete one sorts first
    for x, y in zip(a.pci, b.pci, strict=True):  # domain, bus, device, function
        if x != y:
            return x < y
    return False


def _sort_neo_devices(cards: list[Card], pci_order: bool) -> list[int]:
    """`sortNeoDevices`: std::sort with the comparator (insertion sort here, same order for a strict weak order)."""
    order: list[int] = []
    for index in range(len(cards)):
        position = len(order)
        while position > 0 and _compare_pci_id_bus_number(cards[index], cards[order[position - 1]], pci_order):
            position -= 1
        order.insert(position, index)
    return order


def driver_devices(cards: list[Card], tiles: int, hierarchy: str | None, mask: str | None,
                   pci_order: bool) -> list[tuple[int, tuple[int, ...]]]:
    """What `zeDeviceGet` reports: (physical card, its tiles in the device) per device, in order."""
    mode = hierarchy if hierarchy in ("COMPOSITE", "FLAT", "COMBINED") else "FLAT"  # family default (Xe HPC)
    roots = _sort_neo_devices(cards, pci_order)
    if mask is None or mask == "" or mask == "default":
        if mode == "COMPOSITE":
            return [(card, tuple(range(tiles))) for card in roots]
        return [(card, (tile,)) for card in roots for tile in range(tiles)]
    expose_sub_devices = mode != "COMPOSITE"
    map_of_indices = [(root, tile) for root in range(len(roots)) for tile in range(tiles)]
    num_devices = len(map_of_indices) if expose_sub_devices else len(roots)
    enabled: dict[int, set[int]] = {}
    for entry in mask.split(","):
        sub_entries = entry.split(".")
        entry_index = int(sub_entries[0])
        if entry_index >= num_devices:
            continue
        if expose_sub_devices:
            if len(sub_entries) > 1:
                continue  # "tiles as devices, so ignore X.Y"
            root, tile = map_of_indices[entry_index]
            enabled.setdefault(root, set()).add(tile)
        elif len(sub_entries) > 1:
            sub = int(sub_entries[1])
            if sub < tiles:
                enabled.setdefault(entry_index, set()).add(sub)
        else:
            enabled.setdefault(entry_index, set()).update(range(tiles))
    devices = []
    for root in range(len(roots)):  # filteredEnvironments keeps the sorted order
        if root not in enabled:
            continue
        if expose_sub_devices:
            devices += [(roots[root], (tile,)) for tile in sorted(enabled[root])]
        else:
            devices.append((roots[root], tuple(sorted(enabled[root]))))
    return devices


def _uniform(count: int) -> list[Card]:
    return [Card((0, 3 + i, 0, 0)) for i in range(count)]


# ---- the transliteration against the driver's own unit tests ------------------------------------------------

#: (test in test_l0_device.cpp, hierarchy, mask, tiles per card, expected zeDeviceGet count); 4 root devices.
L0_DEVICE_TESTS = [
    ("DeviceReturnFlatHierarchyTest.GivenFlatHierarchyIsSetWithMaskThenFlagsOfDevicePropertiesIsCorrect",
     "FLAT", "0,1.1,2", 2, 2),
    ("DeviceReturnCombinedHierarchyTest.GivenCombinedHierarchyIsSetWithMaskThenFlagsOfDevicePropertiesIsCorrect",
     "COMBINED", "0,1.1,2", 2, 2),
    ("DeviceReturnCombinedHierarchyTest.GivenCombinedHierarchyIsSetWithMaskWithoutSubDevicesThenGetRootDeviceReturnsNullptr",
     "COMBINED", "0,1,2,3", 1, 4),
    ("DeviceReturnCombinedHierarchyTest.GivenCombinedHierarchyIsSetWithoutDevicesArrayThenGetDeviceFails",
     "COMBINED", "0,1,2", 2, 3),
    ("DeviceReturnCombinedHierarchyTest.GivenCombinedHierarchyIsSetWithInvalidAffinityThenGetDeviceFails",
     "COMBINED", "90", 2, 0),
    ("DeviceReturnCombinedHierarchyTest.GivenCombinedHierarchyIsSetThenGetRootDeviceReturnsNullptr",
     "COMBINED", None, 2, 8),
    ("DeviceReturnCombinedHierarchyTest.GivenCombinedHierarchyIsSetAndDefaultAffinityThenFlagsOfDevicePropertiesIsCorrect",
     "COMBINED", "", 2, 8),
    ("DeviceReturnFlatHierarchyTest.GivenFlatHierarchyIsSetThenFlagsOfDevicePropertiesIsCorrect", "FLAT", None, 2, 8),
    ("DeviceReturnCompositeHierarchyTest.GivenCompositeHierarchyIsSetWithMaskThenGetRootDeviceIsNotNullForSubDevices",
     "COMPOSITE", "0,1,2", 2, 3),
    ("DeviceReturnCompositeHierarchyTest.GivenCompositeHierarchyIsSetThenGetRootDeviceIsNotNullForSubDevices",
     "COMPOSITE", None, 2, 4),
]


@pytest.mark.parametrize(("test", "hierarchy", "mask", "tiles", "count"), L0_DEVICE_TESTS,
                         ids=[case[0].split(".")[1] for case in L0_DEVICE_TESTS])
def test_the_transliteration_gives_the_drivers_own_test_counts(test, hierarchy, mask, tiles, count):
    assert len(driver_devices(_uniform(4), tiles, hierarchy, mask, pci_order=False)) == count


def test_the_transliteration_maps_flat_ordinals_as_neo_device_tests_do():
    """neo_device_tests.cpp `givenZeAffinityMaskSetAndTilesAsDevicesModelThenProperSubDeviceHierarchyMapisSet`:
    FLAT, 4 cards x 4 tiles, mask "0,3,4,1.1,9,15,25": devices (card, tile) (0,0), (0,3), (1,0), (2,1), ..."""
    devices = driver_devices(_uniform(4), 4, "FLAT", "0,3,4,1.1,9,15,25", pci_order=False)
    assert [(card, tiles[0]) for card, tiles in devices][:4] == [(0, 0), (0, 3), (1, 0), (2, 1)]


#: execution_environment_tests.h `inputBusInfos` and the fixture's integrated flags (root devices 1 and 3).
SORT_INPUT = [Card((3, 1, 2, 1)), Card((0, 0, 2, 0), True), Card((0, 1, 3, 0)), Card((0, 1, 2, 1), True),
              Card((0, 0, 2, 1)), Card((3, 1, 2, 0))]


@pytest.mark.parametrize(("pci_order", "expected"), [
    (True, [(0, 0, 2, 0), (0, 0, 2, 1), (0, 1, 2, 1), (0, 1, 3, 0), (3, 1, 2, 0), (3, 1, 2, 1)]),
    (False, [(0, 0, 2, 1), (0, 1, 3, 0), (3, 1, 2, 0), (3, 1, 2, 1), (0, 0, 2, 0), (0, 1, 2, 1)]),
])
def test_the_sort_is_the_drivers_sort_test(pci_order, expected):
    """`ExecutionEnvironmentSortTests` `givenEnabledPciIdDeviceOrderFlag...SortedByPciId` and
    `givenDisabledPciIdDeviceOrderFlag...SortedByTypeThenByPciOrder`: the expected bus infos, in order."""
    assert [SORT_INPUT[i].pci for i in _sort_neo_devices(SORT_INPUT, pci_order)] == expected
    assert [SORT_INPUT[i].pci for i in driver_order(SORT_INPUT, pci_order)] == expected  # hwenv's, the same


# ---- hwenv's model and the fake, held to the driver ------------------------------------------------------

MASKS = [None, "", "default", "0", "1", "2", "0,1", "1,3", "0,2,3", "3,1", "0,5", "7", "0.1", "1.0,1.1", "0,1.1",
         "0.0,2", "1.1,2.0", "9"]
CARD_SETS = {
    "four discrete": _uniform(4),
    "iGPU + 2 dGPU": [Card((0, 3, 0, 0)), Card((0, 0, 2, 0), True), Card((0, 0x4d, 0, 0))],
    "2 dGPU + iGPU on a high bus": [Card((0, 0x80, 0, 0), True), Card((0, 3, 0, 0)), Card((0, 4, 0, 0))],
}


@pytest.mark.parametrize("cards", list(CARD_SETS), ids=list(CARD_SETS))
def test_hwenv_exposed_devices_is_the_driver_for_every_mask_hierarchy_and_order(cards):
    physical = CARD_SETS[cards]
    for mask, hierarchy, tiles, pci_order in itertools.product(MASKS, ("FLAT", "COMPOSITE", "COMBINED"), (1, 2),
                                                               (False, True)):
        order = driver_order(physical, pci_order)
        ours = [(d.card, d.tiles) for d in exposed_devices(len(physical), tiles, hierarchy, mask, order=order)]
        assert ours == driver_devices(physical, tiles, hierarchy, mask, pci_order), (mask, hierarchy, tiles, pci_order)


def test_the_fakes_device_count_and_order_are_the_drivers(fake_xpu, monkeypatch):
    """`torch.xpu.device_count()` and each device's `is_integrated_gpu` under the fake, for an integrated GPU on bus 0
    next to two discrete cards, with and without the PCI order, across masks and hierarchies."""
    physical = CARD_SETS["iGPU + 2 dGPU"]
    fake = fake_xpu(3, integrated=(False, True, False), pci=("0000:03:00.0", "0000:00:02.0", "0000:4d:00.0"),
                    tiles=2, free_memory_query=True)
    import torch

    for mask, hierarchy, pci_order in itertools.product(MASKS, ("FLAT", "COMPOSITE", "COMBINED"), (False, True)):
        for name, value in (("ZE_AFFINITY_MASK", mask), ("ZE_FLAT_DEVICE_HIERARCHY", hierarchy),
                            ("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1" if pci_order else None)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        expected = driver_devices(physical, 2, hierarchy, mask, pci_order)
        assert torch.xpu.device_count() == len(expected), (mask, hierarchy, pci_order)
        integrated = [torch.xpu.get_device_properties(i).is_integrated_gpu for i in range(len(expected))]
        assert integrated == [physical[card].integrated for card, _ in expected], (mask, hierarchy, pci_order)
    assert fake.count == 3


@pytest.mark.parametrize("hierarchy", ["FLAT", "COMPOSITE", "COMBINED"])
def test_selection_count_is_the_drivers_count_for_every_mask_it_accepts(hierarchy):
    """`Selection.count` (what hwdist launches) equals the driver's device count wherever hwenv accepts the mask
    (it refuses the `X.Y` entries FLAT/COMBINED would silently skip, and indices it cannot check without a count)."""
    for mask in MASKS:
        try:
            selection = select("xpu", mask, hierarchy=hierarchy, device_count=None, pci_order=False)
        except HwenvError:  # refused with the rule and the fix (AffinityMaskError)
            continue
        expected = len(driver_devices(_uniform(4), 2, hierarchy, mask, pci_order=False))
        if selection.count is None:
            assert expected == (8 if hierarchy != "COMPOSITE" else 4), mask  # no mask: every device
        elif all(int(e.split(".")[0]) < (8 if hierarchy != "COMPOSITE" else 4) for e in selection.devices):
            assert selection.count == expected, (hierarchy, mask)


# ---- issue 41.7: the indices mean the devices the user named, or the selection is refused ----------------

def test_indices_that_the_pci_order_would_move_are_refused_with_the_reason_and_fix():
    mixed = (False, False, True)  # this process's (default) order: the discrete ones first
    with pytest.raises(SelectionError) as error:
        select("xpu", "0", integrated=mixed, environ={})
    message = str(error.value)
    assert "integrated Intel GPU next to 2 discrete" in message and "comparePciIdBusNumber" in message
    assert "set ZE_ENABLE_PCI_ID_DEVICE_ORDER=1 in this shell" in message and "--no-pci-order" in message
    # the same indices are fine when they were read in PCI order already, without the PCI order, or without a mix
    assert select("xpu", "0", integrated=mixed, environ={"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}).env()[
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER"] == "1"
    assert "ZE_ENABLE_PCI_ID_DEVICE_ORDER" not in select("xpu", "0", integrated=mixed, environ={}, pci_order=False).env()
    assert select("xpu", "0,1", integrated=(False, False), environ={}).env()["ZE_ENABLE_PCI_ID_DEVICE_ORDER"] == "1"
    assert select("xpu", None, integrated=mixed, environ={}).devices == ()  # no indices, nothing to move


def test_hwenv_exec_on_a_mixed_machine_refuses_and_with_no_pci_order_keeps_the_named_gpu(fake_xpu, monkeypatch, capsys):
    """On the fake (compute-runtime's sort): device 0 is the discrete card by default; the child with the PCI order
    would see the integrated GPU as 0, so `hwenv exec --devices 0` refuses; `--no-pci-order` runs it on the card."""
    from hwenv.cli import main

    fake_xpu(2, integrated=(True, False), free_memory_query=True)  # the iGPU on bus 0, a dGPU on bus 4
    import torch

    assert torch.xpu.get_device_properties(0).is_integrated_gpu is False  # default order: discrete first
    called = {}
    monkeypatch.setattr("hwenv.cli.os.execvpe", lambda program, argv, env: called.update(env=env))
    assert main(["exec", "--devices", "0", "--", "python", "x.py"]) == 2
    assert "comparePciIdBusNumber" in capsys.readouterr().err and called == {}
    assert main(["exec", "--no-pci-order", "--devices", "0", "--", "python", "x.py"]) == 0
    assert called["env"]["ZE_AFFINITY_MASK"] == "0" and "ZE_ENABLE_PCI_ID_DEVICE_ORDER" not in called["env"]
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0")  # what the child gets: still the discrete card
    assert torch.xpu.device_count() == 1 and torch.xpu.get_device_properties(0).is_integrated_gpu is False


def test_doctor_says_which_order_a_mixed_machine_lists_its_gpus_in(fake_xpu, monkeypatch):
    from hwenv import diagnose

    fake_xpu(2, integrated=(True, False), free_memory_query=True)
    note = next(n for n in diagnose().notes if n.startswith("An integrated Intel GPU is next to discrete ones"))
    assert "the default order, discrete GPUs first" in note and "comparePciIdBusNumber" in note
    monkeypatch.setenv("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1")
    assert any("PCI bus order" in n for n in diagnose().notes)
