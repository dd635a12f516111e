"""`HwTrainer`: Transformers' `Trainer` whose checkpoints are atomic (staging folder, fsync,
manifest, rename), plus the callbacks that make SIGTERM/SIGINT save and stop cleanly."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import rotate_checkpoints

from .checkpoints import as_os_error, publish, staging_folder, write_failed, write_manifest
from .signals import SignalStop

logger = logging.getLogger(__name__)


class HwTrainer(Trainer):
    """A `Trainer` that writes each checkpoint into `.staging-checkpoint-N/` first and renames it
    to `checkpoint-N` only once every file is fsynced and the manifest says complete."""

    _hw_staging: Path | None = None
    #: what kind of run this is ({"kind": "lora" | "qlora" | "full", "model": ...}), stamped into
    #: every checkpoint's manifest so that a resume by a different kind of run is refused
    hw_run: dict | None = None

    def _get_output_dir(self, trial: Any) -> str:
        if self._hw_staging is not None:
            return str(self._hw_staging)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        run_dir = Path(super()._get_output_dir(trial))
        step = self.state.global_step
        staging = staging_folder(run_dir, step)
        if self.args.should_save and staging.exists():
            logger.warning("Removing %s, left by an earlier save that did not finish.", staging)
            shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()
        self._hw_staging = staging
        try:
            # Writes model, optimizer, scheduler, RNG and trainer state into staging/checkpoint-N
            # (its own rotation then sees only that one folder).
            super()._save_checkpoint(model, trial)
        except Exception as error:  # disk full, read-only, I/O: the partial save goes, the last checkpoint stays
            failed = as_os_error(error)
            if failed is None:
                raise
            raise write_failed(f"checkpoint-{step}", run_dir, failed, staging if self.args.should_save else None) \
                from error
        finally:
            self._hw_staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            staged = staging / f"checkpoint-{step}"
            final = run_dir / f"checkpoint-{step}"
            try:
                write_manifest(staged, step, self.hw_run)
                publish(staged, final)
            except Exception as error:
                failed = as_os_error(error)
                if failed is None:
                    raise
                raise write_failed(f"checkpoint-{step}", run_dir, failed, staging) from error
            shutil.rmtree(staging, ignore_errors=True)
            if self.state.best_model_checkpoint and str(staging) in self.state.best_model_checkpoint:
                self.state.best_model_checkpoint = str(final)
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
            logger.info("Checkpoint %s written atomically.", final)
        self.accelerator.wait_for_everyone()


class GracefulStop(SignalStop, TrainerCallback):
    """On SIGTERM or SIGINT: finish the current step, save a checkpoint, stop training.
    A second signal restores the previous handler and re-raises it at once (hwrun.training.signals)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.received is not None:
            control.should_save = True
            control.should_training_stop = True
        return control


class LossLog(TrainerCallback):
    """Prints `step N/M  loss X  lr Y` lines (the CLI's loss logging) from the main process."""

    def __init__(self, echo: Any = None) -> None:
        self.echo = echo

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.echo is None or not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        lr = logs.get("learning_rate")
        lr_text = f"  lr {lr:.2e}" if isinstance(lr, float) else ""
        self.echo(f"step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}{lr_text}")
