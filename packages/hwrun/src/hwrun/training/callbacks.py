"""`HwrunCallback`: hwrun's training guards for your own `transformers.Trainer` or TRL `SFTTrainer`, through public
callback hooks only (no Trainer subclass, no private method).

    from hwrun.training.callbacks import HwrunCallback
    hw = HwrunCallback(plan=hwrun.plan())      # plan optional: checks the arguments against the device plan
    trainer = Trainer(model=..., args=..., train_dataset=..., callbacks=[hw])
    trainer.train(resume_from_checkpoint=hw.resume_from(args.output_dir))
    hw.raise_if_diverged()                     # NonFiniteLossError / TrainingDivergedError, as train() raises

What it does:
- atomic, checksummed checkpoints: when a step is about to be saved (`control.should_save` at `on_step_end`,
  `on_epoch_end` or `on_evaluate`), it points `args.output_dir` at `OUTPUT/.staging-checkpoint-N/` for that save;
  at `on_save` every file is fsynced, its size and sha256 written to `hwrun_checkpoint.json` last, the folder
  renamed to `OUTPUT/checkpoint-N` and `args.output_dir` restored. A save that dies half-way leaves only the
  staging folder, whose name neither `resume_from()` nor Transformers' `get_last_checkpoint` matches, and the next
  save of that step removes it; `save_total_limit` is applied to the published checkpoints;
- the non-finite / divergence guard of `train()` (hwrun.training.guard.NonFiniteGuard): the first NaN/inf or
  diverged loss, gradient norm or weight vetoes that step's save and stops training (`"skip"` drops the update of a
  step with non-finite gradients instead; `"ignore"` turns it off);
- SIGTERM / SIGINT (hwrun.training.trainer.GracefulStop): finish the step, save a checkpoint, stop (a second signal
  stops at once); the handlers are installed when training begins and restored when it ends (main thread only);
- the device plan (`plan=`, an `hwrun.plan()`): at `on_train_begin` the arguments' device and mixed precision are
  compared with the plan's (a CPU run of a plan for an accelerator, bf16 where the plan's device has none, a plan
  for bf16 trained without it are a TrainingConfigError or a warning naming both values), and the plan's device,
  dtype and attention are recorded in every checkpoint's manifest.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .checkpoints import (
    STAGING_PREFIX,
    as_os_error,
    latest_complete_checkpoint,
    publish,
    staging_folder,
    write_failed,
    write_manifest,
)
from .guard import NonFiniteGuard
from .trainer import GracefulStop

logger = logging.getLogger(__name__)


def _barrier() -> None:
    """Wait for every rank when a process group is up (the ranks write their shards into the staging folder)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class HwrunCallback(TrainerCallback):
    """hwrun's atomic checksummed checkpoints, non-finite/divergence guard, SIGTERM/SIGINT save and device-plan
    check for any Trainer.

    `on_nonfinite`: "stop" (default), "skip" or "ignore" (as `train(on_nonfinite=...)`); `signals=False` leaves the
    signal handlers alone; `manifests=False` neither stages nor checksums checkpoints; `check_weights=False` under
    FSDP/DeepSpeed (each rank holds a shard); `plan`: an `hwrun.plan()` the arguments are checked against."""

    def __init__(self, on_nonfinite: str = "stop", *, signals: bool = True, manifests: bool = True,
                 check_weights: bool = True, plan: Any = None) -> None:
        self.guard = NonFiniteGuard(on_nonfinite, check_weights=check_weights)
        self.stopper = GracefulStop() if signals else None
        self.manifests = manifests
        self.plan = plan
        self._installed = False
        self._run_dir: str | None = None  # args.output_dir while a save is pointed at its staging folder
        self._saving: Path | None = None  # the staging folder from _stage until its checkpoint is published
        #: checkpoint folders this callback published with a manifest
        self.stamped: list[Path] = []
        #: the plan's choices recorded in each manifest ({} without a plan)
        self.record: dict[str, Any] = {"kind": "callback"}

    @property
    def tripped(self) -> tuple[int, str, float] | None:
        """(step, what, value) once the guard stopped the run."""
        return self.guard.tripped

    @property
    def received(self) -> int | None:
        """The signal that stopped training, if one did."""
        return self.stopper.received if self.stopper is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.restore_output_dir(args)
        if self.plan is not None:
            from .device_check import check_arguments

            self.record.update(check_arguments(self.plan, args))
        self.guard.on_train_begin(args, state, control, **kwargs)
        if self.stopper is not None and not self._installed:
            self._installed = self.stopper.install()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stopper is not None:
            self.stopper.on_step_end(args, state, control, **kwargs)  # a signal: save and stop ...
        control = self.guard.on_step_end(args, state, control, **kwargs)  # ... unless the guard vetoes that save
        self._stage(args, state, control)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._stage(args, state, control)
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._stage(args, state, control)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        return self.guard.on_log(args, state, control, logs=logs, **kwargs)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self.guard.on_pre_optimizer_step(args, state, control, **kwargs)

    def _stage(self, args: Any, state: Any, control: Any) -> None:
        """A save is coming: point Trainer's output_dir at this step's staging folder (emptied first)."""
        if not self.manifests or not control.should_save or self._run_dir is not None:
            return
        staging = staging_folder(args.output_dir, state.global_step)
        if state.is_world_process_zero and staging.exists():
            logger.warning("Removing %s, left by an earlier save that did not finish.", staging)
            shutil.rmtree(staging)
        _barrier()  # no rank writes into the staging folder before rank 0 emptied it
        self._run_dir = args.output_dir
        self._saving = staging
        args.output_dir = str(staging)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self.manifests:
            return control
        run_dir, staged_into = self._run_dir, args.output_dir
        if run_dir is not None:
            args.output_dir, self._run_dir = run_dir, None
        _barrier()  # every rank's files are in place
        if not state.is_world_process_zero:
            self._saving = None
            _barrier()
            return control
        self._publish(args, state, run_dir, staged_into)
        self._saving = None  # published: a later error is not this save's
        return control

    def _publish(self, args: Any, state: Any, run_dir: str | None, staged_into: str) -> None:
        """Rank 0: stamp the staged checkpoint and rename it into place, then apply save_total_limit."""
        name = f"checkpoint-{state.global_step}"
        folder = Path(args.output_dir) / name
        try:
            if run_dir is not None and (Path(staged_into) / name).is_dir():
                write_manifest(Path(staged_into) / name, state.global_step, self.record)
                publish(Path(staged_into) / name, folder)
                shutil.rmtree(staged_into, ignore_errors=True)
                self._fix_best(state, staged_into, args.output_dir)
                self._rotate(args, state)
                logger.info("Checkpoint %s written atomically (sha256 of every file in its manifest).", folder)
            elif folder.is_dir():  # a save no hook announced (e.g. a callback after this one set should_save)
                write_manifest(folder, state.global_step, self.record)
                logger.warning("Checkpoint %s was written in place (no hook before the save announced it), then "
                               "stamped: it has checksums but was not renamed into place.", folder)
            else:
                logger.warning("on_save at step %d: no folder %s to stamp (a trial or custom output dir?); its files "
                               "have no checksums.", state.global_step, folder)
                return
            self.stamped.append(folder)
        finally:
            _barrier()  # the other ranks go on once the checkpoint is published

    @staticmethod
    def _fix_best(state: Any, staged_into: str, run_dir: str) -> None:
        best = getattr(state, "best_model_checkpoint", None)
        if best and best.startswith(staged_into):
            state.best_model_checkpoint = os.path.join(run_dir, Path(best).name)

    @staticmethod
    def _rotate(args: Any, state: Any) -> None:
        """`save_total_limit` over the published checkpoints (Trainer's own rotation saw only the staging folder)."""
        if not args.save_total_limit:
            return
        from transformers.trainer_utils import rotate_checkpoints

        rotate_checkpoints(output_dir=args.output_dir, save_total_limit=args.save_total_limit,
                           best_model_checkpoint=state.best_model_checkpoint, use_mtime=True)

    def save_failure(self, args: Any, error: BaseException) -> Exception | None:
        """After `error` came out of `trainer.train()`: when it broke off a checkpoint save on a write (disk full,
        read-only, I/O), the `CheckpointWriteError` naming the cause and the checkpoint kept, the partial save removed
        (by the saving process); None for any other error. Gives `args.output_dir` back either way."""
        staging, self._saving = self._saving, None
        self.restore_output_dir(args)
        failed = as_os_error(error) if staging is not None else None
        if failed is None:
            return None
        name = staging.name[len(STAGING_PREFIX):]
        return write_failed(name, Path(args.output_dir), failed, staging if args.should_save else None)

    def restore_output_dir(self, args: Any) -> None:
        """Give `args.output_dir` back if a save pointed it at a staging folder and never finished (an exception
        in Trainer's save: no hook runs after it). Called by `on_train_begin` and `on_train_end`."""
        if self._run_dir is not None:
            logger.warning("A checkpoint save into %s did not finish; output_dir is %s again.", args.output_dir,
                           self._run_dir)
            args.output_dir, self._run_dir = self._run_dir, None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._saving = None  # a staged save the guard vetoed
        self.restore_output_dir(args)  # a save was announced but never came (training stopped by another hook)
        if self.stopper is not None and self._installed:
            self.stopper.uninstall()
            self._installed = False
        return control

    @staticmethod
    def resume_from(output_dir: str | Path) -> str | None:
        """The newest checkpoint in `output_dir` whose manifest says complete and whose sha256s verify (newer ones
        that do not are skipped with a warning naming why), or None: pass it to `trainer.train(
        resume_from_checkpoint=...)`. Staging folders (`.staging-checkpoint-N`) are never candidates."""
        found = latest_complete_checkpoint(output_dir, verify=True)
        return str(found) if found is not None else None

    def raise_if_diverged(self) -> None:
        """After `trainer.train()`: raise `NonFiniteLossError` (NaN/inf) or `TrainingDivergedError` (a finite
        divergence) naming the step, the value and the rule, when the guard stopped the run."""
        error = self.guard.stop_error("HwrunCallback.resume_from(output_dir)")
        if error is not None:
            raise error


__all__ = ["HwrunCallback", "STAGING_PREFIX"]
