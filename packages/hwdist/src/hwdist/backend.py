"""Which collective backend a device uses (`xccl`, `hccl`, `nccl`, `gloo`), and why.

The backend name is the platform's (`hwenv.get_platform(kind).dist_backend`): xccl on Intel GPUs
(X18), hccl on Gaudi (G15), nccl on NVIDIA and on AMD (RCCL through the nccl name), gloo on CPU
and MPS -- the choice accelerate makes in `accelerate/state.py`. What each backend needs (torch
>= 2.8 for xccl, the Gaudi module for hccl) is hwdist's table in `rules.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from dataclasses import dataclass

import hwenv

from .errors import BackendMismatchError, BackendUnavailableError
from .rules import BACKENDS, rule_for, serves

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class BackendChoice:
    """The collective backend for a device: `name` for `init_process_group`, `reason`, and the
    `ddp_backend` value for `TrainingArguments` (None: leave it to Transformers)."""

    name: str
    reason: str
    ddp_backend: str | None


def _torch_version(accel: hwenv.Accelerator) -> str | None:
    return accel.torch_version or hwenv.installed_version("torch")


def _title(name: str) -> str:
    return name.upper() if name.endswith("ccl") else name


def _built_in(name: str) -> bool | None:
    """Whether this torch build has backend `name` (None: torch has no check for it)."""
    needs = BACKENDS.get(name)
    if needs is None or needs.built_in_check is None:
        return None
    from torch.distributed import distributed_c10d

    check = getattr(distributed_c10d, needs.built_in_check, None)
    return bool(check()) if check is not None else False


def _min_torch_text(needs_min: tuple[int, int]) -> str:
    return ".".join(str(part) for part in needs_min)


def _torch_detail(name: str, accel: hwenv.Accelerator) -> str:
    """What the torch version says about backend `name` where it has a torch floor (xccl): below
    the floor is an error; on this machine's torch, a build without the backend is said."""
    needs = BACKENDS.get(name)
    floor = needs.min_torch if needs is not None else None
    if needs is None or floor is None:
        return ""  # nccl/gloo: init() checks the build (ensure_available); plans need no torch import
    version = _torch_version(accel)
    if version is None:
        return f"torch is not installed here; {name} needs torch >= {_min_torch_text(floor)} ({needs.fix})"
    if not hwenv.at_least(version, floor):
        raise BackendUnavailableError(
            f"backend {name!r} for {accel.name} needs torch >= {_min_torch_text(floor)}, not torch {version}: "
            f"{needs.min_torch_why}. Fix: {needs.fix}."
        )
    if accel.torch_version not in (None, hwenv.installed_version("torch")):
        # A plan for another machine: only its version is known.
        return f"torch {version} (>= {_min_torch_text(floor)}) has {_title(name)} built in"
    if _built_in(name) is False:
        return (f"this torch {version} build has no {_title(name)} ({needs.built_in_check}() is False); "
                f"{needs.fix} before init()")
    return f"torch {version} has {_title(name)} built in"


def choose_backend(accel: hwenv.Accelerator) -> tuple[str, str]:
    """(backend name, reason) for `accel`, from its platform, without the Transformers check.

    A torch older than the backend's floor (torch < 2.8 for xccl) is a `BackendUnavailableError`.
    """
    platform = accel.platform
    name = platform.dist_backend
    reason = rule_for(platform).reason
    detail = _torch_detail(name, accel)
    return name, f"{reason}; {detail}" if detail else reason


def backend_for(accel: hwenv.Accelerator) -> BackendChoice:
    """The backend `init()` uses for `accel` and why: the platform's `dist_backend` (xccl on XPU
    with torch >= 2.8, hccl on Gaudi, nccl on CUDA and ROCm, gloo on CPU and MPS), plus `ddp_backend`."""
    name, reason = choose_backend(accel)
    ddp, note = _ddp_value(name)
    if note:
        reason = f"{reason}; {note}"
    return BackendChoice(name, reason, ddp)


def ddp_backend(accel: hwenv.Accelerator) -> str | None:
    """The `TrainingArguments(ddp_backend=...)` value for `accel`, checked against the
    installed Transformers' choices."""
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
#: only `xccl` needs the real class (checked, since it is the newest name), whose import pulls in
#: the Trainer stack (peft, bitsandbytes) and costs seconds.
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
    logger.info("ddp_backend %r is not among TrainingArguments choices %s; leaving it unset", name, choices)
    return None, f"ddp_backend left unset: {name!r} is not among TrainingArguments choices {list(choices)}"


def ensure_available(name: str, device_type: str) -> None:
    """Raise before any process group starts when backend `name` cannot run on `device_type`
    here; imports the module that registers the backend (Gaudi's hccl) where one is needed."""
    needs = BACKENDS.get(name)
    if needs is None:
        return  # a plug-in's backend: torch.distributed says whether it is registered
    if not serves(name, device_type):
        raise BackendMismatchError(
            f"backend {name!r} does not move {device_type} tensors (it serves {', '.join(needs.device_types)}); "
            f"leave backend=None to use the device's backend, or pick one for {device_type}."
        )
    if _built_in(name) is False:
        raise BackendUnavailableError(
            f"backend {name!r} is not available: this torch build has no {_title(name)} "
            f"(torch.distributed.distributed_c10d.{needs.built_in_check}() is False). Fix: {needs.fix}."
        )
    if needs.registered_by is not None:
        try:
            importlib.import_module(needs.registered_by)  # registers the backend (hccl: G15)
        except ImportError as error:
            raise BackendUnavailableError(
                f"backend {name!r} needs {needs.registered_by}, which cannot be imported ({error}). {needs.fix}"
            ) from error


def backend_table() -> str:
    """The README's backend table: one row per registered platform (and one per torch floor),
    generated from the decisions above for a machine with torch 2.8 (a test keeps README equal)."""
    lines = ["| device | backend | `ddp_backend` (TrainingArguments) | why |", "|---|---|---|---|"]
    for platform in hwenv.platforms():
        name = platform.dist_backend
        floor = BACKENDS[name].min_torch if name in BACKENDS else None
        device = f"`{platform.kind}`: {platform.display_name}"
        if floor is not None:
            below = f"{floor[0]}.{floor[1] - 1}.0" if floor[1] else f"{floor[0] - 1}.0.0"
            try:
                choose_backend(hwenv.Accelerator(platform.kind, torch_version=below))
            except BackendUnavailableError as error:
                lines.append(f"| {device}, torch < {_min_torch_text(floor)} | refused | - | {error} |")
            device += f", torch >= {_min_torch_text(floor)}"
        _, reason = choose_backend(hwenv.Accelerator(platform.kind, torch_version="2.8.0"))
        ddp, note = _ddp_value(name)
        why = reason + (f"; {note}" if note else "")
        lines.append(f"| {device} | `{name}` | {f'`{ddp}`' if ddp else 'unset (Transformers decides)'} | {why} |")
    return "\n".join(lines)
