"""Which collective backend a device uses (`xccl`, `ccl`, `hccl`, `nccl`, `gloo`), and why.

FACTS.md X18 (XPU: xccl), G15 (Gaudi: hccl). The same choice accelerate makes in
`accelerate/state.py` (hpu -> hccl, cuda -> nccl, xpu -> xccl, CPU -> gloo).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import logging
from dataclasses import dataclass

import hwenv
from hwenv.gaudi import PLUGIN_INSTALL_HINT

from .errors import BackendMismatchError, BackendUnavailableError

logger = logging.getLogger(__name__)

#: torch got XCCL built in with 2.7 (LIBRARIES.md; `distributed_c10d.is_xccl_available()`).
XCCL_MIN_TORCH = (2, 7)
#: The module that registers Gaudi's `hccl` backend with torch.distributed (G15).
HCCL_MODULE = "habana_frameworks.torch.distributed.hccl"
#: Intel's old oneCCL bindings, which register the `ccl` backend for torch < 2.7.
ONECCL_MODULE = "oneccl_bindings_for_pytorch"

#: The device types each backend moves tensors of.
BACKEND_DEVICES: dict[str, tuple[str, ...]] = {
    "xccl": ("xpu",), "ccl": ("xpu", "cpu"), "hccl": ("hpu",), "nccl": ("cuda",), "gloo": ("cpu",),
}


@dataclass(frozen=True)
class BackendChoice:
    """The collective backend for a device: `name` for `init_process_group`, `reason`, and the
    `ddp_backend` value for `TrainingArguments` (None: leave it to Transformers)."""

    name: str
    reason: str
    ddp_backend: str | None


def _torch_version(accel: hwenv.Accelerator) -> str | None:
    return accel.torch_version or hwenv.installed_version("torch")


def _xccl_built_in() -> bool:
    from torch.distributed import distributed_c10d

    check = getattr(distributed_c10d, "is_xccl_available", None)
    return bool(check()) if check is not None else False


def _oneccl_installed() -> bool:
    return importlib.util.find_spec(ONECCL_MODULE) is not None


def _xpu_backend(accel: hwenv.Accelerator, oneccl: bool | None = None) -> tuple[str, str]:
    version = _torch_version(accel)
    if version is not None and hwenv.at_least(version, XCCL_MIN_TORCH):
        here = hwenv.installed_version("torch")
        if accel.torch_version in (None, here):
            if _xccl_built_in():
                return "xccl", f"XPU: torch {version} has XCCL built in (X18)"
            return "xccl", (
                f"XPU: xccl (X18), but this torch {version} build has no XCCL "
                f"(is_xccl_available() is False); install torch's XPU build (X1) before init()"
            )
        return "xccl", f"XPU: torch {version} (>= 2.7) has XCCL built in (X18)"
    if _oneccl_installed() if oneccl is None else oneccl:
        return "ccl", (
            f"XPU: torch {version} is older than 2.7 (no XCCL), so oneCCL's `ccl` backend from "
            f"{ONECCL_MODULE} is used; upgrade torch to >= 2.7 for xccl"
        )
    raise BackendUnavailableError(
        f"No collective backend for XPU with torch {version}: XCCL needs torch >= 2.7 and "
        f"{ONECCL_MODULE} (the `ccl` backend for older torch) is not installed. Upgrade to torch "
        f">= 2.7 from the XPU index (X1)."
    )


def choose_backend(accel: hwenv.Accelerator) -> tuple[str, str]:
    """(backend name, reason) for `accel`, without the Transformers check (no transformers import)."""
    if accel.kind == "xpu":
        name, reason = _xpu_backend(accel)
    elif accel.kind == "hpu":
        name, reason = "hccl", f"Gaudi: HCCL from {HCCL_MODULE} (G15), imported when init() runs"
    elif accel.kind == "cuda":
        name, reason = "nccl", "CUDA: NCCL"
    elif accel.kind == "mps":
        name, reason = "gloo", "MPS has no collective backend; gloo reduces CPU tensors"
    else:
        name, reason = "gloo", "CPU: gloo"
    return name, reason


def backend_for(accel: hwenv.Accelerator) -> BackendChoice:
    """The backend `init()` uses for `accel` and why: xccl on XPU (ccl for torch < 2.7 with
    oneCCL bindings), hccl on Gaudi, nccl on CUDA, gloo on CPU and MPS; plus `ddp_backend`."""
    name, reason = choose_backend(accel)
    ddp, note = _ddp_value(name)
    if note:
        reason = f"{reason}; {note}"
    return BackendChoice(name, reason, ddp)


def ddp_backend(accel: hwenv.Accelerator) -> str | None:
    """The `TrainingArguments(ddp_backend=...)` value for `accel`, checked against the
    installed Transformers' choices (`xccl` today, `ccl` in old releases)."""
    return backend_for(accel).ddp_backend


@functools.lru_cache(maxsize=1)
def training_arguments_choices() -> tuple[str, ...] | None:
    """The `ddp_backend` choices of the installed `transformers.TrainingArguments`; None if
    Transformers is not installed."""
    try:
        from transformers import TrainingArguments
    except ImportError:
        return None
    for field in dataclasses.fields(TrainingArguments):
        if field.name == "ddp_backend":
            return tuple(field.metadata.get("choices", ()))
    return None


#: Values every Transformers release in our window (>=5.20.2,<5.23) accepts for `ddp_backend`;
#: only the Intel name changed (`ccl` -> `xccl`), so only that one needs the real class, whose
#: import pulls in the Trainer stack (peft, bitsandbytes) and costs seconds.
STABLE_DDP_BACKENDS = frozenset({"nccl", "gloo", "mpi", "hccl"})


def _ddp_value(name: str) -> tuple[str | None, str]:
    if name in STABLE_DDP_BACKENDS:
        return name, ""
    choices = training_arguments_choices()
    if choices is None:
        logger.info("transformers is not installed; ddp_backend=%r is not checked", name)
        return name, "ddp_backend not checked (transformers not installed)"
    if name in choices:
        return name, ""
    if name == "xccl" and "ccl" in choices:  # Transformers before xccl named the Intel backend `ccl`
        return "ccl", "ddp_backend='ccl': this Transformers predates 'xccl' and names the Intel backend 'ccl'"
    logger.info("ddp_backend %r is not among TrainingArguments choices %s; leaving it unset", name, choices)
    return None, f"ddp_backend left unset: {name!r} is not among TrainingArguments choices {list(choices)}"


def ensure_available(name: str, device_type: str) -> None:
    """Raise before any process group starts when backend `name` cannot run on `device_type`
    here; imports Gaudi's hccl module (which registers `hccl`) or oneCCL bindings as needed."""
    import torch.distributed as dist

    allowed = BACKEND_DEVICES.get(name)
    if allowed is not None and device_type not in allowed:
        raise BackendMismatchError(
            f"backend {name!r} does not move {device_type} tensors (it serves {', '.join(allowed)}); "
            f"leave backend=None to use the device's backend, or pick one for {device_type}."
        )
    if name == "gloo" and not dist.is_gloo_available():
        raise BackendUnavailableError("this torch build has no gloo backend; install torch from PyPI.")
    if name == "nccl" and not dist.is_nccl_available():
        raise BackendUnavailableError("this torch build has no NCCL; install a CUDA build of torch.")
    if name == "xccl" and not _xccl_built_in():
        raise BackendUnavailableError(
            "backend 'xccl' is not available: this torch build has no XCCL "
            "(torch.distributed.distributed_c10d.is_xccl_available() is False). Install torch >= 2.7 "
            "from PyTorch's XPU index (X1)."
        )
    if name == "hccl":
        try:
            importlib.import_module(HCCL_MODULE)  # registers the hccl backend (G15)
        except ImportError as error:
            raise BackendUnavailableError(
                f"backend 'hccl' needs {HCCL_MODULE}, which cannot be imported ({error}). {PLUGIN_INSTALL_HINT}"
            ) from error
    if name == "ccl":
        try:
            importlib.import_module(ONECCL_MODULE)  # registers the ccl backend
        except ImportError as error:
            raise BackendUnavailableError(
                f"backend 'ccl' needs {ONECCL_MODULE} ({error}); with torch >= 2.7 use 'xccl' instead."
            ) from error


def backend_table() -> str:
    """The README's backend table, generated from the decisions above (a test keeps them equal)."""
    cases = [
        ("Intel GPU (`xpu`), torch >= 2.7", _xpu_backend(hwenv.Accelerator("xpu", torch_version="2.8.0"))),
        ("Intel GPU, torch < 2.7 with oneCCL bindings",
         _xpu_backend(hwenv.Accelerator("xpu", torch_version="2.6.0"), oneccl=True)),
        ("Intel Gaudi (`hpu`)", choose_backend(hwenv.Accelerator("hpu"))),
        ("NVIDIA GPU (`cuda`)", choose_backend(hwenv.Accelerator("cuda"))),
        ("CPU", choose_backend(hwenv.Accelerator("cpu"))),
        ("Apple GPU (`mps`)", choose_backend(hwenv.Accelerator("mps"))),
    ]
    lines = ["| device | backend | `ddp_backend` (TrainingArguments) | why |", "|---|---|---|---|"]
    for device, (name, reason) in cases:
        ddp, note = _ddp_value(name)
        why = reason + (f"; {note}" if note else "")
        lines.append(f"| {device} | `{name}` | {f'`{ddp}`' if ddp else 'unset (Transformers decides)'} | {why} |")
    return "\n".join(lines)
