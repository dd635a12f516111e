"""The CPU: always present; the fallback every detection ends with."""

from __future__ import annotations

import importlib.util

from ..probes import ProbeResult
from .base import Platform

PLATFORM = Platform(
    kind="cpu",
    device_type="cpu",
    display_name="CPU",
    probe="hwenv.platforms.cpu:probe",
    priority=1000,
    is_accelerator=False,
    indexed_device=False,
    dist_backend="gloo",
    compile_backend="inductor",
    graph_api="none",
    triton=False,
    bf16_api="torch (CPU bf16 arithmetic)",
    vendor="",
)


def probe() -> ProbeResult:
    """The CPU is always there; bf16 arithmetic is available when torch is."""
    has_torch = importlib.util.find_spec("torch") is not None
    return ProbeResult("cpu", True, 1, ("CPU",), has_torch, reason="" if has_torch else "torch is not installed")
