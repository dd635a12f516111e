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


#: Where the Gaudi bridge keeps its graph API and its lazy/eager answer (gaudi-pytorch-bridge 1.19.0,
#: python_packages/habana_frameworks/torch/hpu/graphs.py and utils/internal.py `is_lazy`).
HPU_GRAPHS_MODULE = "habana_frameworks.torch.hpu.graphs"
HPU_INTERNAL_MODULE = "habana_frameworks.torch.utils.internal"


def graph_tools(platform: Platform) -> GraphTools | None:
    """The platform's graph-capture API in one shape, or None where it has none that captures here.

    - `cuda_graphs`: `torch.cuda.CUDAGraph` / `torch.cuda.graph` (also HIP on ROCm).
    - `xpu_graphs`: `torch.xpu.XPUGraph` / `torch.xpu.graph` (torch/xpu/graphs.py).
    - `hpu_graphs`: the Gaudi bridge's `habana_frameworks.torch.hpu.graphs.HPUGraph` (`capture_begin(dry_run=False)`,
      `capture_end()`, `replay(asynchronous=False)`) and its context `graph(hpu_graph, stream=None,
      dry_run=False)`, with `torch.hpu.Stream`, `current_stream(device=None)` and `stream(stream)`
      (hpu/streams.py), read from gaudi-pytorch-bridge 1.19.0 (commit 5a56187). Only in lazy mode:
      `HPUGraph::capture_begin` (backend/habana_device/HPUGraph.cpp) records into the lazy execution
      context, and `hpu/__init__.py` re-exports the graph API only `if is_lazy()`. In eager mode, or
      without the bridge, None (compile with `hpu_backend` instead).
    - anything else (CPU, MPS): None.
    """
    if platform.graph_api == "hpu_graphs":
        return _hpu_graph_tools(platform)
    if platform.graph_api not in ("cuda_graphs", "xpu_graphs"):
        return None
    module = device_module(platform)
    graph_class = getattr(module, "CUDAGraph" if platform.graph_api == "cuda_graphs" else "XPUGraph")
    return GraphTools(platform.graph_api, graph_class, module.graph, module.Stream, module.current_stream, module.stream)


def _hpu_graph_tools(platform: Platform) -> GraphTools | None:
    """HPU graphs from the bridge (see `graph_tools`): None without the bridge or in eager mode."""
    try:
        module = device_module(platform)
        internal = importlib.import_module(HPU_INTERNAL_MODULE)
        graphs = importlib.import_module(HPU_GRAPHS_MODULE)
    except ImportError:
        return None
    if not internal.is_lazy():
        return None
    return GraphTools(platform.graph_api, graphs.HPUGraph, graphs.graph, module.Stream, module.current_stream,
                      module.stream)
