"""ZE_AFFINITY_MASK parsing (X4, X5): valid masks round-trip, every bad mask is a clear AffinityMaskError."""

import pytest
from hwenv import (
    AffinityEntry,
    AffinityMaskError,
    HwenvError,
    format_affinity_mask,
    parse_affinity_mask,
)
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.facts("X4")
def test_parses_devices_and_subdevices_in_written_order():
    assert parse_affinity_mask("2,0") == (AffinityEntry(2), AffinityEntry(0))
    assert parse_affinity_mask("0.1, 1") == (AffinityEntry(0, 1), AffinityEntry(1))


@pytest.mark.facts("X4")
@pytest.mark.parametrize(
    ("mask", "words"),
    [
        ("  ", "blank"),
        ("0,,2", "item 2 is empty"),
        ("a", "'a' is not a non-negative decimal index"),
        ("-1", "'-1' is not a non-negative decimal index"),
        ("0,0", "lists 0 twice"),
        ("0.1.2", "3 levels"),
        ("0,0.1", "whole and its sub-device"),
        ("1.", "it is empty"),
        ("²", "not a non-negative decimal index"),
    ],
)
def test_bad_masks_name_the_value_and_the_rule(mask, words):
    with pytest.raises(AffinityMaskError) as error:
        parse_affinity_mask(mask)
    assert words in str(error.value)
    assert repr(mask) in str(error.value)
    assert isinstance(error.value, ValueError)


@pytest.mark.facts("X4")
@pytest.mark.parametrize("mask", ["", "default"])
def test_an_empty_or_default_mask_is_no_mask_as_the_driver_reads_it(mask):
    """Issue 41.7: intel/compute-runtime `shared/source/execution_environment/execution_environment.cpp`
    `parseAffinityMask` returns before filtering when the mask is empty or "default" (the flag's default value in
    `shared/source/debug_settings/release_variables_base.inl`): every device is exposed."""
    from hwenv import select

    assert parse_affinity_mask(mask) == ()
    selection = select("xpu", mask)
    assert selection.devices == () and selection.count is None and "ZE_AFFINITY_MASK" not in selection.env()


@pytest.mark.facts("X4")
def test_indices_beyond_present_devices_are_rejected_when_count_known():
    assert len(parse_affinity_mask("0,3", device_count=4)) == 2
    with pytest.raises(AffinityMaskError, match="only 4 device"):
        parse_affinity_mask("0,4", device_count=4)


entries = st.lists(
    st.tuples(st.integers(0, 64), st.one_of(st.none(), st.integers(0, 8))), min_size=1, max_size=12
).map(lambda items: list(dict.fromkeys(AffinityEntry(d, s) for d, s in items)))


@given(entries)
def test_every_valid_mask_round_trips(items):
    whole = {e.device for e in items if e.subdevice is None}
    items = [e for e in items if e.subdevice is None or e.device not in whole]
    mask = format_affinity_mask(items)
    assert parse_affinity_mask(mask) == tuple(items)
    assert format_affinity_mask(parse_affinity_mask(mask)) == mask


@given(st.text(max_size=30))
def test_no_input_raises_anything_but_the_package_error(text):
    try:
        parse_affinity_mask(text)
    except HwenvError:
        pass


@pytest.mark.facts("X4")
@pytest.mark.parametrize("hierarchy", ["FLAT", "COMBINED"])
def test_subdevice_entries_are_refused_in_a_tile_hierarchy(hierarchy):
    # Level Zero spec, Affinity Mask: under FLAT "0.0 is not valid"; compute-runtime skips X.Y under FLAT and COMBINED
    with pytest.raises(AffinityMaskError) as error:
        parse_affinity_mask("0,1.1", hierarchy=hierarchy)
    assert f"ZE_FLAT_DEVICE_HIERARCHY={hierarchy}" in str(error.value) and "1.1" in str(error.value)
    assert parse_affinity_mask("0,3", hierarchy=hierarchy) == (AffinityEntry(0), AffinityEntry(3))


def test_composite_accepts_subdevices_and_without_a_hierarchy_only_the_grammar_is_checked():
    assert parse_affinity_mask("0,1.0,1.1", hierarchy="COMPOSITE")[1] == AffinityEntry(1, 0)
    assert parse_affinity_mask("0.1") == (AffinityEntry(0, 1),)  # grammar only: no hierarchy given


def test_device_count_bounds_the_devices_of_the_hierarchy():
    # two 2-tile cards: 4 FLAT devices, 2 COMPOSITE devices
    assert len(parse_affinity_mask("3", device_count=4, hierarchy="FLAT")) == 1
    with pytest.raises(AffinityMaskError, match="only 2 device"):
        parse_affinity_mask("2.0", device_count=2, hierarchy="COMPOSITE")


def test_visible_root_devices_counts_cards_once():
    from hwenv.affinity import visible_root_devices

    assert visible_root_devices(parse_affinity_mask("1.1,1.2", hierarchy="COMPOSITE")) == 1
    assert visible_root_devices(parse_affinity_mask("0,1.0,1.1", hierarchy="COMPOSITE")) == 2
