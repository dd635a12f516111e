"""hwrun's training half: `train()` with Transformers' Trainer + PEFT LoRA / 4-bit QLoRA,
`training_arguments()` for the device, packed data, atomic resumable checkpoints; `HwrunAccelerateGuard` for your
own Accelerate loop (`HwrunCallback`, in .callbacks, for your own Trainer)."""

from ..errors import (
    AdapterFormatError,
    CheckpointError,
    NonFiniteLossError,
    QLoRAUnsupportedError,
    TrainingConfigError,
    TrainingDataError,
    TrainingError,
)
from ..model.adapters import (
    check_adapter_weights,
    is_adapter_folder,
    save_adapter,
    save_merged,
)
from ..model.load import load_adapter_model
from .accelerate_loop import HwrunAccelerateGuard
from .arguments import training_arguments, training_keywords
from .checkpoints import (
    ResumeChoice,
    check_checkpoint,
    choose_resume,
    latest_complete_checkpoint,
    resolve_resume,
)
from .data import (
    DEFAULT_MAX_DATA_BYTES,
    PackedDataset,
    build_dataset,
    pack_token_ids,
    read_documents,
)
from .lora import (
    ALL_LINEAR,
    LoraSettings,
    LoraTargets,
    lora_config,
    lora_targets,
    peft_target_mapping,
)
from .options import POLICIES
from .output import OUTPUT_MANIFEST
from .patches.fused_loss import apply_fused_loss, linear_cross_entropy, prepare_linear_cross_entropy
from .patches.fused_projections import apply_fused_projections
from .patches.library_kernels import apply_liger_rope, apply_liger_swiglu, apply_rmsnorm
from .patches.record import ModelPatch
from .patches.rope_table import apply_rope_table
from .patches.swiglu import prepare_swiglu, swiglu
from .run import TrainResult, train, train_plan

__all__ = [
    "ALL_LINEAR", "AdapterFormatError", "CheckpointError", "DEFAULT_MAX_DATA_BYTES", "HwrunAccelerateGuard",
    "NonFiniteLossError",
    "OUTPUT_MANIFEST", "POLICIES", "ResumeChoice", "check_adapter_weights", "choose_resume", "LoraSettings", "LoraTargets", "ModelPatch", "PackedDataset",
    "QLoRAUnsupportedError",
    "TrainResult", "TrainingConfigError", "TrainingDataError", "TrainingError", "apply_fused_loss",
    "apply_fused_projections", "apply_liger_rope", "apply_liger_swiglu", "apply_rmsnorm", "apply_rope_table",
    "build_dataset", "check_checkpoint", "is_adapter_folder", "latest_complete_checkpoint",
    "linear_cross_entropy", "load_adapter_model", "lora_config", "lora_targets", "pack_token_ids", "peft_target_mapping",
    "prepare_linear_cross_entropy",
    "prepare_swiglu", "read_documents", "resolve_resume", "save_adapter", "save_merged", "swiglu",
    "train", "training_arguments",
    "training_keywords", "train_plan",
]
