"""`hwrun train --fsdp --fsdp-checkpoint full` (FULL_STATE_DICT) checkpoints hold the weights once, as safetensors.

Trainer's `save_model` gathers the model (or the adapter) onto rank 0 and writes it with `save_pretrained`
(`model.safetensors`, or shards with an index, or `adapter_model.safetensors`); Accelerate's `save_fsdp_model` would
then gather it a second time and torch.save it as `pytorch_model_fsdp.bin`, the copy its `load_fsdp_model` reads on
resume (accelerate 1.16 utils/fsdp_utils.py; Trainer calls both through names it imports into transformers.trainer,
5.22.2 to 5.25). While `safetensors_full_checkpoints` is active, those two names do this instead under
FULL_STATE_DICT: the save writes nothing more (it checks that save_pretrained's files are there), and the load reads
the safetensors on rank 0 (the model through the class's own `from_pretrained`, which undoes save_pretrained's renames
and dropped ties; the adapter under the names PEFT saved it with) and hands them to every rank with torch's
`set_model_state_dict(broadcast_from_rank0=True)`, as Accelerate does with its pickle, at any world size. The AdamW
state stays Accelerate's `optimizer.bin` (torch.save of the gathered optimizer state dict): neither Accelerate nor
Transformers has a safetensors form for it, and Accelerate reads it with `torch.load(weights_only=True)`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

logger = logging.getLogger(__name__)

#: What Accelerate used to write beside the safetensors under FULL_STATE_DICT (FSDP_MODEL_NAME, model_index 0); an
#: older checkpoint may still hold it, and it is not read.
LEGACY_MODEL_FILE = "pytorch_model_fsdp.bin"
#: Accelerate's gathered AdamW state under FULL_STATE_DICT (OPTIMIZER_NAME, optimizer_index 0), torch.save.
OPTIMIZER_FILE = "optimizer.bin"
#: save_pretrained's files: a model in one file, a model in shards (the index names them), an adapter.
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
_ADAPTER_FILE = "adapter_model.safetensors"


def is_full_state_dict(fsdp_plugin: Any) -> bool:
    """True when Accelerate's FSDP plugin saves and loads gathered state dicts (FULL_STATE_DICT)."""
    return "FULL_STATE_DICT" in str(getattr(fsdp_plugin, "state_dict_type", ""))


@contextlib.contextmanager
def safetensors_full_checkpoints(trainer: Any, reasons: dict | None = None) -> Iterator[None]:
    """While active, `trainer`'s FULL_STATE_DICT FSDP checkpoints hold the weights only as save_pretrained's
    safetensors, and a resume reads them (module docstring). Does nothing for another trainer (no FSDP, sharded
    checkpoints); `reasons` gets a "checkpoints" line when it applies."""
    plugin = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(plugin, "fsdp_plugin", None)
    if not getattr(trainer, "is_fsdp_enabled", False) or not is_full_state_dict(plugin):
        yield
        return
    import transformers.trainer as library

    saved = library.save_fsdp_model, library.load_fsdp_model
    library.save_fsdp_model = _saver(saved[0])
    library.load_fsdp_model = _loader(saved[1])
    if reasons is not None:
        reasons["checkpoints"] = ("FSDP full checkpoints: the weights once, as save_pretrained's safetensors, which a "
                                  f"resume reads; the AdamW state as Accelerate's {OPTIMIZER_FILE} (torch.save, read "
                                  "with weights_only=True)")
    try:
        yield
    finally:
        library.save_fsdp_model, library.load_fsdp_model = saved


def _saver(original: Any) -> Any:
    def save_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, output_dir: str, *args: Any,
                        **kwargs: Any) -> None:
        """Accelerate's save_fsdp_model, except under FULL_STATE_DICT: the weights are already in output_dir."""
        if not is_full_state_dict(fsdp_plugin):
            return original(fsdp_plugin, accelerator, model, output_dir, *args, **kwargs)
        if accelerator.is_main_process and not any((Path(output_dir) / name).is_file() for name in MODEL_FILES):
            raise CheckpointError(
                f"{output_dir} holds none of {', '.join(MODEL_FILES)} after Trainer's save_model: this checkpoint "
                "would hold no weights (hwrun writes no second copy of them). Fix: report this with your "
                "transformers version; --fsdp-checkpoint sharded writes each rank's shard instead.")
        logger.debug("%s: the weights are save_pretrained's safetensors; no %s written", output_dir,
                     LEGACY_MODEL_FILE)
        return None

    return save_fsdp_model


def _loader(original: Any) -> Any:
    def load_fsdp_model(fsdp_plugin: Any, accelerator: Any, model: Any, input_dir: str, *args: Any,
                        adapter_only: bool = False, **kwargs: Any) -> Any:
        """Accelerate's load_fsdp_model, except under FULL_STATE_DICT: from the checkpoint's safetensors."""
        if not is_full_state_dict(fsdp_plugin):
            return original(fsdp_plugin, accelerator, model, input_dir, *args, adapter_only=adapter_only, **kwargs)
        return load_full_checkpoint(accelerator, model, input_dir, adapter_only=adapter_only)

    return load_fsdp_model


def load_full_checkpoint(accelerator: Any, model: Any, folder: str | Path, *, adapter_only: bool = False) -> Any:
    """Load a FULL_STATE_DICT checkpoint's safetensors into the FSDP2 `model` on every rank (a collective): rank 0
    reads them, torch broadcasts each tensor and every rank keeps its shard. With `adapter_only` and a PEFT model,
    only the adapter (adapter_model.safetensors). A file that is missing or does not fit the model is a
    CheckpointError on every rank, naming it."""
    import torch.distributed as dist
    from accelerate.utils import is_peft_model
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    accelerator.wait_for_everyone()
    adapter = adapter_only and is_peft_model(model)
    many = accelerator.num_processes > 1
    # each rank's own shards (no gather): the names and global shapes the checkpoint must provide
    local = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=adapter))
    state: dict[str, Any] = {}
    problem: BaseException | None = None
    if accelerator.is_main_process:
        try:
            state = (_adapter_state if adapter else _model_state)(model, Path(folder), local)
        except Exception as error:  # noqa: BLE001 - the other ranks must hear of it before they wait in a broadcast
            problem = error
    if many and dist.is_initialized():
        said = [None if problem is None else f"{type(problem).__name__}: {problem}"]
        dist.broadcast_object_list(said, src=0)
        if said[0] is not None and problem is None:
            raise CheckpointError(f"rank 0 could not read {folder}: {said[0]}")
    if problem is not None:
        if isinstance(problem, CheckpointError):
            raise problem
        raise CheckpointError(f"{folder}: its weights could not be read from safetensors ({type(problem).__name__}: "
                              f"{problem}). Fix: resume from another checkpoint (resume=PATH), or start fresh in a "
                              "new output_dir.") from problem
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=many, cpu_offload=many, strict=not adapter)
    result = set_model_state_dict(model, state, options=options)
    accelerator.wait_for_everyone()
    logger.info("Resumed the %s from %s's safetensors", "adapter" if adapter else "model", folder)
    return result


def _model_class(model: Any) -> Any:
    """The model's own class: FSDP2's fully_shard swaps in a subclass (FSDP<Class>, FSDPModule first)."""
    from torch.distributed.fsdp import FSDPModule

    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def _dtype(local: dict[str, Any]) -> Any:
    """The floating dtype most of the model's tensors have (the checkpoint was gathered from them)."""
    from collections import Counter

    counts = Counter(value.dtype for value in local.values() if value.is_floating_point())
    return counts.most_common(1)[0][0] if counts else None


def _model_state(model: Any, folder: Path, local: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: the whole model's weights from `folder`'s safetensors, under the names of `local` (the FSDP model's
    state_dict names), read by the model class's from_pretrained (save_pretrained's renames and dropped ties undone)."""
    if not any((folder / name).is_file() for name in MODEL_FILES[:2]):
        raise CheckpointError(
            f"{folder} holds neither {MODEL_FILES[0]} nor {MODEL_FILES[1]}: it is not a full FSDP checkpoint of a "
            f"full fine-tune (an older one held {LEGACY_MODEL_FILE} only beside them). Fix: resume from a checkpoint "
            "of this kind of run, or start fresh in a new output_dir.")
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # no "Loading weights" bar in the training log
    try:
        fresh = _model_class(model).from_pretrained(str(folder), config=model.config, dtype=_dtype(local),
                                                    attn_implementation="eager")
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
    stored = fresh.state_dict()
    missing = sorted(set(local) - set(stored))
    if missing:
        raise CheckpointError(
            f"{folder}'s safetensors do not hold {len(missing)} of the model's weights ({', '.join(missing[:4])}): "
            "it was written by another model or another hwrun. Fix: resume from a checkpoint of this run, or start "
            "fresh in a new output_dir.")
    return {name: stored[name] for name in local}


def _adapter_state(model: Any, folder: Path, local: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: the adapter's weights from `folder`/adapter_model.safetensors, under the FSDP model's names: each
    found by the name PEFT's get_peft_model_state_dict saves it under (the adapter name dropped)."""
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    file = folder / _ADAPTER_FILE
    if not file.is_file():
        raise CheckpointError(f"{folder} holds no {_ADAPTER_FILE}: it is not a checkpoint of a LoRA run. Fix: resume "
                              "from a checkpoint of this kind of run, or start fresh in a new output_dir.")
    stored = load_file(str(file))
    placeholders = {name: torch.empty(value.shape, dtype=value.dtype, device="meta") for name, value in local.items()}
    owner = {id(value): name for name, value in placeholders.items()}
    saved_as = get_peft_model_state_dict(model, state_dict=placeholders, adapter_name=model.active_adapter,
                                         save_embedding_layers=False)
    names = {owner[id(value)]: saved for saved, value in saved_as.items() if id(value) in owner}
    absent = sorted(saved for saved in names.values() if saved not in stored)
    wrong = sorted(saved for name, saved in names.items()
                   if saved in stored and tuple(stored[saved].shape) != tuple(placeholders[name].shape))
    if absent or wrong or not names:
        what = "; ".join(part for part in (
            f"missing {', '.join(absent[:4])}" if absent else "",
            f"other shapes {', '.join(wrong[:4])}" if wrong else "",
            "no trainable adapter weight in this model" if not names else "") if part)
        raise CheckpointError(f"{file} does not fit this run's adapter ({what}). Fix: resume with the LoRA settings "
                              "that wrote it (--lora-r, --lora-targets), or start fresh in a new output_dir.")
    extra = sorted(set(stored) - set(names.values()))
    if extra:  # e.g. embeddings PEFT saved beside the adapter: frozen here, so nothing of this run to restore
        logger.warning("%s holds %d tensor(s) that are no trainable weight of this run (%s); they are not loaded.",
                       file, len(extra), ", ".join(extra[:4]))
    return {name: stored[saved] for name, saved in names.items()}
