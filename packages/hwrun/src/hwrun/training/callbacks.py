"""`HwrunCallback`: hwrun's training guards for your own `transformers.Trainer` or TRL `SFTTrainer`, through public
callback hooks only (no Trainer subclass, no private method).

    from hwrun.training.callbacks import HwrunCallback
    hw = HwrunCallback()                       # on_nonfinite="stop", SIGTERM/SIGINT save, checkpoint manifests
    trainer = Trainer(model=..., args=..., train_dataset=..., callbacks=[hw])
    trainer.train(resume_from_checkpoint=hw.resume_from(args.output_dir))
    hw.raise_if_diverged()                     # NonFiniteLossError / TrainingDivergedError, as train() raises

What it does:
- the non-finite / divergence guard of `train()` (hwrun.training.guard.NonFiniteGuard): the first NaN/inf or
  diverged loss, gradient norm or weight vetoes that step's save and stops training (`"skip"` drops the update of a
  step with non-finite gradients instead; `"ignore"` turns it off);
- SIGTERM / SIGINT (hwrun.training.trainer.GracefulStop): finish the step, save a checkpoint, stop (a second signal
  stops at once); the handlers are installed when training begins and restored when it ends (main thread only);
- a manifest per checkpoint: after Trainer saved `checkpoint-N` (`on_save`), every file is fsynced and its size and
  sha256 written to `hwrun_checkpoint.json` last. A save that died half-way has no manifest, and a file changed
  after the save no longer matches, so `resume_from()` (hwrun's `latest_complete_checkpoint(verify=True)`) passes
  over both for the newest checkpoint that verifies. Unlike `hwrun train`'s own checkpoints this is not a rename
  into place (that needs Trainer's save path, a private method): the folder exists while Trainer writes it, and
  Transformers' own `resume_from_checkpoint=True` would take it, so resume through `resume_from()`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .checkpoints import latest_complete_checkpoint, write_manifest
from .guard import NonFiniteGuard
from .trainer import GracefulStop

logger = logging.getLogger(__name__)


class HwrunCallback(TrainerCallback):
    """hwrun's non-finite/divergence guard, SIGTERM/SIGINT save and checkpoint manifests for any Trainer.

    `on_nonfinite`: "stop" (default), "skip" or "ignore" (as `train(on_nonfinite=...)`); `signals=False` leaves the
    signal handlers alone; `manifests=False` writes no checksums; `check_weights=False` under FSDP/DeepSpeed (each
    rank holds a shard)."""

    def __init__(self, on_nonfinite: str = "stop", *, signals: bool = True, manifests: bool = True,
                 check_weights: bool = True) -> None:
        self.guard = NonFiniteGuard(on_nonfinite, check_weights=check_weights)
        self.stopper = GracefulStop() if signals else None
        self.manifests = manifests
        self._installed = False
        #: checkpoint folders this callback stamped with a manifest
        self.stamped: list[Path] = []

    @property
    def tripped(self) -> tuple[int, str, float] | None:
        """(step, what, value) once the guard stopped the run."""
        return self.guard.tripped

    @property
    def received(self) -> int | None:
        """The signal that stopped training, if one did."""
        return self.stopper.received if self.stopper is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.guard.on_train_begin(args, state, control, **kwargs)
        if self.stopper is not None and not self._installed:
            self._installed = self.stopper.install()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stopper is not None:
            self.stopper.on_step_end(args, state, control, **kwargs)  # a signal: save and stop ...
        return self.guard.on_step_end(args, state, control, **kwargs)  # ... unless the guard vetoes that save

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> Any:
        return self.guard.on_log(args, state, control, logs=logs, **kwargs)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self.guard.on_pre_optimizer_step(args, state, control, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self.manifests or not state.is_world_process_zero:
            return control
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            write_manifest(folder, state.global_step, {"kind": "callback"})
            self.stamped.append(folder)
            logger.info("Checkpoint %s: sizes and sha256 of every file written to its manifest.", folder)
        else:
            logger.warning("on_save at step %d: no folder %s to stamp (a trial or custom output dir?); its files "
                           "have no checksums.", state.global_step, folder)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stopper is not None and self._installed:
            self.stopper.uninstall()
            self._installed = False
        return control

    @staticmethod
    def resume_from(output_dir: str | Path) -> str | None:
        """The newest checkpoint in `output_dir` whose manifest says complete and whose sha256s verify (newer ones
        that do not are skipped with a warning naming why), or None: pass it to `trainer.train(
        resume_from_checkpoint=...)`."""
        found = latest_complete_checkpoint(output_dir, verify=True)
        return str(found) if found is not None else None

    def raise_if_diverged(self) -> None:
        """After `trainer.train()`: raise `NonFiniteLossError` (NaN/inf) or `TrainingDivergedError` (a finite
        divergence) naming the step, the value and the rule, when the guard stopped the run."""
        from ..errors import NonFiniteLossError, TrainingDivergedError

        if self.guard.tripped is None:
            return
        step, what, value = self.guard.tripped
        if self.guard.diverged:
            raise TrainingDivergedError(f"Training stopped at step {step}: {what} is {value:.4g} ({self.guard.rule}); "
                                        "nothing was saved after it. Fix: a lower learning rate, then resume from "
                                        "HwrunCallback.resume_from(output_dir).")
        raise NonFiniteLossError(f"Training stopped at step {step}: {what} is {value} (not finite); nothing was saved "
                                 "after it. Fix: a lower learning rate, then resume from "
                                 "HwrunCallback.resume_from(output_dir), or on_nonfinite='skip'.")
