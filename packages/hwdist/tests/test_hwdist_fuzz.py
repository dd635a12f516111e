"""Fuzz every hwdist parser of user input (issue 27): a clear `HwdistError` or a valid result, never another exception.

Sizes and step factors, the launcher variables (`read_launch_env`), and the CLI's argument
vectors up to the point where work would start (`check_launch` / `check_bench` / the launch plan).
"""

from __future__ import annotations

import contextlib
import io

import hwenv
import pytest
from hwdist.cli import build_parser, main
from hwdist.cli_checks import check_bench, check_launch
from hwdist.env import VARIABLES, read_launch_env
from hwdist.errors import HwdistError
from hwdist.sizes import parse_size, parse_sizes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ALPHABET = "0123456789KMGTBkmgtib.,:- x_+²٣\t"
values = st.text(alphabet=ALPHABET, max_size=12) | st.text(max_size=6)


def _ok_or_hwdist_error(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except HwdistError as error:
        assert str(error), "an error without a message"
        return None


@FUZZ
@given(text=values)
def test_size(text):
    size = _ok_or_hwdist_error(parse_size, text)
    assert size is None or size >= 1


@FUZZ
@given(text=values | st.sampled_from(["8B..1G", "1K..1K", "1G..8B", "1K,4M", "..", "8B..", ",,"]),
       factor=st.integers(-3, 1000))
def test_sizes_and_step_factor(text, factor):
    sizes = _ok_or_hwdist_error(parse_sizes, text, factor)
    if sizes is not None:
        assert sizes and all(s >= 1 for s in sizes) and len(sizes) <= 200


@FUZZ
@given(env=st.dictionaries(st.sampled_from(VARIABLES), values | st.integers(-2, 70000).map(str), max_size=6))
def test_launch_env(env):
    launch = _ok_or_hwdist_error(read_launch_env, env)
    if launch is not None:
        assert 0 <= launch.rank < launch.world_size and 0 <= launch.local_rank < launch.local_world_size
        assert launch.master_port is None or 1 <= launch.master_port <= 65535


LAUNCH_TOKENS = ["--kind", "cpu", "cuda", "hpu", "--devices", "0", "0,1", "x", "--by", "index", "--nnodes", "2",
                 "1:4", "4:2", "--node-rank", "1", "5", "-1", "--master-port", "0", "29500", "70000", "abc",
                 "--master-addr", "", "--rdzv-backend", "c10d", "static", "--rdzv-endpoint", "h:1", "h:", ":9",
                 "--standalone", "--max-restarts", "--monitor-interval", "nan", "--nproc-per-node", "--device-count",
                 "-m", "--verbose"]


@FUZZ
@given(argv=st.lists(st.sampled_from(LAUNCH_TOKENS), max_size=8),
       script=st.sampled_from(["train.py", "missing.py", "json", "no_such_module_x", ""]))
def test_launch_argument_vectors(clean_device_env, tmp_path_factory, argv, script):
    """`hwdist launch --dry-run ARGV SCRIPT`: exit 0 or exit 2 with one stderr line (nothing is launched)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["launch", "--dry-run", *argv, "--", script] if script else ["launch", "--dry-run", *argv])
        except SystemExit as stop:
            code = stop.code
    text = err.getvalue()
    assert code in (0, 2), (argv, code, text)
    if "--verbose" not in argv:
        assert "Traceback" not in text
        if code == 2:
            assert len(text.splitlines()) == 1, text


BENCH_TOKENS = ["--sizes", "8B..1G", "1K,1M", "1T", "abc", "", "--step-factor", "0", "2", "x", "--iters", "-1",
                "--warmup", "--repeats", "--timeout", "nan", "inf", "-5", "--op", "all", "all_reduce", "--dtype",
                "fp8", "bf16"]


@FUZZ
@given(argv=st.lists(st.sampled_from(BENCH_TOKENS), max_size=8))
def test_bench_argument_vectors(argv):
    """`hwdist bench ARGV` up to the point where a group would start: a parse error (exit 2), a
    `HwdistError`, or options that are valid."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(["bench", *argv])
        except SystemExit as stop:
            assert stop.code == 2 and len(err.getvalue().splitlines()) == 1, err.getvalue()
            return
    _ok_or_hwdist_error(check_bench, args)


@FUZZ
@given(argv=st.lists(st.sampled_from(LAUNCH_TOKENS), max_size=8))
def test_check_launch_alone(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(["launch", *argv, "--", "train.py"])
        except SystemExit:
            return
    _ok_or_hwdist_error(check_launch, args)


def test_fuzz_check_can_fail():
    with pytest.raises(hwenv.HwenvError):  # another family is not let through silently
        _ok_or_hwdist_error(hwenv.select, "gpu", "0")
