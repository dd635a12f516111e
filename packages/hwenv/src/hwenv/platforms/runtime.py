"""The device calls that need torch, in one place: device module, synchronise, memory, graphs.

Only this module (and the platform probes) touch `torch.cuda`, `torch.xpu`, `torch.hpu` or
`habana_frameworks`; every other package calls these functions with a `Platform`, so a new
kind needs no edit elsewhere. torch is imported on first call, never at import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .base import Platform


def device_module(platform: Platform) -> Any | None:
    """`torch.cuda`, `torch.xpu`, `torch.hpu` (after importing the Gaudi plugin), `torch.mps`; None for CPU."""
    if platform.torch_module is None:
        return None
    torch = importlib.import_module("torch")
    if platform.plugin_module:
        importlib.import_module(platform.plugin_module)  # e.g. habana_frameworks.torch registers torch.hpu
    return getattr(torch, platform.torch_module.split(".", 1)[1])


def synchronize(platform: Platform, device: Any = None) -> None:
    """Wait for the device's queued work. Gaudi's `synchronize()` takes no argument (bridge 1.19)."""
    module = device_module(platform)
    if module is None:
        return
    if not platform.device_calls_take_index:  # the Gaudi bridge: synchronize() has no device parameter
        module.synchronize()
    else:
        module.synchronize(device)


def mem_get_info(platform: Platform, index: int = 0) -> tuple[int, int] | None:
    """(free, total) bytes of device `index` as the stack reports them, or None when it cannot."""
    module = device_module(platform)
    reader = getattr(module, "mem_get_info", None) if module is not None else None
    if reader is None:
        return None
    try:
        free, total = reader(index) if platform.device_calls_take_index else reader()
    except Exception:  # integrated XPUs and WSL raise; the caller says what it assumed
        return None
    return int(free), int(total)


def max_memory_allocated(platform: Platform, device: Any = None) -> int | None:
    """Peak bytes allocated by tensors on `device` since the last reset, or None where unknown."""
    module = device_module(platform)
    reader = getattr(module, "max_memory_allocated", None) if module is not None else None
    return int(reader(device)) if reader is not None else None


def reset_peak_memory_stats(platform: Platform, device: Any = None) -> None:
    """Start a new peak-memory measurement where the device keeps one."""
    module = device_module(platform)
    reset = getattr(module, "reset_peak_memory_stats", None) if module is not None else None
    if reset is not None:
        reset(device)


@dataclass(frozen=True)
class GraphTools:
    """A device's graph-capture API in one shape: `Graph()`, `capture(graph, stream=...)`, streams."""

    api: str
    graph_class: Any
    capture: Any
    stream_class: Any
    current_stream: Any
    use_stream: Any


def graph_tools(platform: Platform) -> GraphTools | None:
    """CUDA graphs (`torch.cuda.CUDAGraph`, also HIP on ROCm) or XPU graphs (`torch.xpu.XPUGraph`).

    None where the platform has no graph API that captures with this shape (CPU, MPS); Gaudi's
    HPU graphs (`habana_frameworks.torch.hpu.graphs`) wrap modules instead and are not returned here.
    """
    if platform.graph_api not in ("cuda_graphs", "xpu_graphs"):
        return None
    module = device_module(platform)
    graph_class = getattr(module, "CUDAGraph" if platform.graph_api == "cuda_graphs" else "XPUGraph")
    return GraphTools(platform.graph_api, graph_class, module.graph, module.Stream, module.current_stream, module.stream)
