"""What FSDP and DeepSpeed ZeRO change for a training run: ZeRO-3's load and save, Transformers' process-wide
ZeRO-3 flag, and why hwrun's fused projections stay off under sharding."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
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
#: as FSDP_CHECKPOINTS["sharded"] unless `--fsdp-checkpoint full` (fsdp_overrides); the final model is gathered into
#: one safetensors file (or the adapter).
FSDP_CONFIG: dict[str, Any] = {"version": 2, "cpu_ram_efficient_loading": True,
                               "state_dict_type": "SHARDED_STATE_DICT", "reshard_after_forward": True}

#: `--fsdp-checkpoint` / `train(fsdp_checkpoint=...)`: the kind of checkpoint -> Accelerate's FSDP state_dict_type.
#: Both resume at any world size. "sharded": every rank writes its own shard of the weights and of the AdamW state
#: through torch.distributed.checkpoint (DCP's .distcp files; sharded_checkpoints.py turns them into safetensors and
#: says why they are not safetensors already); nothing is gathered. "full": the ranks gather every weight (or the
#: adapter) and the AdamW state onto rank 0's host memory; Trainer's save_model writes the weights with
#: save_pretrained (model.safetensors, split into model-0000x-of-0000y.safetensors shards with an index past
#: Transformers' 50GB max_shard_size; or adapter_model.safetensors), which are the only copy and what a resume reads
#: (full_checkpoints.py: Accelerate's pytorch_model_fsdp.bin is not written); the AdamW state is Accelerate's
#: optimizer.bin (torch.save of the gathered state dict, read with weights_only=True: there is no safetensors form).
FSDP_CHECKPOINTS: dict[str, str] = {"sharded": "SHARDED_STATE_DICT", "full": "FULL_STATE_DICT"}
#: `hwrun train --fsdp` without --fsdp-checkpoint: no rank gathers the model, so rank 0's host memory holds one
#: shard, not the whole model plus twice its size of AdamW state, and the weights are written once, not twice
#: (README, "Distributed").
DEFAULT_FSDP_CHECKPOINT = "sharded"
#: What a checkpoint folder holds for each kind (Accelerate's names: FSDP_MODEL_NAME and OPTIMIZER_NAME, index 0):
#: the DCP folder of the model's shards; the gathered AdamW state (and, in checkpoints before full_checkpoints.py,
#: the gathered model as a pickle). A checkpoint without FSDP has optimizer.pt instead.
_LAYOUT_FILES = {"sharded": ("pytorch_model_fsdp_0",), "full": ("optimizer.bin", "pytorch_model_fsdp.bin")}


def fsdp_checkpoint_kind(value: Any, spelled: str = "fsdp_checkpoint={value!r}") -> str:
    """`value` checked: "full" or "sharded" (FSDP_CHECKPOINTS), else a TrainingConfigError naming it (`spelled` is
    the caller's spelling, a format string of `value`)."""
    if isinstance(value, str) and value in FSDP_CHECKPOINTS:
        return value
    raise TrainingConfigError(
        f"{spelled.format(value=value)} is not a kind of FSDP checkpoint: use 'sharded' (each rank writes its shard, "
        "torch.distributed.checkpoint files) or 'full' (gathered on rank 0, the model or adapter as safetensors). "
        "Both resume at another world size.")


def with_fsdp_checkpoint(kind: str | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`train(fsdp_checkpoint=kind, **overrides)`: the TrainingArguments keywords with fsdp_config's state_dict_type
    set for `kind` (None: `overrides` as given; Transformers' own default is FULL_STATE_DICT). Refused without fsdp=,
    with an fsdp_config file (its state_dict_type is in the file), or when fsdp_config names the other kind."""
    if kind is None:
        return dict(overrides)
    fsdp_checkpoint_kind(kind)
    wanted = FSDP_CHECKPOINTS[kind]
    if not overrides.get("fsdp"):
        raise TrainingConfigError(
            f"fsdp_checkpoint={kind!r} without fsdp=: the kind of checkpoint is an FSDP setting. Fix: add fsdp=True "
            "(with fsdp_config={'fsdp_version': 2}), or drop fsdp_checkpoint (under `accelerate launch --use_fsdp`, "
            "its --fsdp_state_dict_type sets it).")
    config = overrides.get("fsdp_config")
    if config is not None and not isinstance(config, Mapping):
        raise TrainingConfigError(
            f"fsdp_checkpoint={kind!r} with fsdp_config={config!r}, a file: hwrun does not rewrite it. Fix: set "
            f"\"state_dict_type\": \"{wanted}\" in that file and drop fsdp_checkpoint, or pass fsdp_config as a dict.")
    config = dict(config or {})
    given = {config.get(key) for key in ("state_dict_type", "fsdp_state_dict_type")} - {None}
    if any(str(value).upper() != wanted for value in given):
        raise TrainingConfigError(
            f"fsdp_checkpoint={kind!r} asks for {wanted}, but fsdp_config says state_dict_type="
            f"{', '.join(map(str, sorted(given, key=str)))}. Fix: drop one of the two.")
    config.pop("fsdp_state_dict_type", None)
    config["state_dict_type"] = wanted
    return {**overrides, "fsdp_config": config}


def checkpoint_layout(folder: str | os.PathLike) -> str | None:
    """The kind of FSDP checkpoint `folder` holds ("sharded" or "full", by Accelerate's file names), or None (no
    FSDP weights: a checkpoint of a run without FSDP)."""
    found = [kind for kind, names in _LAYOUT_FILES.items()
             if any(os.path.exists(os.path.join(folder, name)) for name in names)]
    return found[0] if len(found) == 1 else None


def _layout_file(folder: str | os.PathLike, kind: str) -> str:
    """The file of `folder` that makes it a checkpoint of `kind` (for the messages)."""
    return next((name for name in _LAYOUT_FILES[kind] if os.path.exists(os.path.join(folder, name))),
                _LAYOUT_FILES[kind][0])


#: The state_dict_type Transformers gives FSDP when fsdp_config names none (transformers 5.25 training_args.py,
#: `_process_fsdp_args`: `self.fsdp_config.get("state_dict_type", "FULL_STATE_DICT")`).
TRANSFORMERS_STATE_DICT_TYPE = "FULL_STATE_DICT"


def asked_checkpoint_kind(overrides: Mapping[str, Any]) -> str | None:
    """The kind of FSDP checkpoint ("sharded" or "full") these TrainingArguments keywords write and read, read the way
    TrainingArguments reads fsdp_config (a dict or a JSON file; an `fsdp_` prefix dropped, so `fsdp_state_dict_type`
    wins); None without fsdp= (or with a config this cannot read: TrainingArguments reports it)."""
    if not overrides.get("fsdp"):
        return None
    config = overrides.get("fsdp_config")
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError):
            return None
    if config is not None and not isinstance(config, Mapping):
        return None
    config = config or {}
    value = str(config.get("fsdp_state_dict_type", config.get("state_dict_type", TRANSFORMERS_STATE_DICT_TYPE)))
    return next((kind for kind, name in FSDP_CHECKPOINTS.items() if name == value.upper()), None)


def check_fsdp_resume(overrides: Mapping[str, Any], folder: str | None) -> None:
    """Before the data is read and the model loads: an FSDP run resumes only from a checkpoint of the kind it writes
    (Trainer reads `pytorch_model_fsdp_0/` and `optimizer_0/` under SHARDED_STATE_DICT, the safetensors and
    `optimizer.bin` under FULL_STATE_DICT, and would fail on the other one once the model is loaded)."""
    kind = asked_checkpoint_kind(overrides)
    found = checkpoint_layout(folder) if folder is not None and kind is not None else None
    if found is None or found == kind:
        return
    raise TrainingConfigError(
        f"{folder} is a {found!r} FSDP checkpoint ({_layout_file(folder, found)}), but this run writes and reads {kind!r} "
        f"ones ({FSDP_CHECKPOINTS[kind]}): Trainer would not find its weights. Fix: resume with --fsdp-checkpoint "
        f"{found} (train(..., fsdp_checkpoint={found!r})); either kind resumes at any world size.")


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


def fsdp_overrides(plan: Any, checkpoint: str = DEFAULT_FSDP_CHECKPOINT) -> tuple[dict[str, Any], str]:
    """The TrainingArguments keywords of `--fsdp` (with `--fsdp-checkpoint checkpoint`) for the plan's device, and
    why. On Gaudi, FSDP runs in eager mode (Intel's Gaudi FSDP guide: eager with torch.compile), so
    PT_HPU_LAZY_MODE=1 is refused."""
    fsdp_checkpoint_kind(checkpoint, "--fsdp-checkpoint {value}")
    lazy = plan.accelerator.platform.lazy_mode_variable  # Gaudi's PT_HPU_LAZY_MODE; None where there is no lazy mode
    if lazy is not None and os.environ.get(lazy, "").strip() == "1":
        raise TrainingConfigError(
            f"--fsdp with {lazy}=1: Intel Gaudi runs FSDP in eager mode (with torch.compile), not in lazy "
            f"mode. Fix: unset {lazy} (eager is the default since Gaudi software 1.21) or set it to 0.")
    saved = ("checkpoints sharded with torch.distributed.checkpoint (each rank writes its shard)" if checkpoint ==
             "sharded" else "checkpoints gathered on rank 0 (the model or adapter as safetensors, the optimizer as "
             "one file)")
    why = ("FSDP2 (Accelerate): parameters, gradients and optimizer state sharded over the ranks; rank 0 reads the "
           f"weights and broadcasts them (cpu_ram_efficient_loading); {saved}, loadable at another world size; the "
           "final model gathered into one file")
    return {"fsdp": "full_shard",
            "fsdp_config": {**FSDP_CONFIG, "state_dict_type": FSDP_CHECKPOINTS[checkpoint]}}, why


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
