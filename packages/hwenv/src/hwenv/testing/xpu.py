"""`fake_xpu`: the real `torch.xpu` (and `torch.accelerator`) made to report Intel GPUs.

What it models, and from which source (read 2026-12; INTEL.md S1, S5, S6):
- `device_count()` follows the Level Zero device model (`hwenv.hierarchy.exposed_devices`, from the
  spec's "Device Hierarchy"/"Affinity Mask" and `intel/compute-runtime`'s `parseAffinityMask`):
  `count` cards of `tiles` tiles; FLAT/COMBINED (the default, as in `torch/xpu/__init__.py`'s
  Sysman count) expose `count * tiles` devices, COMPOSITE `count`; `ZE_AFFINITY_MASK` then
  filters them, renumbered from 0. Both variables are read from `os.environ` at every call.
- `is_bf16_supported(including_emulation=True)` is torch's own body: False only when no XPU is
  available, else `including_emulation or get_device_properties().has_bfloat16_conversions`.
- `get_device_properties()` has every field of torch's `_XpuDeviceProperties` (`torch/_C/__init__.pyi`).
- `mem_get_info()` returns (free, total), or raises torch's RuntimeError ("doesn't support
  querying the available free memory", `torch/csrc/xpu/Module.cpp`) where the device lacks
  `ext_intel_free_memory`: integrated GPUs and WSL by default, and any card made with
  `free_memory_query=False`; with `needs_sysman=True` a card (discrete too) reports it only while
  `ZES_ENABLE_SYSMAN=1` is set (intel/llvm `sycl/doc/extensions/supported/sycl_ext_intel_device_info.md`,
  "Free Global Memory": "one may need to set ZES_ENABLE_SYSMAN=1 to fully enable this extension").
- `torch.accelerator` answers `xpu` (`current_accelerator`, `device_count`, `is_available`,
  `current_device_index`, `set_device_index`, `synchronize`, `get_memory_info`), which is what
  Accelerate 1.16's `get_torch_accelerator_backend` (`utils/imports.py`) and `PartialState` read.
- Graphs (`torch/xpu/graphs.py`, `torch/xpu/streams.py`): `torch.xpu.XPUGraph(keep_graph=False)` with
  torch's methods (`capture_begin(pool=None)`, `capture_end()`, `replay()`, `instantiate()`, `reset()`,
  `pool()`, ...) records the aten ops run between capture_begin and capture_end and replays them on
  the same tensors (`hwenv.testing.graphs.OpTape`; a host read during capture raises);
  `torch.xpu.Stream(device=None, priority=0, **kwargs)` (a context manager, as torch's),
  `current_stream(device=None)` and `stream(stream)`. torch's own `torch.xpu.graph` context (pure
  Python) is left as it is and drives them. Every graph call is appended to `graph_events`.
Everything is undone on exit.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any

from ..errors import DeviceHierarchyError
from ..hierarchy import HIERARCHY_VARIABLE, Card, driver_order, exposed_devices, parse_hierarchy
from ..platforms.xpu import SYSMAN_VARIABLE
from .common import DEVICE_VARIABLES, GiB, _device_index, _Patches, clear_library_caches
from .graphs import OpTape

MASK_VARIABLE = "ZE_AFFINITY_MASK"
PCI_ORDER_VARIABLE = "ZE_ENABLE_PCI_ID_DEVICE_ORDER"


def _parse_bdf(text: str) -> tuple[int, int, int, int]:
    """`0000:03:00.0` -> (domain, bus, device, function), as the driver's `PhysicalDevicePciBusInfo` holds it."""
    domain, bus, rest = text.split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def _cards(count: int, integrated, pci) -> tuple[Card, ...]:
    """The physical cards: `integrated` one bool for all or one per card; `pci` BDF strings, else integrated GPUs on
    bus 0 (00:02.x, where Intel puts them) and discrete ones on buses 3, 4, ..."""
    flags = [bool(integrated)] * count if isinstance(integrated, bool) else [bool(f) for f in integrated]
    if len(flags) != count:
        raise ValueError(f"fake_xpu: integrated={integrated!r} must be one bool or {count} of them")
    if pci is None:
        pci = [f"0000:00:02.{i}" if flag else f"0000:{3 + i:02x}:00.0" for i, flag in enumerate(flags)]
    if len(pci) != count:
        raise ValueError(f"fake_xpu: pci={pci!r} must name {count} PCI addresses")
    return tuple(Card(_parse_bdf(address), flag) for address, flag in zip(pci, flags, strict=True))


def _hierarchy_now() -> str:
    """The hierarchy the fake driver uses: the variable, or FLAT for unset/unknown values
    (torch's Sysman count exposes tiles unless the value is exactly COMPOSITE)."""
    try:
        return parse_hierarchy(os.environ.get(HIERARCHY_VARIABLE)).value
    except DeviceHierarchyError:
        return "FLAT"


def _xpu_properties(name: str, memory: int, *, native_bf16: bool, integrated: bool, fp64: bool,
                    index: int) -> types.SimpleNamespace:
    """Every field of torch's `_XpuDeviceProperties`, with plausible values."""
    return types.SimpleNamespace(
        name=name, platform_name="Intel(R) oneAPI Unified Runtime over Level-Zero", vendor="Intel(R) Corporation",
        device_id=0x0BD5 if not integrated else 0x7D55, driver_version="1.6.33578+15", version="12.60.7",
        max_compute_units=512 if not integrated else 128, gpu_eu_count=512 if not integrated else 128,
        max_work_group_size=1024, max_num_sub_groups=64, memory_clock_rate=3200, memory_bus_width=64,
        sub_group_sizes=[16, 32], local_mem_size=128 * 1024, last_level_cache_size=204 * 2**20,
        has_fp16=True, has_fp64=fp64, has_atomic64=True, has_bfloat16_conversions=native_bf16,
        has_subgroup_matrix_multiply_accumulate=native_bf16,
        has_subgroup_matrix_multiply_accumulate_tensor_float32=native_bf16, has_subgroup_2d_block_io=not integrated,
        is_integrated_gpu=integrated, total_memory=memory, gpu_subslice_count=64 if not integrated else 8,
        architecture=0, type="gpu", uuid=bytes([index]) * 16,
    )


def _xpu_functions(cards: int, tiles: int, name: str, memory: int, *, native_bf16: bool, integrated,
                   fp64: bool, free_memory_query, free: int | None, needs_sysman: bool = False,
                   pci=None) -> dict[str, Any]:
    """Functions with the signatures (and, where torch's are pure Python, the bodies) of `torch.xpu`'s.

    The driver sorts the cards (`driver_order`: discrete before integrated unless `ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`,
    then PCI) before it applies the hierarchy and the mask, as compute-runtime's `device_factory.cpp` does."""
    state = {"current": 0}
    physical = _cards(cards, integrated, pci)

    def devices():
        order = driver_order(physical, os.environ.get(PCI_ORDER_VARIABLE) == "1")
        return exposed_devices(cards, tiles, _hierarchy_now(), os.environ.get(MASK_VARIABLE), order=order)

    def card_of(index: int) -> Card:
        return physical[devices()[index].card]

    def can_query(index: int) -> bool:
        flag = card_of(index).integrated
        query = (not flag) if free_memory_query is None else free_memory_query
        return query and not (needs_sysman and os.environ.get(SYSMAN_VARIABLE) != "1")

    def device_memory(index: int) -> int:
        # a card's memory is shared by its tiles: a FLAT tile-device has its share
        return memory * len(devices()[index].tiles) // tiles

    def is_available() -> bool:
        return device_count() > 0

    def device_count() -> int:
        return len(devices())

    def get_device_name(device=None) -> str:
        return get_device_properties(device).name

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        # torch/xpu/__init__.py, verbatim in logic
        if not is_available():
            return False
        return including_emulation or get_device_properties().has_bfloat16_conversions

    def get_device_properties(device=None):
        index = _device_index(device if device is not None else state["current"], device_count())
        card = card_of(index)
        return _xpu_properties(name, device_memory(index), native_bf16=native_bf16, integrated=card.integrated,
                               fp64=fp64, index=index)

    def get_device_capability(device=None) -> dict[str, Any]:
        props = get_device_properties(device)
        return {key: value for key, value in vars(props).items() if not isinstance(value, bytes)}

    def mem_get_info(device=None) -> tuple[int, int]:
        index = _device_index(device if device is not None else state["current"], device_count())
        if not can_query(index):
            raise RuntimeError(
                f"The device ({name}) doesn't support querying the available free memory. You can file an issue at "
                f"https://github.com/pytorch/pytorch/issues to help us prioritize its implementation."
            )
        total = device_memory(index)
        return (total if free is None else min(free, total)), total

    def current_device() -> int:
        return state["current"]

    def set_device(device) -> None:
        state["current"] = _device_index(device, device_count())

    def synchronize(device=None) -> None:
        return None

    return {f.__name__: f for f in (is_available, device_count, get_device_name, is_bf16_supported,
                                      get_device_properties, get_device_capability, mem_get_info, current_device,
                                      set_device, synchronize)}


class _XPUStream:
    """`torch.xpu.Stream`'s methods and signatures (torch/xpu/streams.py); nothing is queued."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device, self.priority = device, priority
        self._previous = None

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        _XPU_GRAPH_STATE["events"].append("wait_stream")

    def record_event(self, event=None):
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        self._previous = _XPU_GRAPH_STATE["current"]
        _XPU_GRAPH_STATE["current"] = self
        _XPU_GRAPH_STATE["events"].append("use_stream")
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        _XPU_GRAPH_STATE["current"] = self._previous


class _XPUGraph:
    """`torch.xpu.XPUGraph`'s methods and signatures; capture records aten ops, replay reruns them (`OpTape`)."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.keep_graph = keep_graph
        self.tape = OpTape("fake XPUGraph")
        self.captured = False

    def capture_begin(self, pool=None) -> None:
        _XPU_GRAPH_STATE["events"].append("capture_begin")
        self.captured = False
        self.tape.begin()

    def capture_end(self) -> None:
        _XPU_GRAPH_STATE["events"].append("capture_end")
        self.tape.end()
        self.captured = True

    def instantiate(self) -> None:
        pass

    def replay(self) -> None:
        _XPU_GRAPH_STATE["events"].append("replay")
        if not self.captured:
            raise RuntimeError("fake XPUGraph: replay() before capture_end()")
        self.tape.replay()

    def reset(self) -> None:
        self.tape = OpTape("fake XPUGraph")
        self.captured = False

    def pool(self):
        return (0, id(self))

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, debug_path: str) -> None:
        pass

    def raw_xpu_graph(self) -> int:
        return 0

    def raw_xpu_graph_exec(self) -> int:
        return 0


#: The fake's stream and graph-call state, reset on each `fake_xpu` entry (`graph_events` in the namespace).
_XPU_GRAPH_STATE: dict[str, Any] = {"events": [], "current": None}


class _StreamContext:
    """`torch.xpu.StreamContext`: makes `stream` current inside the `with` (None: no-op)."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            self.stream.__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.stream is not None:
            self.stream.__exit__(exc_type, exc_val, exc_tb)


def _graph_functions() -> dict[str, Any]:
    """`torch.xpu.current_stream` and `torch.xpu.stream` with torch's signatures."""

    def current_stream(device=None):
        if _XPU_GRAPH_STATE["current"] is None:
            _XPU_GRAPH_STATE["current"] = _XPUStream(device)
        return _XPU_GRAPH_STATE["current"]

    def stream(stream):
        return _StreamContext(stream)

    return {"current_stream": current_stream, "stream": stream}


#: What the XPU fake puts on `torch.xpu` for graphs (checked against the installed torch's names).
XPU_GRAPH_NAMES = {"XPUGraph": _XPUGraph, "Stream": _XPUStream}


def _accelerator_functions(torch: Any, xpu: dict[str, Any]) -> dict[str, Any]:
    """`torch.accelerator` functions answering for the fake XPU (signatures as torch's, positional-only)."""

    def current_accelerator(check_available: bool = False):
        if check_available and not xpu["is_available"]():
            return None
        return torch.device("xpu")

    def device_count() -> int:
        return xpu["device_count"]()

    def is_available() -> bool:
        return xpu["is_available"]()

    def current_device_index() -> int:
        return xpu["current_device"]()

    def set_device_index(device, /) -> None:
        xpu["set_device"](device)

    def synchronize(device=None, /) -> None:
        xpu["synchronize"](device)

    def get_memory_info(device_index=None, /) -> tuple[int, int]:
        return xpu["mem_get_info"](device_index)

    return {f.__name__: f for f in (current_accelerator, device_count, is_available, current_device_index,
                                      set_device_index, synchronize, get_memory_info)}


@contextlib.contextmanager
def fake_xpu(count: int = 1, *, bf16: bool | None = None, name: str = "Intel(R) Data Center GPU Max 1550",
             memory: int = 64 * GiB, tiles: int = 1, native_bf16: bool | None = None, integrated=False,
             fp64: bool = True, free_memory_query: bool | None = None, free_memory: int | None = None,
             hierarchy: str | None = None, affinity_mask: str | None = None,
             needs_sysman: bool = False, pci=None) -> Iterator[types.SimpleNamespace]:
    """Make the real `torch.xpu` and `torch.accelerator` report `count` Intel GPU cards of `tiles` tiles.

    - `native_bf16` (old name `bf16`): the device's `has_bfloat16_conversions`. False models a GPU
      whose bf16 is emulated only: `is_bf16_supported()` is still True (as torch's), only
      `is_bf16_supported(including_emulation=False)` is False.
    - `integrated`: `is_integrated_gpu`, one bool for every card or one per card (an integrated GPU next to
      discrete ones); `mem_get_info` raises on an integrated one unless `free_memory_query=True`. `pci`: the
      cards' PCI addresses (`0000:03:00.0`; default: integrated on bus 0, discrete from bus 3). The fake
      driver sorts the cards as compute-runtime does before the mask applies: discrete first by default,
      PCI order with `ZE_ENABLE_PCI_ID_DEVICE_ORDER=1` (read from `os.environ` on every call).
    - `needs_sysman`: `mem_get_info` works only while `ZES_ENABLE_SYSMAN=1` is set (discrete cards too);
      `free_memory_query=False` makes any card unable to report free memory.
    - `memory` per card (a FLAT tile-device reports its share), `free_memory` for `mem_get_info`.
    - `hierarchy` / `affinity_mask` set `ZE_FLAT_DEVICE_HIERARCHY` / `ZE_AFFINITY_MASK` for the
      duration; the fake reads both from `os.environ` on every call, so a test may also set them.
    It reports devices only: allocating on `xpu` still fails, so import libraries that allocate at
    import time (bitsandbytes, and peft or TrainingArguments through it) before entering.
    """
    import torch

    if bf16 is not None and native_bf16 is not None and bf16 != native_bf16:
        raise TypeError(f"fake_xpu: bf16={bf16} and native_bf16={native_bf16} disagree; pass native_bf16 only.")
    native = native_bf16 if native_bf16 is not None else (True if bf16 is None else bf16)
    functions = _xpu_functions(count, tiles, name, memory, native_bf16=native, integrated=integrated, fp64=fp64,
                               free_memory_query=free_memory_query, free=free_memory, needs_sysman=needs_sysman,
                               pci=pci)
    accelerator = _accelerator_functions(torch, functions)
    patches = _Patches()
    try:
        for variable in (*DEVICE_VARIABLES, SYSMAN_VARIABLE):
            patches.setenv(variable, None)
        if hierarchy is not None:
            patches.setenv(HIERARCHY_VARIABLE, hierarchy)
        if affinity_mask is not None:
            patches.setenv(MASK_VARIABLE, affinity_mask)
        for fname, function in functions.items():
            patches.setattr(torch.xpu, fname, function)
        for fname, function in accelerator.items():
            patches.setattr(torch.accelerator, fname, function)
        _XPU_GRAPH_STATE.update(events=[], current=None)
        graph_functions = _graph_functions()
        for fname, value in {**XPU_GRAPH_NAMES, **graph_functions}.items():
            patches.setattr(torch.xpu, fname, value)
        patches.setattr(torch.xpu.graph, "default_capture_stream", None)  # torch caches its capture stream here
        patches.setattr(torch.accelerator, "set_device_idx", accelerator["set_device_index"])  # deprecated alias
        patches.setattr(torch.accelerator, "current_device_idx", accelerator["current_device_index"])
        clear_library_caches()
        names = [name] * functions["device_count"]()
        yield types.SimpleNamespace(count=count, tiles=tiles, bf16=native, native_bf16=native, integrated=integrated,
                                    names=names, memory=memory, functions=functions, accelerator=accelerator,
                                    graph_functions=graph_functions, graph_events=_XPU_GRAPH_STATE["events"])
    finally:
        patches.undo()
        clear_library_caches()
