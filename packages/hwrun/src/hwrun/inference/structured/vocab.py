"""What the grammar engines need to know about a tokenizer, read once per engine: the model's vocabulary size (the
logits width, which may exceed the tokenizer's: padded ids are never allowed), the special ids (never allowed inside
the text) and the stop ids (allowed only once the grammar is complete)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GenerateError


@dataclass(frozen=True)
class VocabInfo:
    """A tokenizer's ids as the grammar engines see them: `vocab_size` is the model's logits width,
    `tokenizer_size` the ids the tokenizer defines (ids from there up to `vocab_size` are padding)."""

    vocab_size: int
    tokenizer_size: int
    stop_token_ids: tuple[int, ...]
    special_token_ids: frozenset[int]


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def vocab_info(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int] | None = None) -> VocabInfo:
    """Read `tokenizer` (a Transformers fast tokenizer) for a model whose logits are `vocab_size` wide.
    Stop ids default to the tokenizer's `eos_token_id`."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise GenerateError(f"vocab_size={vocab_size!r} must be an integer >= 1: the model's logits width "
                            "(config.vocab_size).")
    if not hasattr(tokenizer, "get_vocab") or not hasattr(tokenizer, "backend_tokenizer"):
        raise GenerateError(f"structured output needs a Transformers fast tokenizer (with `backend_tokenizer`); got "
                            f"{type(tokenizer).__name__}. Load it with AutoTokenizer.from_pretrained(..., use_fast=True).")
    vocab = tokenizer.get_vocab()
    tokenizer_size = max(vocab.values()) + 1
    if tokenizer_size > vocab_size:
        raise GenerateError(f"the tokenizer defines ids up to {tokenizer_size - 1}, beyond the model's vocab_size="
                            f"{vocab_size}: pass the model's config.vocab_size, and a tokenizer made for this model.")
    stops = _ids(stop_token_ids) if stop_token_ids is not None else _ids(getattr(tokenizer, "eos_token_id", None))
    if not stops:
        raise GenerateError("the tokenizer has no eos_token_id, so a finished grammar has no token to stop on: "
                            "pass stop_token_ids (e.g. from the model's generation_config.json).")
    bad = [i for i in stops if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < tokenizer_size]
    if bad:
        raise GenerateError(f"stop_token_ids {bad} are not ids of the tokenizer (0..{tokenizer_size - 1}).")
    special = set(getattr(tokenizer, "all_special_ids", ()))
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special.update(i for i, token in decoder.items() if getattr(token, "special", False))
    return VocabInfo(vocab_size, tokenizer_size, tuple(dict.fromkeys(stops)), frozenset(special))
