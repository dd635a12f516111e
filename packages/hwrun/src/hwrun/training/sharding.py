"""What FSDP and DeepSpeed ZeRO change for a training run: ZeRO-3's load and save, Transformers' process-wide
ZeRO-3 flag, and why hwrun's fused projections stay off under sharding."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from ..errors import TrainingConfigError

logger = logging.getLogger(__name__)


def is_sharded(args: Any) -> bool:
    """True when `args` shard parameters per rank (FSDP or DeepSpeed): each rank then holds only part of a weight."""
    return bool(getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")
                or getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None) is not None)


def deepspeed_zero3(args: Any) -> bool:
    """True when `args` train with DeepSpeed ZeRO-3 (from deepspeed=..., or from `accelerate launch
    --use_deepspeed`'s plugin); rejects, before the model loads, a ZeRO-3 config that would leave
    nothing to save at the end as one safetensors model."""
    plugin = getattr(args, "deepspeed_plugin", None)
    config = getattr(plugin, "hf_ds_config", None)
    if config is None or not config.is_zero3():
        return False
    if not config.is_true("zero_optimization.stage3_gather_16bit_weights_on_model_save"):
        source = (f"deepspeed={args.deepspeed!r}" if args.deepspeed else
                  "accelerate's DeepSpeed plugin (accelerate launch --use_deepspeed)")
        release_zero3()  # these arguments are abandoned: leave no ZeRO-3 flag for later loads
        raise TrainingConfigError(
            f"{source} uses ZeRO stage 3 without "
            "zero_optimization.stage3_gather_16bit_weights_on_model_save=true: each rank then holds only "
            "its shard and neither Trainer's checkpoints nor hwrun's final model could be written as "
            "safetensors. Fix: set \"stage3_gather_16bit_weights_on_model_save\": true in the "
            "zero_optimization section (accelerate: --zero3_save_16bit_model true), or use stage 2."
        )
    return True


def init_deepspeed_comm(args: Any) -> None:
    """Start deepspeed.comm on the process group Trainer's arguments started, before zero.Init
    partitions the weights at load. accelerate does this itself only for accelerator groups; on a
    CPU (gloo) group deepspeed.comm would still be down and zero.Init would see a world of 1."""
    if args.world_size <= 1:
        return
    from deepspeed import comm

    if not comm.is_initialized():
        logger.info("ZeRO-3 on a %s group of %d: starting deepspeed.comm on it before the model loads",
                    args.ddp_backend or "default", args.world_size)
        comm.init_distributed(dist_backend=args.ddp_backend, auto_mpi_discovery=False)


def release_zero3() -> None:
    """Clear Transformers' process-wide ZeRO-3 flag (a weak reference to the arguments' DeepSpeed
    config, set when they were built), which would make every later from_pretrained partition."""
    from transformers.integrations import deepspeed

    deepspeed.unset_hf_deepspeed_config()


@contextlib.contextmanager
def zero3_suspended() -> Iterator[None]:
    """While active, from_pretrained loads whole weights even if Trainer's arguments enabled
    ZeRO-3: under it zero.Init partitions at load, a collective that hangs when one rank loads
    alone (the merge after training). Transformers' ZeRO-3 flag is restored on exit."""
    from transformers.integrations import deepspeed

    saved = deepspeed._hf_deepspeed_config_weak_ref
    release_zero3()
    try:
        yield
    finally:
        deepspeed._hf_deepspeed_config_weak_ref = saved


def fusion_blocker(args: Any, qlora: bool) -> str | None:
    """Why the projections of this run stay separate, or None: fusing shares one storage between
    frozen weights, which FSDP and DeepSpeed shard per parameter, and 4-bit layers cannot concatenate."""
    if qlora:
        return "not fused: the 4-bit base layers are not plain Linear layers"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        return "not fused: FSDP shards each weight on its own"
    if getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None) is not None:
        return "not fused: DeepSpeed partitions each weight on its own"
    return None


#: `hwrun train --fsdp`: FSDP2 through Accelerate (Transformers' fsdp_config keys). Rank 0 alone reads the weights
#: and broadcasts them (cpu_ram_efficient_loading: the other ranks build the model on the meta device); checkpoints
#: are sharded with torch.distributed.checkpoint (every rank writes its own shard, DCP's .distcp files; a later run at
#: another world size re-shards them as it loads; sharded_checkpoints.py turns them into safetensors, and says why
#: they are not safetensors already); the final model is gathered into one safetensors file (or the adapter).
FSDP_CONFIG: dict[str, Any] = {"version": 2, "cpu_ram_efficient_loading": True,
                               "state_dict_type": "SHARDED_STATE_DICT", "reshard_after_forward": True}

#: Per kind: does DeepSpeed (0.19) run ZeRO there. Its accelerators (deepspeed/accelerator/real_accelerator.py): cuda
#: (and ROCm through it), xpu (torch.xpu; oneCCL bindings optional), hpu (habana_frameworks; Intel's Gaudi docs use
#: HabanaAI's DeepSpeed fork), cpu (gloo; DS_ACCELERATOR=cpu). mps has no collective backend for a process group.
DEEPSPEED_SUPPORT: dict[str, bool] = {"cuda": True, "rocm": True, "xpu": True, "hpu": True, "cpu": True,
                                      "mps": False}
#: What the plan adds about DeepSpeed per kind.
DEEPSPEED_NOTES: dict[str, str] = {"hpu": " (Intel's Gaudi docs install HabanaAI's DeepSpeed fork)"}

#: `--deepspeed zero2|zero3`: the config (Trainer fills the "auto" values from its arguments). ZeRO-3 gathers the
#: 16-bit weights when it saves, so the final model is one safetensors file.
DEEPSPEED_CONFIGS: dict[str, dict[str, Any]] = {
    "zero2": {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "train_batch_size": "auto", "gradient_clipping": "auto"},
    "zero3": {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
              "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "train_batch_size": "auto", "gradient_clipping": "auto"},
}


def fsdp_overrides(plan: Any) -> tuple[dict[str, Any], str]:
    """The TrainingArguments keywords of `--fsdp` for the plan's device, and why. On Gaudi, FSDP runs in eager mode
    (Intel's Gaudi FSDP guide: eager with torch.compile), so PT_HPU_LAZY_MODE=1 is refused."""
    lazy = plan.accelerator.platform.lazy_mode_variable  # Gaudi's PT_HPU_LAZY_MODE; None where there is no lazy mode
    if lazy is not None and os.environ.get(lazy, "").strip() == "1":
        raise TrainingConfigError(
            f"--fsdp with {lazy}=1: Intel Gaudi runs FSDP in eager mode (with torch.compile), not in lazy "
            f"mode. Fix: unset {lazy} (eager is the default since Gaudi software 1.21) or set it to 0.")
    why = ("FSDP2 (Accelerate): parameters, gradients and optimizer state sharded over the ranks; rank 0 reads the "
           "weights and broadcasts them (cpu_ram_efficient_loading); checkpoints sharded with "
           "torch.distributed.checkpoint, loadable at another world size; the final model gathered into one file")
    return {"fsdp": "full_shard", "fsdp_config": dict(FSDP_CONFIG)}, why


def deepspeed_overrides(plan: Any, stage: str) -> tuple[dict[str, Any], str]:
    """The TrainingArguments keywords of `--deepspeed zero2|zero3` (or a JSON config file) for the plan's device."""
    from .. import devices

    kind = plan.accelerator.kind
    if not devices.row(DEEPSPEED_SUPPORT, kind, False):
        raise TrainingConfigError(
            f"--deepspeed {stage} on {kind} ({plan.accelerator.name}): DeepSpeed has no ZeRO for this device (no "
            "process-group backend). Fix: train on one device without --deepspeed (LoRA or QLoRA), or on a cuda, "
            "xpu, hpu or cpu machine.")
    if stage in DEEPSPEED_CONFIGS:
        config: Any = {**DEEPSPEED_CONFIGS[stage]}
        config["zero_optimization"] = dict(config["zero_optimization"])
    else:
        path = os.path.expanduser(stage)
        if not os.path.isfile(path):
            raise TrainingConfigError(f"--deepspeed {stage!r} is neither zero2, zero3 nor a DeepSpeed JSON config "
                                      "file. Fix: --deepspeed zero2, --deepspeed zero3, or the path of a config.")
        config = path
    note = devices.row(DEEPSPEED_NOTES, kind, "")
    return {"deepspeed": config}, f"DeepSpeed {stage} on {kind}{note}"
