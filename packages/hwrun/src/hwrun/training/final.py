"""The save phase of `train()`: the final model (full, LoRA adapter, or merged) written into a staging folder,
published into output_dir with one rename per file, and recorded as hwrun's own in `hwrun_output.json`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import output
from .sharding import zero3_suspended

if TYPE_CHECKING:
    from hwrun.model.plan import RunPlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinalSave:
    """How a final save went: merged or not, and the entries left out because a user's file holds the name."""

    merged: bool
    kept: tuple[str, ...] = ()


def retie_gathered(state_dict: dict[str, Any], model: Any) -> None:
    """Gathering FSDP shards copies every parameter, so weights the model ties (lm_head = embed_tokens)
    come back as separate tensors; save_pretrained finds ties by shared storage and would then write
    both. Point each alias at one tensor again, so the saved model is what a single-process run saves."""
    first: dict[int, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in state_dict:
            primary = first.setdefault(id(parameter), name)
            if primary != name:
                state_dict[name] = state_dict[primary]


def save_final(trainer: Any, tokenizer: Any, found: output.OutputSurvey, is_lora: bool, merge: bool, qlora: bool,
               plan: RunPlan, zero3: bool, run: dict) -> FinalSave:
    """Save the final model into `found.path` (main process only): never over a file hwrun did not write. A write
    that fails (disk full, read-only, I/O) removes the partial save and raises CheckpointWriteError."""
    from .checkpoints import final_staging

    output_dir = found.path
    trainer.accelerator.wait_for_everyone()
    # Under FSDP (DTensors) and DeepSpeed ZeRO-3 (partitioned parameters) every rank holds shards:
    # gather the full state dict first (a collective, so on all ranks; rank 0 gets it). Merging needs
    # whole weights, so there it goes through a saved adapter, as for QLoRA.
    sharded = bool(getattr(trainer, "is_fsdp_enabled", False)) or zero3
    engine = trainer.deepspeed if getattr(trainer, "is_deepspeed_enabled", False) else trainer.model
    state_dict = trainer.accelerator.get_state_dict(engine) if sharded else None
    merged, kept = False, ()
    if trainer.is_world_process_zero():
        model = trainer.accelerator.unwrap_model(trainer.model)
        if state_dict:
            retie_gathered(state_dict, model)
        # written into output_dir/.staging-final first and moved into place only when complete,
        # so a failure mid-save leaves output_dir (a resumed run's earlier final model) as it was
        staging = final_staging(output_dir)
        try:
            merged, kept = _write_final(trainer, model, tokenizer, staging, found, is_lora, merge, qlora, sharded, plan,
                                        state_dict, run)
        except Exception as error:  # disk full, read-only, I/O: the partial save goes, the checkpoints stay
            from .checkpoints import as_os_error, write_failed

            failed = as_os_error(error)
            if failed is None:
                raise
            raise write_failed("the final model", output_dir, failed, staging) from error
        logger.info("Final %s saved to %s", "merged model" if merged else
                    ("adapter" if is_lora else "model"), output_dir)
    trainer.accelerator.wait_for_everyone()
    return FinalSave(merged or (merge and is_lora), kept)


def _write_final(trainer: Any, model: Any, tokenizer: Any, staging: Any, found: output.OutputSurvey, is_lora: bool,
                 merge: bool, qlora: bool, sharded: bool, plan: RunPlan, state_dict: Any, run: dict
                 ) -> tuple[bool, tuple[str, ...]]:
    """Write the final model into `staging`, publish it into output_dir and record it: (merged, kept)."""
    from ..model.adapters import save_adapter, save_merged
    from ..model.load import merge_adapter_folder
    from .checkpoints import publish_final

    output_dir, merged = found.path, False
    if not is_lora:
        model.save_pretrained(staging, safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(staging)
    elif not merge:
        save_adapter(model, tokenizer, staging, state_dict=state_dict)
    elif qlora or sharded:
        adapter_dir = staging / "adapter"
        save_adapter(model, tokenizer, adapter_dir, state_dict=state_dict)
        with zero3_suspended():  # rank 0 alone loads the whole base to merge into
            merge_adapter_folder(adapter_dir, staging, plan)
        merged = True
    else:
        save_merged(model, tokenizer, staging)
        merged = True
    published = publish_final(staging, output_dir, may_replace=found.may_replace)
    output.record(output_dir, hashed=published.files,
                  final={"step": trainer.state.global_step, "run": dict(run), "files": sorted(published.files)})
    return merged, published.kept


def write_plot(points: list, found: output.OutputSurvey, title: str, evals: list = ()) -> tuple[str | None, str | None]:
    """The loss plot (training loss, and the eval loss when there is one) into output_dir/loss.png unless a user's
    file holds that name: (path, reason it was not)."""
    from .plot import write_loss_plot

    if not found.may_replace("loss.png"):
        return None, f"loss.png in {found.path} is not hwrun's; the plot was not written"
    path = write_loss_plot(points, found.path / "loss.png", title=title, eval_points=evals)
    output.record(found.path, ["loss.png"])
    return str(path), None
