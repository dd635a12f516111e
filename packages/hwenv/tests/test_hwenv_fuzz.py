"""Fuzz every hwenv parser of user input (issue 27): a clear `HwenvError` or a valid result, never another exception.

Bounded example counts keep the file to a few seconds; `derandomize` makes a failure reproducible.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from hwenv import HwenvError, current_selection, parse_affinity_mask, parse_hierarchy, select
from hwenv.affinity import format_affinity_mask
from hwenv.cli import main
from hwenv.gaudi import (
    HlSmiRow,
    execution_mode,
    int64_status,
    module_pin,
    modules_for_processes,
    parse_hl_smi_csv,
    parse_id_list,
)
from hwenv.gaudi.selecting import environment_devices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: Characters that real values use, plus the ones that break naive parsers (non-ASCII digits, signs, spaces).
ALPHABET = "0123456789,.:- x_+²٣\t\n"
values = st.text(alphabet=ALPHABET, max_size=12) | st.text(max_size=8)
hierarchies = st.sampled_from(["FLAT", "COMPOSITE", "COMBINED", "flat", "", " FLAT ", "TILE", None])
rows = st.tuples(st.integers(0, 9), st.integers(0, 9)).map(lambda pair: HlSmiRow(*pair))
row_sets = st.lists(rows, max_size=8, unique_by=(lambda r: r.index, lambda r: r.module_id)).map(tuple)


def _ok_or_hwenv_error(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except HwenvError as error:
        assert str(error), "an error without a message"
        return None


@FUZZ
@given(mask=values, count=st.none() | st.integers(0, 16), hierarchy=hierarchies)
def test_affinity_mask(mask, count, hierarchy):
    entries = _ok_or_hwenv_error(parse_affinity_mask, mask, count, hierarchy=hierarchy)
    if entries is not None:  # a valid mask formats back to one that parses to the same entries
        assert parse_affinity_mask(format_affinity_mask(entries)) == entries
        assert count is None or all(entry.device < count for entry in entries)


@FUZZ
@given(value=values | st.sampled_from(["FLAT", "COMPOSITE", "COMBINED"]))
def test_hierarchy_values(value):
    _ok_or_hwenv_error(parse_hierarchy, value)


@FUZZ
@given(text=values, variable=st.sampled_from(["HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES"]))
def test_gaudi_id_lists(text, variable):
    ids = _ok_or_hwenv_error(parse_id_list, text, variable)
    if ids is not None:
        assert ids and len(set(ids)) == len(ids) and all(i >= 0 for i in ids)


@FUZZ
@given(lines=st.lists(st.text(alphabet="0123456789, index_module\t", max_size=16), max_size=6),
       header=st.booleans())
def test_hl_smi_csv(lines, header):
    text = "\n".join((["index, module_id"] if header else []) + lines)
    parsed = _ok_or_hwenv_error(parse_hl_smi_csv, text)
    if parsed is not None:
        assert len({r.index for r in parsed}) == len(parsed) == len({r.module_id for r in parsed})


@FUZZ
@given(pin=values, modules=st.none() | values, nproc=st.integers(-1, 9))
def test_module_pin_and_processes(pin, modules, nproc):
    env = {"HLS_MODULE_ID": pin, **({} if modules is None else {"HABANA_VISIBLE_MODULES": modules})}
    _ok_or_hwenv_error(module_pin, env)
    used = _ok_or_hwenv_error(modules_for_processes, nproc, env)
    assert used is None or len(used) == nproc


@FUZZ
@given(lazy=st.none() | values, int64=st.none() | values, version=st.none() | st.text(max_size=8),
       device=st.none() | st.sampled_from(["GAUDI", "GAUDI2", "GAUDI3", "HL-225", ""]))
def test_lazy_mode_and_int64_values(lazy, int64, version, device):
    env = {k: v for k, v in (("PT_HPU_LAZY_MODE", lazy), ("PT_ENABLE_INT64_SUPPORT", int64)) if v is not None}
    mode = execution_mode(env, plugin_version=version)  # never raises: the bridge reads any value
    assert mode.lazy == (lazy != "0") if lazy is not None else True
    status = _ok_or_hwenv_error(int64_status, env, device_name=device, mode=mode)
    assert status is not None and isinstance(status.reason, str)


@FUZZ
@given(kind=st.sampled_from(["hpu", "xpu", "rocm", "cuda", "mps", "cpu", "gpu", ""]), devices=st.none() | values,
       by=st.sampled_from(["module", "index", "card"]), count=st.none() | st.integers(1, 8), hl_smi=row_sets,
       hierarchy=hierarchies)
def test_select(kind, devices, by, count, hl_smi, hierarchy):
    selection = _ok_or_hwenv_error(select, kind, devices, by=by, device_count=count, hl_smi_rows=hl_smi,
                                   hierarchy=hierarchy)
    if selection is not None:
        assert isinstance(selection.env(), dict)


@FUZZ
@given(kind=st.sampled_from(["hpu", "xpu", "rocm", "cuda"]), hl_smi=row_sets,
       env=st.dictionaries(st.sampled_from(["ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY", "HABANA_VISIBLE_MODULES",
                                            "HABANA_VISIBLE_DEVICES", "HLS_MODULE_ID", "CUDA_VISIBLE_DEVICES",
                                            "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]), values, max_size=4))
def test_current_selection_from_the_environment(kind, hl_smi, env):
    _ok_or_hwenv_error(current_selection, kind, env, hl_smi_rows=hl_smi)
    _ok_or_hwenv_error(environment_devices, env, hl_smi)


TOKENS = ["env", "--kind", "xpu", "hpu", "cuda", "rocm", "cpu", "--devices", "0", "0,1", "0.1", "3", "x", "",
          "--by", "index", "module", "--no-pci-order", "--format", "json", "docker", "--verbose", "-h", "--"]


@FUZZ
@given(argv=st.lists(st.sampled_from(TOKENS), max_size=7))
def test_cli_argument_vectors(clean_device_env, argv):
    """`hwenv env ARGV`: exit 0, or exit 2 with exactly one stderr line and no traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["env", *argv])
        except SystemExit as stop:  # argparse: usage errors (2) and --help (0)
            code = stop.code
    text = err.getvalue()
    if "--verbose" not in argv:
        assert "Traceback" not in text
    assert code in (0, 2), (argv, code, text)
    if code == 2 and "--verbose" not in argv:
        assert len(text.splitlines()) == 1, text
    if code == 0:
        assert text == ""


def test_fuzz_check_can_fail():
    """The helper lets only HwenvError through: another exception fails the test."""
    with pytest.raises(ZeroDivisionError):
        _ok_or_hwenv_error(lambda: 1 / 0)
