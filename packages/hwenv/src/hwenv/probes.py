"""`ProbeResult` and `run_probe`: is one device kind usable here, how many, names, bf16, memory.

Each platform module (`hwenv/platforms/<kind>.py`) has the probe of its kind; every probe
imports torch (and `habana_frameworks`) lazily and any failure becomes a reason string: a
missing or broken stack is never a crash.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProbeResult:
    """What one probe found: `available` with its facts, or a `reason` why not."""

    kind: str
    available: bool
    count: int = 0
    names: tuple[str, ...] = ()
    bf16: bool | None = None
    memory: tuple[int, ...] = ()
    capability: tuple[int, int] | None = None
    reason: str = ""
    details: dict[str, str] = field(default_factory=dict)
    bf16_source: str = ""
    memory_source: str = ""
    bf16_emulated: bool = False  # bf16 runs, emulated (torch's default is_bf16_supported() says yes; not native)


def torch_module():
    """`torch`, imported on first use."""
    return importlib.import_module("torch")


def torch_missing(kind: str) -> ProbeResult | None:
    """An unavailable result when torch is not installed, else None."""
    if importlib.util.find_spec("torch") is None:
        return ProbeResult(kind, False, reason="torch is not installed")
    return None


def memory_of(props_getter, count: int) -> tuple[int, ...]:
    """`total_memory` of each device's properties; empty when any is unreadable."""
    sizes = []
    for index in range(count):
        total = getattr(props_getter(index), "total_memory", None)
        if not isinstance(total, int):
            return ()
        sizes.append(total)
    return tuple(sizes)


def _resolve(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def run_probe(kind: str) -> ProbeResult:
    """Run the probe of `kind`'s platform; any exception becomes an unavailable result with the reason."""
    from .platforms import get_platform

    platform = get_platform(kind)
    try:
        result = _resolve(platform.probe)()
    except Exception as error:  # a broken stack is a reason, never a crash
        return ProbeResult(kind, False, reason=f"probe failed: {type(error).__name__}: {error}")
    if not isinstance(result, ProbeResult) or result.kind != kind:
        return ProbeResult(kind, False, reason=f"probe {platform.probe} returned {result!r}, not a ProbeResult of {kind!r}")
    return result
