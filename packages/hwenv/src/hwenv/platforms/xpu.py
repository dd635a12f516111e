"""Intel GPUs through `torch.xpu` (Level Zero); facts read from PyTorch's `torch/xpu/__init__.py`.

- bf16: `is_bf16_supported(including_emulation=True)` is True on *every* available XPU; only
  `including_emulation=False` tells native bf16 from emulated (integrated GPUs) (X17, INTEL.md S1).
- memory: `torch.xpu.mem_get_info`, as Accelerate's `get_max_memory` reads it (INTEL.md S5);
  where the driver cannot report it (integrated GPUs, WSL, or any card without Level Zero Sysman:
  `ZES_ENABLE_SYSMAN=1` "may" be needed, intel/llvm `sycl_ext_intel_device_info.md`) the property
  `total_memory` is used and the assumption is said in `ProbeResult.memory_source`.
"""

from __future__ import annotations

import inspect
import os

from ..probes import ProbeResult, memory_of, torch_missing, torch_module
from .base import Platform

#: Level Zero Sysman: the free-memory aspect `torch.xpu.mem_get_info` reads "may need" it, on any card
#: (intel/llvm `sycl/doc/extensions/supported/sycl_ext_intel_device_info.md`, "Free Global Memory").
SYSMAN_VARIABLE = "ZES_ENABLE_SYSMAN"

PLATFORM = Platform(
    kind="xpu",
    device_type="xpu",
    display_name="Intel GPU (XPU)",
    probe="hwenv.platforms.xpu:probe",
    priority=20,
    visible_devices=("ZE_AFFINITY_MASK",),
    selection_grammar="affinity-mask",
    dist_backend="xccl",
    dist_backend_note="built into torch's XPU wheels from torch 2.8 (X18)",
    compile_backend="inductor",
    graph_api="xpu_graphs",
    triton=True,  # torch's XPU wheels ship Intel's Triton backend (pytorch-triton-xpu)
    memory_api="torch.xpu.mem_get_info",
    bf16_api="torch.xpu.is_bf16_supported(including_emulation=False)",
    torch_module="torch.xpu",
    vendor="intel",
)


def native_bf16(xpu) -> tuple[bool, str]:
    """Whether the XPU computes bf16 natively, and how that was read (never the default call alone).

    torch's `is_bf16_supported(including_emulation=True)` returns `including_emulation or
    props.has_bfloat16_conversions` on an available XPU, so the default call is True on every one;
    only `including_emulation=False` (or the property itself) tells native from emulated.
    """
    try:
        takes_flag = "including_emulation" in inspect.signature(xpu.is_bf16_supported).parameters
    except (TypeError, ValueError):
        takes_flag = False
    if takes_flag:
        native = bool(xpu.is_bf16_supported(including_emulation=False))
        source = "torch.xpu.is_bf16_supported(including_emulation=False)"
    else:  # an older torch: read the property the flag reads
        native = getattr(xpu.get_device_properties(0), "has_bfloat16_conversions", None)
        if native is None:
            return bool(xpu.is_bf16_supported()), (
                "torch.xpu.is_bf16_supported() (this torch has neither including_emulation nor "
                "has_bfloat16_conversions, so native and emulated bf16 cannot be told apart)")
        native = bool(native)
        source = "torch.xpu.get_device_properties(0).has_bfloat16_conversions"
    if native:
        return True, f"{source}: native"
    integrated = bool(getattr(xpu.get_device_properties(0), "is_integrated_gpu", False))
    return False, (
        f"{source}: not native ({'integrated' if integrated else 'discrete'} GPU without bf16 conversions); "
        f"torch.xpu.is_bf16_supported() still says True because it counts emulation, which is slow")


def memory(xpu, count: int) -> tuple[tuple[int, ...], str]:
    """Total memory per device and where it came from: `mem_get_info` (as Accelerate reads it), else `total_memory` (said)."""
    sizes: list[int] = []
    try:
        for index in range(count):
            sizes.append(int(xpu.mem_get_info(index)[1]))
        return tuple(sizes), "torch.xpu.mem_get_info (as Accelerate's get_max_memory reads it)"
    except Exception as error:  # integrated GPUs and WSL cannot report free memory; others may need Sysman
        why = f"torch.xpu.mem_get_info failed ({type(error).__name__}: {error})"
        if os.environ.get(SYSMAN_VARIABLE) != "1":
            why += f" ({SYSMAN_VARIABLE}=1 may enable it, on discrete cards too)"
    sizes = memory_of(xpu.get_device_properties, count)
    if not sizes and count:
        return (), f"{why}; get_device_properties has no total_memory: memory unknown"
    shared = " (an integrated GPU shares it with the host)" if getattr(
        xpu.get_device_properties(0), "is_integrated_gpu", False) else ""
    return tuple(sizes), f"{why}; assumed get_device_properties().total_memory is all usable{shared}"


def probe() -> ProbeResult:
    """Intel GPU through `torch.xpu` (X1, X3): count, names, native bf16, memory."""
    if (missing := torch_missing("xpu")) is not None:
        return missing
    torch = torch_module()
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
    bf16, bf16_source = native_bf16(xpu)
    emulated = not bf16 and bool(xpu.is_bf16_supported())  # torch's default call counts emulation (X17)
    sizes, memory_source = memory(xpu, count)
    return ProbeResult("xpu", True, count, names, bf16, sizes, bf16_source=bf16_source, memory_source=memory_source,
                       details=device_details(xpu, memory_source), bf16_emulated=emulated)


def device_details(xpu, memory_source: str) -> dict[str, str]:
    """What doctor reports about device 0: free-memory query, fp64, integrated (from `_XpuDeviceProperties`)."""
    props = xpu.get_device_properties(0)
    details = {"mem_get_info": "unsupported" if memory_source.startswith("torch.xpu.mem_get_info failed") else "supported"}
    for field in ("has_fp64", "is_integrated_gpu", "has_bfloat16_conversions"):
        value = getattr(props, field, None)
        if value is not None:
            details[field] = str(bool(value))
    # per device, in this process's order: an integrated GPU next to discrete ones moves when
    # ZE_ENABLE_PCI_ID_DEVICE_ORDER changes (hwenv.hierarchy.driver_order), which hwenv.select checks
    details["integrated_gpus"] = ",".join(
        str(bool(getattr(xpu.get_device_properties(i), "is_integrated_gpu", False))) for i in range(xpu.device_count()))
    return details
