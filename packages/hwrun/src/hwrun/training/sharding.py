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
