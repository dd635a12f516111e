"""Messages from libraries that are not about the user's command, filtered narrowly where they are emitted.

Each filter names one logger or one warning category and the text of one message, with the reason it is
dropped; nothing else from those libraries is hidden. `library_noise_filtered()` installs them for one command
and removes them afterwards (`main()` also runs in-process: tests, `python -m`); `hwrun -v` installs none.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

#: DeepSpeed guesses its own accelerator when it is imported (Transformers imports it wherever it is installed,
#: e.g. with `transformers.generation`) and logs this on a host without CUDA. hwrun's plan has already said which
#: device runs and why, so on a planned host (CPU) run the line is noise; on an accelerator it is kept (there
#: DeepSpeed not finding the device may matter).
DEEPSPEED_LOGGER, DEEPSPEED_CPU_GUESS = "DeepSpeed", "Setting accelerator to CPU. If you have GPU or other accelerator"
#: torchao (imported by Transformers' quantizer table) registers two enums with torch's pytree, which torch 2.15
#: logs as deprecated: torchao's call, nothing the user or hwrun can change.
PYTREE_LOGGER, PYTREE_ENUM = "torch.utils._pytree", "is an Enum subclass and is now natively supported by torch.compile"
#: PEFT reads `model.is_gradient_checkpointing` when it wraps or loads an adapter (peft_model.py, PEFT 0.21), which
#: Transformers 5.25 renamed `is_activation_checkpointing`: PEFT's call, not hwrun's or the user's.
GRADIENT_CHECKPOINTING_RENAME = r"`is_gradient_checkpointing` is deprecated"


class _HostPlanned:
    """Whether this command planned a host (non-accelerator) run: set by `note_plan`, read by the DeepSpeed filter."""

    host = False


def note_plan(run_plan) -> None:
    """Tell the filters where the command runs (called right after planning, before anything imports DeepSpeed)."""
    _HostPlanned.host = not run_plan.accelerator.platform.is_accelerator


class _DropMessage(logging.Filter):
    """Drops the records of one logger whose message contains `text` (and, with `host_only`, only on a host run)."""

    def __init__(self, text: str, host_only: bool = False) -> None:
        super().__init__()
        self.text, self.host_only = text, host_only

    def filter(self, record: logging.LogRecord) -> bool:
        if self.host_only and not _HostPlanned.host:
            return True
        return self.text not in record.getMessage()


@contextlib.contextmanager
def library_noise_filtered(enabled: bool = True) -> Iterator[None]:
    """The filters above, for the duration of the block (none when `enabled` is False: `hwrun -v`)."""
    if not enabled:
        yield
        return
    filters = [(logging.getLogger(DEEPSPEED_LOGGER), _DropMessage(DEEPSPEED_CPU_GUESS, host_only=True)),
               (logging.getLogger(PYTREE_LOGGER), _DropMessage(PYTREE_ENUM))]
    for logger, dropped in filters:
        logger.addFilter(dropped)
    previous = _HostPlanned.host
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=GRADIENT_CHECKPOINTING_RENAME, category=FutureWarning)
            yield
    finally:
        _HostPlanned.host = previous
        for logger, dropped in filters:
            logger.removeFilter(dropped)
