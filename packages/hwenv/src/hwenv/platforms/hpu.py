"""Intel Gaudi through `habana_frameworks.torch` / `torch.hpu` (gaudi-pytorch-bridge 1.19, INTEL.md S8).

- `get_device_properties()` returns a *string*, so memory comes from `torch.hpu.mem_get_info()`.
  Its real signature is `mem_get_info(device=None)` (`hpu/memory.py`), returning
  `(Limit - InUse, Limit)` from `memory_stats()`; the C++ side ignores the index (one device per
  process, `hpu/csrc/bindings.cpp` `get_mem_stat`), so hwenv calls it without one: the current
  card, and every card of a server is the same model. `Limit` is the memory the bridge's
  allocator may use, a little below the card's HBM.
- bf16: every Gaudi generation supports it (G12); the bridge's `is_bf16_supported()` takes no argument.
- compile: `hpu_backend` only, and only in eager mode (`PT_HPU_LAZY_MODE=0`); never inductor.
- one card per process: `backend/habana_device/HPUGuardImpl.h` `exchangeDevice`/`setDevice` end in
  `TORCH_CHECK(allocator_active_device_id == 0, "habana active device: ...")`, and
  `hpu/csrc/bindings.cpp` ignores the index of every query ("We don't support index addresed
  device"). Accelerate's `get_max_memory` initialises each index with `torch.tensor(0, device=f"hpu:{i}")`
  and drops the ones that raise, so `device_map="auto"` in one process sees `hpu:0` and the CPU.
"""

from __future__ import annotations

import importlib
import importlib.util

from ..probes import ProbeResult, torch_missing, torch_module
from .base import Platform

PLATFORM = Platform(
    kind="hpu",
    device_type="hpu",
    display_name="Intel Gaudi (HPU)",
    probe="hwenv.platforms.hpu:probe",
    priority=10,
    indexed_device=False,
    visible_devices=("HABANA_VISIBLE_MODULES", "HABANA_VISIBLE_DEVICES"),
    selection_grammar="module-ids",
    dist_backend="hccl",
    dist_backend_note="registered by importing habana_frameworks.torch.distributed.hccl (G15)",
    compile_backend="hpu_backend",
    lazy_mode_variable="PT_HPU_LAZY_MODE",
    graph_api="hpu_graphs",
    triton=False,
    memory_api="torch.hpu.mem_get_info",
    bf16_api="every Gaudi generation (G12)",
    torch_module="torch.hpu",
    plugin_module="habana_frameworks.torch",  # registers torch.hpu (G1)
    # synchronize() has no parameter; mem_get_info(device=None) has one that the bridge ignores
    device_calls_take_index=False,
    devices_per_process=1,
    run_env="hwenv.gaudi.environment:run_env",  # PT_ENABLE_INT64_SUPPORT only where the bridge supports it
    devices_per_process_note=("a process uses only its own Gaudi card (gaudi-pytorch-bridge 1.19 "
                              "backend/habana_device/HPUGuardImpl.h TORCH_CHECK 'habana active device: N != 0')"),
    vendor="intel",
)


def memory(hpu, count: int) -> tuple[tuple[int, ...], str]:
    """Total memory per card from `torch.hpu.mem_get_info()` (the properties are a string)."""
    reader = getattr(hpu, "mem_get_info", None)
    if reader is None:
        return (), "torch.hpu has no mem_get_info: memory unknown"
    try:
        total = int(reader()[1])
    except Exception as error:
        return (), f"torch.hpu.mem_get_info() failed ({type(error).__name__}: {error}): memory unknown"
    return (total,) * count, ("torch.hpu.mem_get_info() of the current card: the allocator's limit (every card "
                              "of a server is alike)")


def probe() -> ProbeResult:
    """Intel Gaudi through `habana_frameworks.torch` and `torch.hpu` (G1, G3)."""
    if (missing := torch_missing("hpu")) is not None:
        return missing
    if importlib.util.find_spec("habana_frameworks") is None:
        return ProbeResult("hpu", False, reason="habana_frameworks (habana-torch-plugin) is not installed")
    torch = torch_module()
    importlib.import_module("habana_frameworks.torch")
    hpu = getattr(torch, "hpu", None)
    if hpu is None:
        return ProbeResult("hpu", False, reason="habana_frameworks.torch imported but torch.hpu is missing")
    if not hpu.is_available():
        return ProbeResult("hpu", False, reason="torch.hpu.is_available() is False (no Gaudi visible to this process)")
    count = int(hpu.device_count())
    names = tuple(str(hpu.get_device_name(index)) for index in range(count))
    sizes, memory_source = memory(hpu, count)
    return ProbeResult("hpu", True, count, names, True, sizes, bf16_source=PLATFORM.bf16_api, memory_source=memory_source)
