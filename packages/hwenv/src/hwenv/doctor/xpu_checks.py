"""Intel GPU checks of `hwenv doctor`: hierarchy and mask (X4, X5), the torch build (X1, X2), XCCL (X18),
retired Intel add-ons, and what the device cannot do (free-memory query, fp64)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from collections.abc import Mapping
from pathlib import Path

from ..accelerator import Accelerator
from ..affinity import MASK_VARIABLE, PCI_ORDER_VARIABLE, parse_affinity_mask, visible_root_devices
from ..errors import HwenvError
from ..hierarchy import HIERARCHY_VARIABLE, DeviceHierarchy, read_hierarchy
from ..platforms.xpu import SYSMAN_VARIABLE
from ..probes import ProbeResult
from ..versions import installed_version, parse_version
from .common import Checks, Problem

#: Release XPU wheels have the built-in xccl backend from torch 2.8: it is in the 2.7 source, but the
#: 2.7 wheels were built without it (intel/torch-xpu-ops #1318, pytorch/pytorch #141741; INTEL.md).
XCCL_RELEASE_TORCH = (2, 8)
INTEL_PCI_VENDOR = "0x8086"
XPU_INDEX = "https://download.pytorch.org/whl/xpu"

#: Retired Intel add-ons: (import name, distribution, what replaces it, source of the retirement).
RETIRED_PACKAGES = (
    ("intel_extension_for_pytorch", "intel-extension-for-pytorch",
     "torch's built-in XPU support (torch.xpu, torch.compile with Inductor on XPU, XPU wheels from "
     f"{XPU_INDEX})", "intel/intel-extension-for-pytorch #867: no releases after 2.8"),
    ("oneccl_bindings_for_pytorch", "oneccl_bind_pt",
     "torch's built-in xccl backend (init_process_group(backend='xccl'), torch >= 2.8 XPU wheels)",
     "intel/torch-ccl #80: end of life after 2.8"),
)


def intel_gpu_driver(dev_dri: str | Path = "/dev/dri", sys_drm: str | Path = "/sys/class/drm",
                     which=shutil.which) -> str | None:
    """Evidence that an Intel GPU driver is here (`xpu-smi` on PATH, or an Intel render node), or None."""
    if which("xpu-smi"):
        return "xpu-smi is on PATH"
    dev = Path(dev_dri)
    for node in sorted(dev.glob("renderD*")) if dev.is_dir() else ():
        vendor = Path(sys_drm) / node.name / "device" / "vendor"
        try:
            if vendor.read_text().strip().lower() == INTEL_PCI_VENDOR:
                return f"{node} is an Intel GPU render node (PCI vendor {INTEL_PCI_VENDOR})"
        except OSError:
            continue
    return None


def _hierarchy(env: Mapping[str, str], problems: list[Problem]) -> DeviceHierarchy | None:
    try:
        return read_hierarchy(env)
    except HwenvError as error:
        problems.append(Problem("invalid-device-hierarchy", "error", str(error),
                                f"set {HIERARCHY_VARIABLE} to FLAT, COMPOSITE or COMBINED, or unset it"))
        return None


def _mask_checks(xpu: ProbeResult, env: Mapping[str, str], hierarchy: DeviceHierarchy | None) -> list[Problem]:
    problems: list[Problem] = []
    if MASK_VARIABLE not in env:
        return problems
    try:
        # Not checked against the probe's count as ordinals: that count is already the masked one (torch
        # honours the mask: '0,3' on four devices is two). Fewer devices than the mask's entries means the
        # driver skipped some, silently (an ordinal that is not present).
        entries = parse_affinity_mask(env[MASK_VARIABLE], None, hierarchy=hierarchy)
        wanted = visible_root_devices(entries)
        if xpu.available and xpu.count < wanted:
            problems.append(Problem(
                "invalid-affinity-mask", "error",
                f"{MASK_VARIABLE}={env[MASK_VARIABLE]!r} names {wanted} device(s), but the driver exposes {xpu.count}: "
                f"it skips ordinals that are not present, silently (Level Zero spec, Affinity Mask).",
                f"list only ordinals of devices present (unset {MASK_VARIABLE} and run hwenv doctor to see them)"))
    except HwenvError as error:
        problems.append(Problem("invalid-affinity-mask", "error", str(error), f"fix or unset {MASK_VARIABLE}"))
    if env.get(PCI_ORDER_VARIABLE) != "1":
        problems.append(Problem(
            "unstable-xpu-order", "warning",
            f"{MASK_VARIABLE} is set without {PCI_ORDER_VARIABLE}=1: the mask's order does not set enumeration "
            f"order, which may change between runs (X5).",
            f"also set {PCI_ORDER_VARIABLE}=1 (hwenv exec does)",
        ))
    return problems


def _torch_build_checks(acc: Accelerator | None, xpu: ProbeResult, driver: str | None) -> list[Problem]:
    """A torch without XPU on a machine with an Intel GPU driver, unless another accelerator is in use."""
    if xpu.available or driver is None or "no XPU backend" not in xpu.reason:
        return []
    if acc is not None and acc.platform.is_accelerator and acc.platform.vendor != "intel":
        return []  # e.g. an Intel iGPU for the display beside the NVIDIA/AMD GPU this torch is built for
    torch_version = installed_version("torch") or "unknown"
    variant = torch_version.partition("+")[2]
    build = f"+{variant} build" if variant else "build without a local variant (PyPI's default: CUDA on Linux)"
    return [Problem(
        "torch-without-xpu", "error" if driver.startswith("xpu-smi") else "warning",
        f"{driver}, but torch {torch_version} is a {build} with no XPU backend (X1, X2): Intel GPUs need the "
        f"'+xpu' wheel.",
        f"pip install torch --index-url {XPU_INDEX} (keep transformers/accelerate as they are)",
    )]


def _xccl_checks(xpu: ProbeResult) -> list[Problem]:
    version = parse_version(installed_version("torch"))
    if not xpu.available or version is None or version[:2] >= XCCL_RELEASE_TORCH:
        return []
    return [Problem(
        "xccl-missing", "warning",
        f"torch {'.'.join(map(str, version))} on XPU: release XPU wheels have the built-in xccl collective "
        f"backend from torch 2.8 (the 2.7 source has it, the 2.7 wheels were built without it; intel/torch-xpu-ops "
        f"#1318, pytorch #141741), so multi-XPU runs cannot start here (X18).",
        f"pip install 'torch>=2.8' --index-url {XPU_INDEX}",
    )]


def _retired_package_checks() -> list[Problem]:
    problems: list[Problem] = []
    for module, distribution, replacement, source in RETIRED_PACKAGES:
        if importlib.util.find_spec(module) is None:  # finds a top-level module without importing it
            continue
        try:
            version = f" {importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            version = ""
        problems.append(Problem(
            "retired-intel-package", "warning",
            f"{module}{version} is installed: it is retired upstream ({source}) and pins its own torch version; "
            f"its replacement is {replacement}. Importing it next to a newer torch fails or changes torch's ops.",
            f"pip uninstall {distribution}; use {replacement.split(' (')[0]}",
        ))
    return problems


def _device_checks(xpu: ProbeResult, env: Mapping[str, str]) -> list[Problem]:
    if not xpu.available:
        return []
    problems: list[Problem] = []
    if xpu.details.get("mem_get_info") == "unsupported":
        sysman = env.get(SYSMAN_VARIABLE) == "1"
        kind = "an integrated GPU" if xpu.details.get("is_integrated_gpu") == "True" else "a discrete GPU"
        fix = ("pass max_memory={0: '<GiB>GiB', 'cpu': '<GiB>GiB'} to from_pretrained, or device_map='xpu:0' when "
               "the model fits")
        if not sysman:
            fix = (f"set {SYSMAN_VARIABLE}=1 for the run and check again (hwenv doctor); if it still fails, " + fix)
        problems.append(Problem(
            "xpu-memory-unknown", "warning",
            f"torch.xpu.mem_get_info() raises on this device ({kind}): it does not report the free-memory aspect "
            f"(ext_intel_free_memory), which integrated GPUs and WSL lack and which may need {SYSMAN_VARIABLE}=1 on "
            f"any card (intel/llvm sycl_ext_intel_device_info.md, 'Free Global Memory'; {SYSMAN_VARIABLE} is "
            f"{'set' if sysman else 'not set'} here). Accelerate's get_max_memory, which Transformers' "
            f"device_map='auto' uses, then leaves the XPU out of max_memory, so the model is placed on CPU/disk. "
            f"hwenv's own plan assumed get_device_properties().total_memory is usable.",
            fix,
        ))
    if xpu.details.get("has_fp64") == "False":
        problems.append(Problem(
            "xpu-no-fp64", "warning",
            "get_device_properties().has_fp64 is False: this GPU has no native float64, so float64 kernels fail "
            "(or run emulated, slowly) on it.",
            "keep tensors in float32/bfloat16 before moving them to xpu (e.g. torch.from_numpy(a).float())",
        ))
    return problems


def xpu_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """Problems and notes about Intel GPUs."""
    problems: list[Problem] = []
    notes: list[str] = []
    xpu = probes["xpu"]
    hierarchy = _hierarchy(env, problems)
    driver = intel_gpu_driver()
    if hierarchy is not None and (xpu.available or driver or HIERARCHY_VARIABLE in env or MASK_VARIABLE in env):
        notes.append(f"Intel GPU device hierarchy: {hierarchy.describe()}.")
    problems += _mask_checks(xpu, env, hierarchy)
    problems += _torch_build_checks(acc, xpu, driver)
    problems += _xccl_checks(xpu)
    problems += _retired_package_checks()
    problems += _device_checks(xpu, env)
    flags = xpu.details.get("integrated_gpus", "").split(",") if xpu.available else []
    if "True" in flags and "False" in flags:
        order = ("PCI bus order (ZE_ENABLE_PCI_ID_DEVICE_ORDER=1)" if env.get(PCI_ORDER_VARIABLE) == "1"
                 else "the default order, discrete GPUs first")
        notes.append(
            f"An integrated Intel GPU is next to discrete ones: devices are listed in {order}. Level Zero sorts "
            f"discrete GPUs first by default and by PCI bus with {PCI_ORDER_VARIABLE}=1, before it applies "
            f"{MASK_VARIABLE} (intel/compute-runtime comparePciIdBusNumber), so one index names different GPUs "
            f"in the two orders; hwenv exec refuses indices the PCI order it sets would move.")
    return problems, notes
