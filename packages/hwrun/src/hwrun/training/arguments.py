"""`training_arguments(plan, output_dir, **overrides)`: a real `transformers.TrainingArguments`
built for the plan's device: bf16 where supported (X17, G12), compile keywords from hwcompile
(G14), `ddp_backend` from hwdist (X18, G15), `use_cpu` on CPU."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import devices
from ..errors import TrainingConfigError

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from hwrun.model.plan import RunPlan

logger = logging.getLogger(__name__)

# Keywords hwrun sets unless overridden, and why.
DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "learning_rate": 2e-4,          # the usual LoRA learning rate
    "lr_scheduler_type": "linear",
    "warmup_steps": 0,
    "logging_steps": 1,             # a loss per step: the curve, and resume comparisons
    "logging_nan_inf_filter": False,  # no device->host sync each step; a NaN loss is logged as NaN, not hidden
    "save_strategy": "steps",
    "save_steps": 100,
    "save_total_limit": 3,
    "report_to": "none",            # no network, no surprise tracker
    "remove_unused_columns": False,  # the packed dataset gives exactly the model's inputs
    # gradient_checkpointing stays at TrainingArguments' default (off: LoRA activations fit; recomputation costs
    # ~30% speed); passing it warns in transformers 5.25 (renamed activation_checkpointing, absent in 5.22)
    "dataloader_pin_memory": True,
    "seed": 42,
}


# accelerate's AcceleratorState (state.py, 1.16) switches to DistributedType.FSDP only for the
# MULTI_GPU/XPU/HPU/NPU/MLU/SDAA/MUSA/NEURON process types; under MULTI_CPU (use_cpu, gloo) it drops
# the FSDP plugin and trains plain DDP with no message, and MPS has no multi-process type at all.
# (torch's own fully_shard does run on CPU with gloo; the gate is accelerate's.)
#: Per kind: does accelerate build FSDP there (ROCm is MULTI_GPU through torch's cuda device).
FSDP_SUPPORT: dict[str, bool] = {"hpu": True, "xpu": True, "rocm": True, "cuda": True, "mps": False, "cpu": False}

#: Per kind: torch's fused AdamW (`adamw_torch_fused`). torch/optim/adam.py has fused kernels for cuda
#: (also ROCm), xpu and cpu; on Gaudi hwrun keeps plain `adamw_torch` (Intel ships its own FusedAdamW).
FUSED_ADAMW: dict[str, bool] = {"hpu": False, "xpu": True, "rocm": True, "cuda": True, "mps": False, "cpu": True}

#: Per kind: copy batches from pinned memory without blocking the host (accelerator_config non_blocking).
#: A blocking copy waits for the previous step's kernels, so the GPU idles while the host then
#: launches the next step. Gaudi (lazy graphs) and MPS keep accelerate's default.
NON_BLOCKING_COPIES: dict[str, bool] = {
    "hpu": False, "xpu": True, "rocm": True, "cuda": True, "mps": False, "cpu": False,
}


def _check_sharding(plan: RunPlan, keywords: Mapping[str, Any]) -> None:
    """Reject fsdp= where accelerate would silently train DDP instead, and deepspeed= without the
    deepspeed package, before anything loads."""
    accel = plan.accelerator
    fsdp = keywords.get("fsdp")
    kind = devices.HOST_KIND if keywords.get("use_cpu") else accel.kind  # use_cpu=True trains on CPU whatever the plan
    if fsdp and not devices.row(FSDP_SUPPORT, kind, False):
        import accelerate

        raise TrainingConfigError(
            f"fsdp={fsdp!r} cannot shard on {kind} ({accel.name}, device {accel.device}): accelerate "
            f"{accelerate.__version__} builds FSDP only for GPU/XPU/HPU/NPU process groups; on CPU "
            "(use_cpu, gloo) it drops the FSDP plugin and trains plain DDP, every rank holding the "
            "whole model, and MPS has no multi-process mode. Fix: drop fsdp=/fsdp_config= here "
            "(`hwdist launch --nproc-per-node N` trains data-parallel DDP on CPU), or use FSDP on a "
            "cuda, xpu or hpu plan."
        )
    deepspeed = keywords.get("deepspeed")
    if deepspeed and importlib.util.find_spec("deepspeed") is None:
        raise TrainingConfigError(
            f"deepspeed={deepspeed!r} needs the `deepspeed` package, which is not installed in this "
            "environment (Transformers would stop with PackageNotFoundError 'deepspeed>=0.9.3'). "
            "Fix: install it (`pip install deepspeed`, on a machine whose accelerator it supports), "
            "or drop deepspeed= and use fsdp=True, fsdp_config={'fsdp_version': 2} on cuda/xpu/hpu, "
            "or plain DDP through `hwdist launch`."
        )


def _fused_adamw_ok(kind: str) -> bool:
    return devices.row(FUSED_ADAMW, kind, False)


def _precision(plan: RunPlan, overrides: dict[str, Any]) -> dict[str, Any]:
    accel = plan.accelerator
    bf16 = overrides.pop("bf16", None)
    fp16 = overrides.pop("fp16", None)
    if bf16 is None and fp16 is None:
        bf16 = plan.dtype == "bfloat16"
        fp16 = plan.dtype == "float16"
    bf16, fp16 = bool(bf16), bool(fp16)
    if bf16 and fp16:
        raise TrainingConfigError("bf16=True and fp16=True were both given; mixed precision is one of "
                                  "them. Fix: pass only one.")
    if bf16 and accel.platform.is_accelerator and accel.bf16 is False:
        names = ", ".join(accel.names) or accel.kind
        read = accel.bf16_source or "torch reports no bf16"
        raise TrainingConfigError(
            f"bf16=True but {accel.name} ({names}, device {accel.device}) does not support bfloat16 "
            f"({read}, X17). Fix: use fp16=True, or plan(dtype='float16') / dtype='auto'."
        )
    return {"bf16": bf16, "fp16": fp16}


def is_distributed_launch(environ: Mapping[str, str] | None = None) -> bool:
    """True under torchrun / accelerate launch / hwdist launch (LOCAL_RANK set, or WORLD_SIZE > 1).

    `ddp_backend` is set only then: accelerate's PartialState (state.py, 1.16) treats any given
    backend as "distributed" and calls `get_world_size()`, which fails in a single process.
    """
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        world = 1
    return env.get("LOCAL_RANK", "-1") not in ("", "-1") or world > 1


def training_keywords(plan: RunPlan, output_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """The keyword dict `training_arguments` passes to `TrainingArguments` (so it can be shown
    or checked without building one); `overrides` win over every hwrun default."""
    import hwcompile
    import hwdist

    accel = plan.accelerator
    overrides = dict(overrides)
    keywords: dict[str, Any] = dict(DEFAULTS)
    keywords["output_dir"] = os.fspath(output_dir)
    keywords.update(_precision(plan, overrides))
    keywords["use_cpu"] = not accel.platform.is_accelerator
    keywords["optim"] = "adamw_torch_fused" if _fused_adamw_ok(accel.kind) else "adamw_torch"
    if devices.row(NON_BLOCKING_COPIES, accel.kind, False):
        keywords["accelerator_config"] = {"non_blocking": True}
    compile_on = plan.compile is not None
    backend = plan.compile.backend if compile_on and isinstance(plan.compile.backend, str) else None
    keywords.update(hwcompile.training_arguments(accel, compile=compile_on, backend=backend))
    if is_distributed_launch():
        ddp = hwdist.ddp_backend(accel)
        if ddp is not None:
            keywords["ddp_backend"] = ddp
    keywords.update(overrides)
    _check_sharding(plan, keywords)
    return keywords


def training_arguments(plan: RunPlan, output_dir: str | os.PathLike, **overrides: Any) -> TrainingArguments:
    """A `transformers.TrainingArguments` for `plan`'s device; `overrides` are TrainingArguments
    keywords that win over hwrun's choices. Raises TrainingConfigError (a ValueError) for bf16 on a
    device without it, before anything loads (X17)."""
    from transformers import TrainingArguments

    keywords = training_keywords(plan, output_dir, **overrides)
    logger.info("TrainingArguments for %s: %s", plan.accelerator.device,
                {k: keywords[k] for k in ("bf16", "fp16", "use_cpu", "optim", "torch_compile") if k in keywords})
    return TrainingArguments(**keywords)
