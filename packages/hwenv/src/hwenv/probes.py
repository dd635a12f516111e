"""One probe per accelerator kind: is it usable here, how many, names, bf16, memory.

Every probe imports torch (and `habana_frameworks`) lazily and turns any failure into a
reason string: a missing or broken stack is never a crash.
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


def _torch():
    return importlib.import_module("torch")


def _torch_missing(kind: str) -> ProbeResult | None:
    if importlib.util.find_spec("torch") is None:
        return ProbeResult(kind, False, reason="torch is not installed")
    return None


def _memory(props_getter, count: int) -> tuple[int, ...]:
    sizes = []
    for index in range(count):
        total = getattr(props_getter(index), "total_memory", None)
        if not isinstance(total, int):
            return ()
        sizes.append(total)
    return tuple(sizes)


def probe_hpu() -> ProbeResult:
    """Intel Gaudi through `habana_frameworks.torch` and `torch.hpu` (G1, G3)."""
    if (missing := _torch_missing("hpu")) is not None:
        return missing
    if importlib.util.find_spec("habana_frameworks") is None:
        return ProbeResult("hpu", False, reason="habana_frameworks (habana-torch-plugin) is not installed")
    torch = _torch()
    importlib.import_module("habana_frameworks.torch")
    hpu = getattr(torch, "hpu", None)
    if hpu is None:
        return ProbeResult("hpu", False, reason="habana_frameworks.torch imported but torch.hpu is missing")
    if not hpu.is_available():
        return ProbeResult("hpu", False, reason="torch.hpu.is_available() is False (no Gaudi visible to this process)")
    count = int(hpu.device_count())
    names = tuple(str(hpu.get_device_name(index)) for index in range(count))
    memory: tuple[int, ...] = ()
    if hasattr(hpu, "get_device_properties"):
        memory = _memory(hpu.get_device_properties, count)
    # Every Gaudi generation supports bf16 (G12).
    return ProbeResult("hpu", True, count, names, True, memory)


def probe_xpu() -> ProbeResult:
    """Intel GPU through `torch.xpu` (X1, X3); bf16 from `torch.xpu.is_bf16_supported()` (X17)."""
    if (missing := _torch_missing("xpu")) is not None:
        return missing
    torch = _torch()
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return ProbeResult("xpu", False, reason=f"torch {torch.__version__} has no torch.xpu module")
    if not xpu.is_available():
        built = getattr(getattr(torch, "version", None), "xpu", None)
        why = "torch.xpu.is_available() is False"
        if not built:
            why += " (this torch build has no XPU backend)"
        return ProbeResult("xpu", False, reason=why, details={"torch.version.xpu": str(built)})
    count = int(xpu.device_count())
    names = tuple(str(xpu.get_device_name(index)) for index in range(count))
    return ProbeResult(
        "xpu", True, count, names, bool(xpu.is_bf16_supported()), _memory(xpu.get_device_properties, count)
    )


def probe_cuda() -> ProbeResult:
    """NVIDIA GPU through `torch.cuda`."""
    if (missing := _torch_missing("cuda")) is not None:
        return missing
    torch = _torch()
    if not torch.cuda.is_available():
        return ProbeResult("cuda", False, reason="torch.cuda.is_available() is False")
    count = int(torch.cuda.device_count())
    names = tuple(str(torch.cuda.get_device_name(index)) for index in range(count))
    capability = tuple(torch.cuda.get_device_capability(0))
    return ProbeResult(
        "cuda",
        True,
        count,
        names,
        bool(torch.cuda.is_bf16_supported()),
        _memory(torch.cuda.get_device_properties, count),
        (int(capability[0]), int(capability[1])),
    )


def probe_mps() -> ProbeResult:
    """Apple GPU through `torch.backends.mps`."""
    if (missing := _torch_missing("mps")) is not None:
        return missing
    torch = _torch()
    if not torch.backends.mps.is_available():
        return ProbeResult("mps", False, reason="torch.backends.mps.is_available() is False")
    return ProbeResult("mps", True, 1, ("Apple MPS",), True)


def probe_cpu() -> ProbeResult:
    """The CPU is always there; bf16 arithmetic is available when torch is."""
    has_torch = importlib.util.find_spec("torch") is not None
    return ProbeResult("cpu", True, 1, ("CPU",), has_torch, reason="" if has_torch else "torch is not installed")


PROBES = {"hpu": probe_hpu, "xpu": probe_xpu, "cuda": probe_cuda, "mps": probe_mps, "cpu": probe_cpu}


def run_probe(kind: str) -> ProbeResult:
    """Run one probe; any exception becomes an unavailable result with the error as reason."""
    try:
        return PROBES[kind]()
    except Exception as error:  # a broken stack is a reason, never a crash
        return ProbeResult(kind, False, reason=f"probe failed: {type(error).__name__}: {error}")
