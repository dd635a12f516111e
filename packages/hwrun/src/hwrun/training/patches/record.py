"""The record that each of hwrun's training-time model patches returns: whether it applied, why
(or why not), and how to undo it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ModelPatch:
    """One explicit, reversible change to a model instance; `undo()` restores it (idempotent)."""

    applied: bool
    reason: str
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def undo(self) -> None:
        """Restore what the patch changed, newest change first; a second call does nothing."""
        while self._undo:
            self._undo.pop()()
