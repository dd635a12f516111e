"""One request's grammar state: `fill` writes which tokens may come next into a bitmask row, `accept` moves on by
the sampled token, `finished` says the text is complete. The same surface over every grammar engine."""

from __future__ import annotations

from typing import Any

from ...errors import GenerateError
from .bitmask import bitmask_words
from .vocab import VocabInfo


class Matcher:
    """A request's grammar state. After a rejected token (`accept` returned False) the matcher has `failed`; after it or
    a stop id, `fill` allows only the stop ids, so the request ends; it never moves again. Subclasses wrap one engine's
    matcher."""

    def __init__(self, vocab: VocabInfo, stop_row: Any) -> None:
        self.vocab = vocab
        self._stop_row = stop_row  # int32 [words]: only the stop ids set (shared, read-only)
        self._scratch: Any = None
        self._finished: bool | None = None
        self.failed = False

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The ids that end the request once the grammar is complete (the tokenizer's eos unless the engine said)."""
        return self.vocab.stop_token_ids

    def fill(self, bitmask: Any, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (a CPU int32 [rows, ceil(vocab/32)] tensor)."""
        self.check_bitmask(bitmask, row)
        if self.stopped:
            bitmask[row].copy_(self._stop_row)
        else:
            self._fill(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Move the grammar on by `token_id`; False when the grammar does not allow it (the matcher has then failed)."""
        if self.failed:
            return False
        ok = 0 <= token_id < self.vocab.vocab_size and self._accept(int(token_id))
        self._finished = None
        self.failed = not ok
        return ok

    @property
    def stopped(self) -> bool:
        """True when the grammar cannot move on (it failed, or took a stop id): `fill` then allows only the stop ids."""
        return self.failed or self._terminated()

    @property
    def finished(self) -> bool:
        """True once the text is complete: a stop id was accepted, or the grammar allows nothing but a stop id next
        (the request can end with finish_reason "stop")."""
        if self.failed:
            return False
        if self._finished is None:
            self._finished = self._terminated() or (self._accepting() and self._only_stop_next())
        return self._finished

    def _only_stop_next(self) -> bool:
        import torch

        if self._scratch is None:
            self._scratch = torch.empty((1, bitmask_words(self.vocab.vocab_size)), dtype=torch.int32)
        self._fill(self._scratch, 0)
        return not bool((self._scratch[0] & ~self._stop_row).any())

    def check_bitmask(self, bitmask: Any, row: int) -> None:
        """Raise `GenerateError` unless `bitmask[row]` is a row this matcher can fill."""
        import torch

        words = bitmask_words(self.vocab.vocab_size)
        if (bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[1] != words or not bitmask.is_cpu
                or not bitmask.is_contiguous()):
            raise GenerateError(f"the grammar engine fills a contiguous CPU int32 bitmask [rows, {words}] "
                                f"(allocate_bitmask(rows, {self.vocab.vocab_size})); got {tuple(bitmask.shape)} "
                                f"{bitmask.dtype} on {bitmask.device}.")
        if not 0 <= row < bitmask.shape[0]:
            raise GenerateError(f"bitmask row={row} is outside the bitmask's {bitmask.shape[0]} rows.")

    # One grammar engine's matcher behind these five.
    def _fill(self, bitmask: Any, row: int) -> None:
        raise NotImplementedError

    def _accept(self, token_id: int) -> bool:
        raise NotImplementedError

    def _terminated(self) -> bool:
        raise NotImplementedError

    def _accepting(self) -> bool:
        raise NotImplementedError
