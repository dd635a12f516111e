"""`hwrun train`'s progress on a terminal: one bar on stderr, with the `step N/M  loss X` lines printed above it.

Transformers' own progress callback prints each log as a Python dict under its bar (`{'loss': '5.401',
'grad_norm': ...}`); the CLI turns that callback off (`disable_tqdm=True`) and gives `train()` this one: the
loss lines come from `LossLog` through `write`, the bar counts optimizer steps and shows the elapsed time, the ETA
(tqdm's, from the step rate so far) and the tokens trained per second (the packed block tokens of one optimizer
step over all processes, times the step rate). Without a terminal (a pipe, a log file, `--no-progress`, `--quiet`)
there is no bar and the lines are plain prints.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from transformers import TrainerCallback


class StepBar(TrainerCallback):
    """A tqdm bar of optimizer steps on `file` (stderr) from the main process; `write(line)` prints above it."""

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}{postfix}]"

    def __init__(self, file: TextIO | None = None) -> None:
        self.file = file if file is not None else sys.stderr
        self.bar: Any = None
        self.tokens_per_step = 0
        self._start: tuple[float, int] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.bar is None:
            from tqdm.auto import tqdm

            self.tokens_per_step = tokens_per_step(args, kwargs.get("train_dataloader"))
            self._start = (time.monotonic(), state.global_step)
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, unit="step", desc="training",
                            file=self.file, leave=False, dynamic_ncols=True, bar_format=self.BAR_FORMAT)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)
            rate = self.tokens_per_second(state.global_step)
            if rate is not None:
                self.bar.set_postfix_str(f"{rate:,.0f} tokens/s", refresh=True)

    def tokens_per_second(self, step: int, now: float | None = None) -> float | None:
        """Tokens trained per second since training (or the resume) began, or None before a step or without
        packed data."""
        if self._start is None or not self.tokens_per_step:
            return None
        seconds = (time.monotonic() if now is None else now) - self._start[0]
        steps = step - self._start[1]
        return steps * self.tokens_per_step / seconds if seconds > 0 and steps > 0 else None

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


def tokens_per_step(args: Any, dataloader: Any) -> int:
    """Tokens one optimizer step trains on: block length x batch size x gradient accumulation x processes, from
    hwrun's packed blocks (0 when the data is not hwrun's)."""
    blocks = getattr(getattr(dataloader, "dataset", None), "blocks", None)
    if blocks is None or getattr(blocks, "ndim", 0) != 2:
        return 0
    return (int(blocks.shape[1]) * args.per_device_train_batch_size * args.gradient_accumulation_steps
            * max(1, args.world_size))
