"""`HwrunAccelerateGuard`: hwrun's training guards for your own Accelerate loop (no Trainer): atomic, checksummed
`accelerator.save_state()` checkpoints, resume from the newest complete one, the non-finite/divergence guard, the
SIGTERM/SIGINT save and the device-plan check.

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    hw = HwrunAccelerateGuard(accelerator, "out", model=model, checkpointing_steps=100, total_limit=2, plan=plan)
    step = hw.load_state()                  # the newest checkpoint that verifies (0: a fresh start)
    with hw:                                # SIGTERM/SIGINT: save at the next step boundary, then stop
        for batch in accelerator.skip_first_batches(loader, step):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if hw.step_end(step, loss):     # checks the loss (NonFiniteLossError...), saves when due; True: stop
                break
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import CheckpointError, TrainingConfigError
from .checkpoints import (
    as_os_error,
    checkpoint_run,
    checkpoint_step,
    choose_resume,
    is_refused_pickle,
    publish,
    refused_pickle,
    staging_folder,
    write_failed,
    write_manifest,
)
from .signals import SignalStop

logger = logging.getLogger(__name__)

#: what the manifests of these checkpoints record as the kind of run (hwrun train writes lora/qlora/full)
KIND = "accelerate"
_WRITERS = {"callback": "a Trainer with HwrunCallback"}


def _control(save: bool = False) -> SimpleNamespace:
    """The fields of Transformers' TrainerControl that NonFiniteGuard reads and sets."""
    return SimpleNamespace(should_save=save, should_training_stop=False, should_log=False)


def _positive(name: str, value: int | None) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise TrainingConfigError(f"{name}={value!r} must be a whole number of at least 1, or None (off).")


class HwrunAccelerateGuard:
    """hwrun's atomic checksummed checkpoints, non-finite/divergence guard, SIGTERM/SIGINT save and device-plan check
    for a training loop you write with `accelerate.Accelerator`.

    `model`: the prepared model (its weights are checked before each save; None: the loss and gradient norm only);
    `checkpointing_steps`: `step_end` saves every that many steps (None: only on a signal or your own `save_state`);
    `total_limit`: published checkpoints kept (the newest ones); `on_nonfinite`: "stop" (default), "skip" (call
    `skip_nonfinite_gradients` before `optimizer.step()`) or "ignore"; `signals=False` leaves SIGTERM/SIGINT alone;
    `check_weights=False` under FSDP/DeepSpeed (each process holds a shard); `plan`: an `hwrun.plan()` the
    Accelerator's device and mixed precision are checked against."""

    def __init__(self, accelerator: Any, output_dir: str | os.PathLike, *, model: Any = None,
                 checkpointing_steps: int | None = None, total_limit: int | None = None, on_nonfinite: str = "stop",
                 signals: bool = True, check_weights: bool = True, plan: Any = None) -> None:
        from .guard import NonFiniteGuard

        if getattr(accelerator.project_configuration, "automatic_checkpoint_naming", False):
            raise TrainingConfigError(
                "The Accelerator has ProjectConfiguration(automatic_checkpoint_naming=True), which makes "
                "save_state() write into project_dir/checkpoints whatever folder it is given, so hwrun could not stage "
                "and publish it. Fix: leave automatic_checkpoint_naming off; HwrunAccelerateGuard names the "
                "checkpoints (checkpoint-N) and keeps total_limit of them.")
        self.accelerator = accelerator
        self.output_dir = Path(output_dir)
        self.model = model
        self.checkpointing_steps = _positive("checkpointing_steps", checkpointing_steps)
        self.total_limit = _positive("total_limit", total_limit)
        self.guard = NonFiniteGuard(on_nonfinite, check_weights=check_weights)
        self.stopper = SignalStop() if signals else None
        #: what every manifest records about the run (the plan's choices with `plan=`)
        self.record: dict[str, Any] = {"kind": KIND}
        if plan is not None:
            from .device_check import check_accelerator

            self.record.update(check_accelerator(plan, accelerator))
        #: checkpoint folders published by this guard, in order
        self.saved: list[Path] = []
        #: the checkpoint `load_state` loaded (None: a fresh start)
        self.resumed_from: str | None = None
        self._args = SimpleNamespace(fp16=str(accelerator.mixed_precision) == "fp16")
        self._begin()

    def _unwrapped(self) -> Any:
        return self.accelerator.unwrap_model(self.model) if self.model is not None else None

    def _begin(self) -> None:
        """The guard's references: the vocabulary size and the largest trainable weight now."""
        self.guard.on_train_begin(self._args, SimpleNamespace(global_step=0), _control(), model=self._unwrapped())

    # -- signals -------------------------------------------------------------------------------------------------

    @property
    def received(self) -> int | None:
        """The signal that asked the loop to stop, if one did (this process)."""
        return self.stopper.received if self.stopper is not None else None

    def install_signals(self) -> bool:
        """Make SIGTERM/SIGINT save at the next `step_end` and stop; idempotent, main thread only (False elsewhere,
        or with signals=False)."""
        return self.stopper.install() if self.stopper is not None else False

    def restore_signals(self) -> None:
        """Put back the handlers found by `install_signals` (idempotent)."""
        if self.stopper is not None:
            self.stopper.uninstall()

    def __enter__(self) -> HwrunAccelerateGuard:
        self.install_signals()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore_signals()

    # -- each step -----------------------------------------------------------------------------------------------

    def step_end(self, step: int, loss: Any, grad_norm: Any = None) -> bool:
        """After optimizer step `step` (1, 2, ...): `check` its loss and gradient norm, then save `checkpoint-<step>`
        when `checkpointing_steps` says so or a signal came. True: a signal came, stop the loop (it was saved)."""
        stop = self.check(step, loss, grad_norm)
        if stop or (self.checkpointing_steps and step % self.checkpointing_steps == 0):
            self.save_state(step)
        return stop

    def check(self, step: int, loss: Any, grad_norm: Any = None) -> bool:
        """Raise `NonFiniteLossError` / `TrainingDivergedError` (as `hwrun.training.train` does) when the loss (the
        mean over processes) or the gradient norm is not finite or has diverged; True when a signal came to any
        process. One host sync per call; under several processes one collective."""
        loss_value, signalled = self._agree(loss)
        logs = {"loss": loss_value}
        if grad_norm is not None:
            logs["grad_norm"] = float(grad_norm)
        self.guard.on_log(self._args, SimpleNamespace(global_step=step), _control(), logs=logs)
        self._raise_if_tripped()
        return signalled

    def _agree(self, loss: Any) -> tuple[float, bool]:
        """(the loss averaged over processes, whether a signal came to any of them)."""
        received = self.received is not None
        if self.accelerator.num_processes <= 1:
            return float(loss), received
        import torch

        device = self.accelerator.device
        value = loss.detach().float().reshape(()) if torch.is_tensor(loss) else torch.tensor(float(loss))
        both = torch.stack([value.to(device), torch.tensor(float(received), device=device)])
        both = self.accelerator.reduce(both, reduction="sum")
        return float(both[0]) / self.accelerator.num_processes, bool(both[1] > 0)

    def skip_nonfinite_gradients(self, step: int) -> bool:
        """on_nonfinite="skip": call between `accelerator.backward` and `optimizer.step()` of step `step`; when any
        gradient is NaN/inf all are dropped, so that step changes no weight. True when it dropped them."""
        before = len(self.guard.skipped)
        self.guard.on_pre_optimizer_step(self._args, SimpleNamespace(global_step=step - 1), _control(),
                                         model=self._unwrapped())
        return len(self.guard.skipped) > before

    def _raise_if_tripped(self) -> None:
        error = self.guard.stop_error(f"the newest checkpoint in {self.output_dir} (HwrunAccelerateGuard.load_state())")
        if error is not None:
            raise error

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def save_state(self, step: int) -> Path:
        """`accelerator.save_state()` into `OUTPUT/.staging-checkpoint-<step>`, then every file fsynced and hashed
        into its manifest and the folder renamed to `OUTPUT/checkpoint-<step>`; `total_limit` applied. The weights
        are checked first (a NaN or diverged weight raises, nothing is written). Call it on every process."""
        if self.model is not None:
            self.guard.on_step_end(self._args, SimpleNamespace(global_step=step), _control(save=True),
                                   model=self._unwrapped())
            self._raise_if_tripped()
        accelerator = self.accelerator
        staging = staging_folder(self.output_dir, step)
        if accelerator.is_main_process and staging.exists():
            logger.warning("Removing %s, left by an earlier save that did not finish.", staging)
            shutil.rmtree(staging)
        accelerator.wait_for_everyone()  # no process writes into the staging folder before it was emptied
        failure: Exception | None = None
        try:
            accelerator.save_state(str(staging))
        except Exception as error:  # noqa: BLE001 - raised below, after the barriers every process passes
            failure = error
        accelerator.wait_for_everyone()  # every process's files are in place
        final = self.output_dir / f"checkpoint-{step}"
        if failure is None and accelerator.is_main_process:
            try:
                write_manifest(staging, step, self.record)
                publish(staging, final)
                self._rotate()
            except Exception as error:  # noqa: BLE001
                failure = error
        accelerator.wait_for_everyone()  # the other processes go on once the checkpoint is published
        if failure is not None:
            self._raise_save_failure(step, staging, failure)
        self.saved.append(final)
        logger.info("Checkpoint %s written atomically (sha256 of every file in its manifest).", final)
        return final

    def _raise_save_failure(self, step: int, staging: Path, failure: Exception) -> None:
        """A failed write (disk full, read-only, I/O) is a CheckpointWriteError and its partial save is removed; any
        other error is raised as it is (its staging folder stays, never picked, removed by the next save of step)."""
        failed = as_os_error(failure)
        if failed is None:
            raise failure
        partial = staging if self.accelerator.is_main_process else None
        raise write_failed(f"checkpoint-{step}", self.output_dir, failed, partial) from failure

    def _rotate(self) -> None:
        """Keep the `total_limit` newest published checkpoints (Transformers' rotation: the newest is never removed)."""
        if not self.total_limit:
            return
        from transformers.trainer_utils import rotate_checkpoints

        rotate_checkpoints(output_dir=str(self.output_dir), save_total_limit=self.total_limit, use_mtime=True)

    def load_state(self, resume: bool | str | os.PathLike | None = "auto") -> int:
        """`accelerator.load_state()` from the checkpoint `resume` names (as `train(resume=...)`: "auto" the newest
        whose sha256s verify, passing over newer ones that do not, or none; True: one must exist; a path: that one;
        False: none) and return its step (0: a fresh start). Half-written saves are never candidates."""
        choice = choose_resume(resume, self.output_dir)
        if choice.folder is None:
            return 0
        folder = Path(choice.folder)
        kind = checkpoint_run(folder).get("kind")
        if kind not in (None, KIND):
            writer = _WRITERS.get(kind, f"hwrun train ({kind})")
            raise CheckpointError(
                f"{folder} was written by {writer}, not by accelerator.save_state(), so Accelerate cannot load it. "
                "Fix: resume it with what wrote it, or give HwrunAccelerateGuard another output_dir.")
        try:
            self.accelerator.load_state(str(folder))
        except Exception as error:
            if not is_refused_pickle(error):
                raise
            raise refused_pickle(folder, error) from None
        self.resumed_from = str(folder)
        self._begin()
        return checkpoint_step(folder) or 0


__all__ = ["HwrunAccelerateGuard"]
