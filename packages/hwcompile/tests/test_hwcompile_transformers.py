"""hwcompile beside Transformers' own Gaudi wrapper of torch.compile, in both orders (issue 23 point 3, G13).

Transformers' wrapper is never imitated here: its real `is_torch_hpu_available()` runs against
`hwenv.testing.fake_gaudi` and installs its real `hpu_backend_compile` as `torch.compile`.
"""

from __future__ import annotations

import inspect
import logging

import hwcompile
import hwenv
import pytest
import torch
from hwcompile.layers import layers
from hwcompile.testing import routing_warnings, transformers_warnings
from hwcompile.transformers_wrapper import (
    TRANSFORMERS_LOGGER,
    asked_backend,
    under_transformers_wrapper,
)

GAUDI = hwenv.Accelerator("hpu", 8)
ORDERS = ["transformers first", "hwcompile first"]


def _transformers_wraps():
    """Run transformers' real Gaudi check; on the fake Gaudi it replaces torch.compile (once, never undone)."""
    from transformers.utils import import_utils

    before = torch.compile
    import_utils.is_torch_hpu_available.cache_clear()
    assert import_utils.is_torch_hpu_available() is True
    assert hwcompile.is_transformers_wrapper(torch.compile) and torch.compile is not before
    return torch.compile


def _stack(order):
    """Install both wrappers in `order`; returns (patch handle, transformers' wrapper)."""
    if order == "transformers first":
        hf_wrapper = _transformers_wraps()
        return hwcompile.patch_torch_compile(GAUDI), hf_wrapper
    patch = hwcompile.patch_torch_compile(GAUDI)
    return patch, _transformers_wraps()


def _plus(k):
    return lambda t: t + k


def _times(k):
    return lambda t: t * k


def _my_backend(gm, example_inputs):
    return gm.forward


# ---- what Transformers really installs (the facts the rest relies on) ---------------------------

@pytest.mark.facts("G13")
def test_transformers_wrapper_is_what_hwcompile_expects(gaudi, caplog, transformers_logs):
    caplog.set_level(logging.WARNING)
    torch_function = torch.compile
    hf_wrapper = _transformers_wraps()
    assert str(inspect.signature(hf_wrapper)) == "(*args, **kwargs)"  # its signature hides torch's keywords
    assert under_transformers_wrapper(hf_wrapper) is torch_function
    assert layers(hf_wrapper) == [hf_wrapper, torch_function]
    x = torch.randn(3)
    for step in range(2):
        torch.testing.assert_close(torch.compile(_plus(step), backend="inductor")(x), x + step)
    assert len(transformers_warnings(caplog.records)) == 2  # it warns on every call
    assert len(gaudi.graphs) == 2  # and reroutes to hpu_backend by itself


# ---- torch.compile's keywords after Transformers wrapped it -------------------------------------

@pytest.mark.facts("G13")
@pytest.mark.parametrize("order", ["transformers only", *ORDERS])
def test_compile_accepts_torch_compile_keywords_under_transformers_wrapper(gaudi, order):
    if order == "transformers only":
        _transformers_wraps()
        patch = None
    else:
        patch, _ = _stack(order)
    try:
        x = torch.randn(4)
        fast = hwcompile.compile(lambda t: t.sin() + 1, fullgraph=True, dynamic=False, mode="max-autotune")
        tuned = hwcompile.compile(lambda t: t.cos() - 1, "inductor", options={"keep_input_mutations": True})
        torch.testing.assert_close((fast(x), tuned(x)), (x.sin() + 1, x.cos() - 1))
    finally:
        if patch is not None:
            patch.undo()
    assert len(gaudi.graphs) == 2
    assert gaudi.calls == [{}, {"options": {"keep_input_mutations": True}}]  # mode dropped, option kept
    assert {"fullgraph", "dynamic", "mode", "options"} <= hwcompile.torch_compile_keywords()


def test_unknown_keywords_are_still_refused_under_transformers_wrapper(gaudi):
    _transformers_wraps()
    with pytest.raises(hwcompile.CompileArgumentError, match="takes no keyword 'fullgrph'.*fullgraph"):
        hwcompile.compile(lambda t: t, fullgrph=True)
    assert gaudi.graphs == []


def test_recorded_keywords_are_the_installed_torch_compile_keywords():
    real = torch.compile  # no wrapper in this test
    keywords = {p.name for p in inspect.signature(real).parameters.values() if p.kind is p.KEYWORD_ONLY}
    assert hwcompile.TORCH_COMPILE_KEYWORDS == keywords
    assert hwcompile.torch_compile_function() is real
    assert hwcompile.torch_compile_keywords() == keywords


def test_keywords_under_a_wrapper_that_hides_torch_function(gaudi, monkeypatch):
    hf_wrapper = _transformers_wraps()
    assert hwcompile.torch_compile_function() is not None  # found under transformers' closure

    def opaque(*args, **kwargs):  # says nothing about what it wraps
        return hf_wrapper(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", opaque)
    assert hwcompile.torch_compile_function() is None
    assert hwcompile.torch_compile_keywords() == hwcompile.TORCH_COMPILE_KEYWORDS
    x = torch.randn(2)
    torch.testing.assert_close(hwcompile.compile(lambda t: t * 2, fullgraph=True)(x), x * 2)


# ---- one warning per backend, in both orders -------------------------------------------------

@pytest.mark.facts("G13")
@pytest.mark.parametrize("order", ORDERS)
def test_routing_is_logged_once_per_backend_in_both_orders(gaudi, caplog, transformers_logs, order):
    caplog.set_level(logging.WARNING)
    patch, _ = _stack(order)
    x = torch.randn(4)
    try:
        for step in range(2):
            torch.testing.assert_close(torch.compile(_plus(step), backend="inductor")(x), x + step)
            torch.testing.assert_close(torch.compile(_times(step), backend=_my_backend)(x), x * step)
        torch.testing.assert_close(torch.compile(lambda t: t - 1)(x), x - 1)  # None: the default, inductor
    finally:
        patch.undo()
    assert len(gaudi.graphs) == 5  # every call reached hpu_backend
    messages = [r.getMessage() for r in routing_warnings(caplog.records)]
    assert len(messages) == 2, messages  # 'inductor' (and None, the same backend) and the callable
    assert any("'inductor'" in m for m in messages) and any("callable _my_backend" in m for m in messages)  # the object itself
    assert transformers_warnings(caplog.records) == []  # folded while the patch is held


def test_the_fold_reads_the_backend_from_the_text_outside_the_wrapper():
    def record(text):
        return logging.LogRecord(TRANSFORMERS_LOGGER, logging.WARNING, __file__, 1, text, None, None)

    assert asked_backend(record("Calling torch.compile with backend=aot_eager on a Gaudi device is not "
                                "supported. We will override the backend with 'hpu_backend' to avoid errors.")) \
        == "aot_eager"
    assert asked_backend(record("Calling torch.compile with backend=None on a Gaudi device is not supported.")) is None


# ---- is_patched() and undo(), in both orders -------------------------------------------------

@pytest.mark.facts("G13")
def test_transformers_first_patch_wraps_it_and_undo_puts_it_back(gaudi, caplog, transformers_logs):
    caplog.set_level(logging.WARNING)
    hf_wrapper = _transformers_wraps()
    patch = hwcompile.patch_torch_compile(GAUDI)
    assert patch.over_transformers and hwcompile.is_patched()
    assert torch.compile.__wrapped__ is hf_wrapper and patch.original is hf_wrapper
    patch.undo()
    assert torch.compile is hf_wrapper and not hwcompile.is_patched()  # transformers' wrapper stays
    x = torch.randn(2)
    torch.testing.assert_close(torch.compile(lambda t: t + 3, backend="inductor")(x), x + 3)
    assert len(transformers_warnings(caplog.records)) == 1  # its own behaviour is back, unfolded


@pytest.mark.facts("G13")
def test_hwcompile_first_is_patched_under_transformers_and_undo_keeps_its_wrapper(gaudi, caplog,
                                                                                   transformers_logs):
    caplog.set_level(logging.INFO)
    torch_function = torch.compile
    patch = hwcompile.patch_torch_compile(GAUDI)
    ours = torch.compile
    hf_wrapper = _transformers_wraps()  # transformers wraps hwcompile's wrapper
    assert under_transformers_wrapper(hf_wrapper) is ours
    assert hwcompile.is_patched()  # every call still goes through hwcompile's wrapper
    patch.undo()
    assert torch.compile is hf_wrapper  # not removed, and torch's function not put back over it
    assert torch.compile is not torch_function and not hwcompile.is_patched()
    assert any("Transformers' Gaudi wrapper was installed over hwcompile's patch" in r.getMessage()
               for r in caplog.records)
    graphs = []

    def their_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(3)
    torch.testing.assert_close(ours(lambda t: t * 9, backend=their_backend)(x), x * 9)
    assert len(graphs) == 1 and gaudi.graphs == []  # hwcompile's wrapper under it passes calls through

    again = hwcompile.patch_torch_compile(GAUDI)  # a new patch goes on top of transformers' wrapper
    assert hwcompile.is_patched() and again.over_transformers and torch.compile.__wrapped__ is hf_wrapper
    again.undo()
    assert torch.compile is hf_wrapper and not hwcompile.is_patched()


@pytest.mark.facts("G13")
def test_compile_under_transformers_wrapper_warns_once(gaudi, caplog, transformers_logs):
    caplog.set_level(logging.WARNING)
    _transformers_wraps()
    x = torch.randn(4)
    for step in range(2):
        torch.testing.assert_close(hwcompile.compile(_times(step), "aot_eager")(x), x * step)
    assert len(gaudi.graphs) == 2
    assert len(routing_warnings(caplog.records)) == 1 and transformers_warnings(caplog.records) == []
