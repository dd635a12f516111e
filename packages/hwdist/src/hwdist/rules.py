"""hwdist's own per-kind and per-backend tables; every device fact comes from the platform.

`hwenv.get_platform(kind)` says which backend a device uses (`dist_backend`), its torch device
type, whether its devices are indexed and which variable selects them. What hwdist decides on
top of that lives here: the reason shown in plans and the Gaudi partial-server rule (per kind),
and what each backend needs to run (per backend). A test asserts a row in `DIST_RULES` for every
registered kind (`hwenv.platforms()`), so a new kind cannot be forgotten silently; a kind with no
row at run time (an installed plug-in) gets `default_rule(platform)`, built from its data.
"""

from __future__ import annotations

from dataclasses import dataclass

import hwenv
from hwenv.gaudi import MODULE_ID_VARIABLE, PLUGIN_INSTALL_HINT
from hwenv.versions import XCCL_MIN_TORCH

#: The module that registers Gaudi's `hccl` backend with torch.distributed (G15).
HCCL_MODULE = "habana_frameworks.torch.distributed.hccl"  # platform-boundary: importing it registers hccl (G15)
#: Where PyTorch's XPU wheels are (X1); XCCL is built into them from torch 2.8.
XPU_INDEX = "https://download.pytorch.org/whl/xpu"


@dataclass(frozen=True)
class DistRule:
    """What hwdist decides for one device kind beyond the platform's facts."""

    reason: str  # why the platform's `dist_backend`, as plans print it
    partial_server_groups: bool = False  # G8: 2+ processes on part of a server must be one of Intel's groups
    module_pin_variable: str | None = None  # a per-process device pin 2+ launched processes must not inherit


#: One row per built-in kind (a test keeps it complete); ROCm is the worked example of a new kind.
DIST_RULES: dict[str, DistRule] = {
    "hpu": DistRule(f"Gaudi: HCCL from {HCCL_MODULE} (G15), imported when init() runs",
                    partial_server_groups=True, module_pin_variable=MODULE_ID_VARIABLE),
    "xpu": DistRule("XPU: XCCL (X18)"),
    "rocm": DistRule("ROCm: RCCL through the nccl name"),
    "cuda": DistRule("CUDA: NCCL"),
    "mps": DistRule("MPS has no collective backend; gloo reduces CPU tensors"),
    "cpu": DistRule("CPU: gloo"),
}


def default_rule(platform: hwenv.Platform) -> DistRule:
    """The rule of a kind with no row (a plug-in): its backend and note, no extra checks."""
    note = f" ({platform.dist_backend_note})" if platform.dist_backend_note else ""
    return DistRule(f"{platform.display_name}: {platform.dist_backend}{note}, from its platform (no hwdist row)")


def rule_for(platform: hwenv.Platform) -> DistRule:
    """hwdist's rule for `platform`'s kind."""
    return DIST_RULES.get(platform.kind) or default_rule(platform)


@dataclass(frozen=True)
class BackendNeeds:
    """What a collective backend needs: the device types it moves, the torch it needs, and the fix."""

    device_types: tuple[str, ...]
    built_in_check: str | None = None  # `torch.distributed.distributed_c10d.<name>()` says the build has it
    registered_by: str | None = None  # importing this module registers the backend
    min_torch: tuple[int, int] | None = None
    min_torch_why: str = ""
    fix: str = ""
    binds_device: bool = False  # init_process_group(device_id=...): the group connects to its device eagerly


#: Per backend name (not per kind: ROCm and CUDA share `nccl`). A backend not listed (a plug-in's)
#: is trusted to move its platform's tensors.
BACKENDS: dict[str, BackendNeeds] = {
    "xccl": BackendNeeds(
        ("xpu",), built_in_check="is_xccl_available", min_torch=XCCL_MIN_TORCH,
        min_torch_why=("XCCL is built into torch's XPU release wheels from torch 2.8 (the 2.7 wheels were built "
                       "without it: intel/torch-xpu-ops #1318, pytorch #141741)"),
        fix=f"install torch >= 2.8 from PyTorch's XPU index: pip install torch --index-url {XPU_INDEX} (X1)"),
    "hccl": BackendNeeds(("hpu",), registered_by=HCCL_MODULE, fix=PLUGIN_INSTALL_HINT),
    "nccl": BackendNeeds(("cuda",), built_in_check="is_nccl_available", binds_device=True,
                         fix="install a CUDA (NVIDIA) or ROCm (AMD) build of torch"),
    "gloo": BackendNeeds(("cpu",), built_in_check="is_gloo_available", fix="install torch from PyPI"),
}


def serves(backend: str, device_type: str) -> bool:
    """Whether `backend` moves tensors of `device_type` (an unlisted backend is trusted)."""
    needs = BACKENDS.get(backend)
    return needs is None or device_type in needs.device_types
