"""`hwrun train`'s progress on a terminal: one bar on stderr, with the `step N/M  loss X` lines printed above it.

Transformers' own progress callback prints each log as a Python dict under its bar (`{'loss': '5.401',
'grad_norm': ...}`); the CLI turns that callback off (`disable_tqdm=True`) and gives `train()` this one: the
loss lines come from `LossLog` through `write`, the bar counts optimizer steps. Without a terminal (a pipe, a
log file, `--no-progress`) there is no bar and the lines are plain prints.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from transformers import TrainerCallback


class StepBar(TrainerCallback):
    """A tqdm bar of optimizer steps on `file` (stderr) from the main process; `write(line)` prints above it."""

    def __init__(self, file: TextIO | None = None) -> None:
        self.file = file if file is not None else sys.stderr
        self.bar: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, unit="step", desc="training",
                            file=self.file, leave=False, dynamic_ncols=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def write(self, line: str) -> None:
        """Print `line` on stdout, above the bar when there is one."""
        if self.bar is None:
            print(line, flush=True)
        else:
            from tqdm.auto import tqdm

            tqdm.write(line, file=sys.stdout)
            sys.stdout.flush()
