"""Fixtures for hwcompile's tests: a stand-in hpu_backend, a clean warning registry, transformers logs."""

from __future__ import annotations

import hwcompile
import pytest
from hwcompile.testing import stand_in_hpu_backend


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test starts with no backend warned about and leaves torch.compile as it found it."""
    import torch

    original = torch.compile
    hwcompile.reset_warnings()
    yield
    hwcompile.reset_warnings()
    assert torch.compile is original, "a test left torch.compile patched"


@pytest.fixture
def hpu_backend():
    """A stand-in `hpu_backend` registered with torch._dynamo: records graphs, runs them eagerly."""
    with stand_in_hpu_backend() as backend:
        yield backend


@pytest.fixture
def dynamo_gaudi(fake_gaudi):
    """`fake_gaudi` (its fake `torch.hpu` carries the `Stream`/`Event` classes torch._dynamo reads)."""
    return fake_gaudi


@pytest.fixture
def gaudi(dynamo_gaudi, hpu_backend):
    """A fake Gaudi (hwenv.testing) plus the stand-in backend; yields the recording backend."""
    dynamo_gaudi(8)
    return hpu_backend


@pytest.fixture
def transformers_logs():
    """Let transformers' own log records reach caplog (its library logger does not propagate)."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()  # an earlier test in this worker (a CLI run) may have quieted it
    hf_logging.set_verbosity_warning()
    hf_logging.enable_propagation()
    try:
        yield
    finally:
        hf_logging.disable_propagation()
        hf_logging.set_verbosity(previous)
