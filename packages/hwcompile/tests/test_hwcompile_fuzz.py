"""Fuzz hwcompile's input checks (issue 27): a clear error or a valid result, never another exception.

hwcompile has no CLI; its user input is `compile()`'s / `route_backend()`'s arguments and
`PT_HPU_LAZY_MODE`. Errors are `HwcompileError`, or `HwenvError` for an unknown device kind
(raised by `hwenv.Accelerator`, which names the known kinds).
"""

from __future__ import annotations

import hwenv
import pytest
from hwcompile.compiling import check_kwargs
from hwcompile.errors import HwcompileError
from hwcompile.gaudi import gaudi_mode, translate_kwargs
from hwcompile.routing import route_backend, validate_backend
from hypothesis import given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=80, deadline=None, derandomize=True)
FAMILY = (HwcompileError, hwenv.HwenvError)
backends = st.none() | st.text(max_size=12) | st.sampled_from(["inductor", "hpu_backend", "eager", "aot_eager", " "]) \
    | st.integers() | st.just(lambda gm, inputs: gm)
keys = st.sampled_from(["mode", "options", "fullgraph", "dynamic", "name", "disable", "backend", "bogus"])
option_keys = st.text(max_size=10) | st.integers() | st.sampled_from(["triton.cudagraphs", "use_inplace_index_copy"])
kwarg_values = st.none() | st.booleans() | st.text(max_size=8) | st.dictionaries(option_keys, st.booleans(), max_size=3) \
    | st.lists(st.integers(), max_size=2)


def _ok_or_family(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except FAMILY as error:
        assert str(error)
        return None


@FUZZ
@given(backend=backends)
def test_validate_backend(backend):
    _ok_or_family(validate_backend, backend)


@FUZZ
@given(kind=st.sampled_from(["hpu", "xpu", "rocm", "cuda", "mps", "cpu", "tpu", ""]), backend=backends)
def test_route_backend(kind, backend):
    decision = _ok_or_family(route_backend, kind, backend)
    if decision is not None:
        assert decision.backend is not None and decision.reason


@FUZZ
@given(kwargs=st.dictionaries(keys, kwarg_values, max_size=4), backend=st.sampled_from(["hpu_backend", "eager"]))
def test_compile_keywords(kwargs, backend):
    if _ok_or_family(check_kwargs, dict(kwargs)) is None and _raised(check_kwargs, dict(kwargs)):
        return
    out = translate_kwargs(backend, dict(kwargs))  # what check_kwargs lets through must translate
    assert "mode" not in out or out["mode"] in (None, "default")


def _raised(function, *args) -> bool:
    try:
        function(*args)
    except FAMILY:
        return True
    return False


@FUZZ
@given(value=st.none() | st.text(alphabet="01 truefalsTRUE²\t", max_size=6), version=st.none() | st.text(max_size=6))
def test_lazy_mode_values(value, version):
    env = {} if value is None else {"PT_HPU_LAZY_MODE": value}
    mode = gaudi_mode(env, plugin_version=version)
    assert mode.lazy is (value != "0") if value is not None else isinstance(mode.lazy, bool)


def test_non_string_option_keys_are_a_clear_error():
    with pytest.raises(HwcompileError, match=r"options keys \[1\]"):
        check_kwargs({"options": {1: True}})
