"""Apple GPUs through `torch.backends.mps`."""

from __future__ import annotations

from ..probes import ProbeResult, torch_missing, torch_module
from .base import Platform

PLATFORM = Platform(
    kind="mps",
    device_type="mps",
    display_name="Apple GPU (MPS)",
    probe="hwenv.platforms.mps:probe",
    priority=50,
    indexed_device=False,
    dist_backend="gloo",
    compile_backend="inductor",
    graph_api="none",
    triton=False,
    torch_module="torch.mps",
    bf16_api="always on (torch.backends.mps)",
    vendor="apple",
)


def probe() -> ProbeResult:
    """Apple GPU through `torch.backends.mps`."""
    if (missing := torch_missing("mps")) is not None:
        return missing
    torch = torch_module()
    if not torch.backends.mps.is_available():
        return ProbeResult("mps", False, reason="torch.backends.mps.is_available() is False")
    return ProbeResult("mps", True, 1, ("Apple MPS",), True)
