"""Fuzz hwrun's parsers of user input (issue 27): batch files, training data (text and JSONL), the server's request
bodies and the CLI's argument vectors give a clear `HwrunError` (or argparse's exit 2) or a valid result, never
another exception.

Bounded example counts keep the file to seconds; `derandomize` makes a failure reproducible.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hwrun.cli.main import main, read_batch_file
from hwrun.errors import HwrunError
from hwrun.serve.protocol import parse_json, parse_request
from hwrun.training.data import read_documents
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: Bytes real files hold, plus invalid UTF-8, NULs, lone surrogates' encodings and odd line ends.
raw_bytes = st.binary(max_size=200) | st.text(max_size=120).map(lambda text: text.encode("utf-8", "surrogatepass"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _ok_or_hwrun_error(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except HwrunError as error:
        assert str(error).strip(), "an error must say something"
        return error


@FUZZ
@given(content=raw_bytes)
def test_batch_files(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("batch") / "prompts.txt"
    path.write_bytes(content)
    result = _ok_or_hwrun_error(read_batch_file, str(path), limit=150)
    if not isinstance(result, HwrunError):
        assert result and all(isinstance(p, str) and p.strip() for p in result)


@FUZZ
@given(content=raw_bytes, suffix=st.sampled_from([".txt", ".jsonl", ".md"]))
def test_training_data_files(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("data") / f"data{suffix}"
    path.write_bytes(content)
    result = _ok_or_hwrun_error(read_documents, path, max_bytes=150)
    if not isinstance(result, HwrunError):
        assert isinstance(result, list)


@FUZZ
@given(lines=st.lists(json_values.map(json.dumps) | st.text(max_size=20), min_size=1, max_size=5))
def test_jsonl_lines(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("jsonl") / "rows.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    _ok_or_hwrun_error(read_documents, path)


@FUZZ
@given(body=json_values, kind=st.sampled_from(["completion", "chat"]))
def test_server_request_bodies(body, kind):
    raw = json.dumps(body).encode()
    parsed = _ok_or_hwrun_error(parse_json, raw)
    if not isinstance(parsed, HwrunError):
        _ok_or_hwrun_error(parse_request, parsed, kind, "tiny")


@FUZZ
@given(raw=raw_bytes)
def test_server_raw_bodies(raw):
    _ok_or_hwrun_error(parse_json, raw)


FLAGS = ["--device", "--dtype", "--attention", "--compile", "--quantization", "--json", "--use-kernels",
         "--trust-remote-code", "--bogus"]
VALUES = ["auto", "cpu", "xpu", "hpu", "bfloat16", "float8", "eager", "sdpa", "inductr", "4bit", "", "-1", "ü"]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(argv=st.lists(st.sampled_from(FLAGS) | st.sampled_from(VALUES), max_size=5))
def test_plan_argument_vectors(argv):
    """`hwrun plan ARGV`: exit 0 with a plan, or exit 2 with one line; nothing else escapes."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["plan", *argv])
        except SystemExit as exit_:  # argparse's usage errors and --help
            code = exit_.code
    assert code in (0, 2), (argv, code, err.getvalue())
    if code == 2:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert len(lines) == 1 and "error" in lines[0], (argv, err.getvalue())
    else:
        assert out.getvalue().strip()


def test_the_fuzz_check_can_fail():
    """A parser that raised something else would fail `_ok_or_hwrun_error`."""
    with pytest.raises(ZeroDivisionError):
        _ok_or_hwrun_error(lambda: 1 / 0)
