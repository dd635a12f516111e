"""FSDP checkpoints as safetensors. `hwrun train --fsdp` checkpoints hold each rank's shard of the model (or adapter)
and of the optimizer state as torch.distributed.checkpoint (DCP) files, `checkpoint-N/pytorch_model_fsdp_0/__R_0.distcp`
and `optimizer_0/`, written and read back by Accelerate's save_fsdp_model/load_fsdp_model, which Trainer calls with
DCP's FileSystemWriter/FileSystemReader fixed inside (no plugin setting or public Trainer hook picks another storage).
`fsdp_checkpoint_to_safetensors` turns a checkpoint's model or adapter shards into one safetensors file, in one
process, after the manifest's checksums verify."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

#: Accelerate's folder of the model's DCP shards (FSDP_MODEL_NAME, model_index 0) and of the optimizer's.
FSDP_MODEL_FOLDER = "pytorch_model_fsdp_0"
FSDP_OPTIMIZER_FOLDER = "optimizer_0"
#: Accelerate saves {"model": state_dict}; DCP flattens it, so every stored name starts with this.
_STORED_PREFIX = "model."
#: The file names Transformers and PEFT read: a full model's weights, a LoRA adapter's.
MODEL_FILE, ADAPTER_FILE = "model.safetensors", "adapter_model.safetensors"


def fsdp_model_shards(checkpoint: str | os.PathLike) -> Path | None:
    """The DCP folder of an FSDP checkpoint's model or adapter shards, or None where there is none."""
    folder = Path(checkpoint) / FSDP_MODEL_FOLDER
    return folder if (folder / ".metadata").is_file() else None


def read_fsdp_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """Every tensor of the checkpoint's model (or adapter) shards, whole, under its state_dict name (in memory:
    a full model needs its size in RAM). Reads DCP's files at any world size they were written at."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from .sharding import checkpoint_layout

    shards = fsdp_model_shards(checkpoint)
    if shards is None and checkpoint_layout(checkpoint) == "full":
        raise CheckpointError(
            f"{str(checkpoint)!r} is a checkpoint of `hwrun train --fsdp --fsdp-checkpoint full` (FULL_STATE_DICT): "
            f"it already holds the weights as safetensors ({MODEL_FILE}, or model-*-of-*.safetensors with an index, "
            f"or {ADAPTER_FILE}); there are no shards to convert.")
    if shards is None:
        raise CheckpointError(
            f"{str(checkpoint)!r} holds no FSDP model shards ({FSDP_MODEL_FOLDER}/.metadata): it is not a checkpoint "
            "of `hwrun train --fsdp` (SHARDED_STATE_DICT). A checkpoint of a run without --fsdp already holds "
            f"{MODEL_FILE} or {ADAPTER_FILE}.")
    reader = dcp.FileSystemReader(shards)
    state = {name: torch.empty(entry.size, dtype=entry.properties.dtype)
             for name, entry in reader.read_metadata().state_dict_metadata.items()
             if isinstance(entry, TensorStorageMetadata)}
    with warnings.catch_warnings():  # DCP warns that it loads in one process even when told to (no_dist)
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(shards), no_dist=True)
    return {(name[len(_STORED_PREFIX):] if name.startswith(_STORED_PREFIX) else name): tensor
            for name, tensor in state.items()}


def fsdp_checkpoint_to_safetensors(checkpoint: str | os.PathLike, output_dir: str | os.PathLike, *,
                                   verify: bool = True) -> Path:
    """Write an FSDP checkpoint's weights into `output_dir` as one safetensors file: `adapter_model.safetensors`
    (PEFT's names) for a LoRA run, else `model.safetensors` (the model's state_dict names); returns its path.
    With `verify` (the default) every file must match its sha256 in the checkpoint's manifest first. Never replaces
    a file: an existing target is refused. Call it in one process (under a launcher, on rank 0 only)."""
    from safetensors.torch import save_file

    from .checkpoints import check_checkpoint, checkpoint_run

    checkpoint = Path(checkpoint)
    if verify:
        problem = check_checkpoint(checkpoint, verify=True)
        if problem is not None:
            raise CheckpointError(
                f"Cannot convert {str(checkpoint)!r}: {problem}. Nothing was written. Fix: convert a checkpoint "
                "that verifies (hwrun.training.latest_complete_checkpoint(OUTPUT, verify=True) names the newest), "
                "or restore the damaged file; verify=False converts a checkpoint without hwrun's manifest.")
    state = read_fsdp_state(checkpoint)
    adapter = checkpoint_run(checkpoint).get("kind") in ("lora", "qlora") or (
        bool(state) and all(name.startswith("base_model.model.") for name in state))
    target = Path(output_dir) / (ADAPTER_FILE if adapter else MODEL_FILE)
    if target.exists():
        raise CheckpointError(f"{target} exists; it was left as it is. Fix: name another output folder.")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    try:
        save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(partial),
                  metadata={"format": "pt"})
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
