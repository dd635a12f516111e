"""The Trainer callbacks `hwrun train` adds beside `HwrunCallback` (callbacks.py, which makes its checkpoints atomic
from public hooks): `GracefulStop` (SIGTERM/SIGINT: save and stop) and `LossLog` (the CLI's loss lines)."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from .signals import SignalStop


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
