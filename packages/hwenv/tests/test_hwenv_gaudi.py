"""Gaudi selection (G6-G8): hl-smi parsing and mapping, supported partial-server groups."""

import pytest
from hwenv import (
    SUPPORTED_PARTIAL_GROUPS,
    GaudiGroupError,
    HlSmiParseError,
    HwenvError,
    check_group,
    index_to_module,
    module_to_index,
    parse_hl_smi_csv,
)
from hwenv.gaudi import read_hl_smi
from hwenv.testing import HL_SMI_CSV_8, fake_hl_smi
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.facts("G7", "G8")
def test_parses_intels_sample_format_unsorted_with_spaces():
    rows = parse_hl_smi_csv(HL_SMI_CSV_8)
    assert len(rows) == 8
    assert index_to_module(rows)[3] == 6
    assert module_to_index(rows)[6] == 3


@pytest.mark.facts("G7")
def test_blank_lines_and_crlf_are_tolerated():
    rows = parse_hl_smi_csv("\r\nindex, module_id\r\n\r\n0, 1\r\n1, 0\r\n\r\n")
    assert index_to_module(rows) == {0: 1, 1: 0}


@pytest.mark.facts("G7")
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("index\n0\n", "line 1: header"),
        ("index, module_id\n0\n", "line 2"),
        ("index, module_id\n0, x\n", "module_id 'x' is not a non-negative integer"),
        ("index, module_id\n0, 1, 2\n", "line 2"),
        ("index, module_id\n0, 1\n1, 1\n", "repeats"),
        ("index, module_id\n\n0,\n", "line 3"),
    ],
)
def test_bad_hl_smi_output_names_the_line(text, words):
    with pytest.raises(HlSmiParseError, match=words):
        parse_hl_smi_csv(text)


@pytest.mark.facts("G8")
@pytest.mark.parametrize("group", [(0, 1), (3, 2), (5, 4, 7, 6), (0, 1, 2, 3), tuple(range(8))])
def test_supported_groups_pass(group):
    check_group(group)


@pytest.mark.facts("G8")
@pytest.mark.parametrize(
    ("group", "words"),
    [((0, 1, 2), "group of 3"), ((0, 1, 2, 3, 4), "group of 5"), ((0, 2), "not a supported 2-device group"),
     ((1, 2, 3, 4), "not a supported 4-device group"), ((8, 9), "do not exist")],
)
def test_unsupported_groups_are_rejected_with_the_supported_list(group, words):
    with pytest.raises(GaudiGroupError, match=words) as error:
        check_group(group)
    assert "{0,1}" in str(error.value) or "do not exist" in str(error.value)


def test_group_table_is_intels():
    assert {len(g) for groups in SUPPORTED_PARTIAL_GROUPS.values() for g in groups} == {2, 4}
    assert frozenset({6, 7}) in SUPPORTED_PARTIAL_GROUPS[2]
    assert frozenset({4, 5, 6, 7}) in SUPPORTED_PARTIAL_GROUPS[4]


@pytest.mark.facts("G7")
def test_read_hl_smi_runs_the_real_command_line_without_a_shell():
    with fake_hl_smi():
        rows = read_hl_smi()
    assert index_to_module(rows) == index_to_module(parse_hl_smi_csv(HL_SMI_CSV_8))


def test_read_hl_smi_reports_a_failing_tool():
    with fake_hl_smi("index, module_id\n", exit_code=3), pytest.raises(HlSmiParseError, match="exited with 3"):
        read_hl_smi()


@given(st.text(max_size=80))
def test_hl_smi_parser_raises_only_package_errors(text):
    try:
        parse_hl_smi_csv(text)
    except HwenvError:
        pass


@given(st.permutations(list(range(8))))
def test_hl_smi_round_trip(modules):
    csv = "index, module_id\n" + "".join(f"{i}, {m}\n" for i, m in enumerate(modules))
    assert [index_to_module(parse_hl_smi_csv(csv))[i] for i in range(8)] == modules
