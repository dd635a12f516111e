"""Bounds on generation, checked before any work (issue 27 point 5): a ceiling on `max_new_tokens` the
user can set, and the model's context (`max_position_embeddings`) for the prompt and prompt + new tokens.

Why: `max_new_tokens=100000000` ran until killed, and generating past the model's context (or from a
prompt longer than it) ran silently. Each error names the numbers, the rule and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import GenerateError

#: The default ceiling on `max_new_tokens` per prompt (overridden by `max_new_tokens_limit=` or the variable).
MAX_NEW_TOKENS_LIMIT = 32768
#: The environment variable that sets the ceiling when `max_new_tokens_limit` is not given.
LIMIT_VARIABLE = "HWRUN_MAX_NEW_TOKENS_LIMIT"
#: config.json keys that hold the number of positions a model was built for (GPT-2 spells it n_positions).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions")


def new_tokens_limit(limit: Any = None, environ: Mapping[str, str] | None = None) -> int:
    """The ceiling on `max_new_tokens`: `limit` if given, else `HWRUN_MAX_NEW_TOKENS_LIMIT`, else 32768."""
    environ = os.environ if environ is None else environ
    if limit is None:
        text = environ.get(LIMIT_VARIABLE, "").strip()
        if not text:
            return MAX_NEW_TOKENS_LIMIT
        try:
            limit = int(text)
        except ValueError:
            raise GenerateError(f"{LIMIT_VARIABLE}={text!r} is not an integer; set it to a positive number of "
                                f"tokens (default {MAX_NEW_TOKENS_LIMIT}) or unset it.") from None
        where = LIMIT_VARIABLE
    else:
        where = "max_new_tokens_limit"
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise GenerateError(f"{where}={limit!r} must be a positive integer (default {MAX_NEW_TOKENS_LIMIT}).")
    return limit


def check_new_tokens(max_new_tokens: int, limit: int) -> None:
    """Refuse `max_new_tokens` above the ceiling."""
    if max_new_tokens > limit:
        raise GenerateError(f"max_new_tokens={max_new_tokens} exceeds the limit of {limit} new tokens per prompt; "
                            f"pass max_new_tokens_limit= (or set {LIMIT_VARIABLE}) higher if you mean it.")


def context_length(config: Any) -> int | None:
    """Positions the model was built for, from a Transformers config or a config.json dict (its text
    config for multimodal models); None when it names none (e.g. ALiBi models such as Bloom)."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        text = config.get("text_config")
        for source in (text if isinstance(text, Mapping) else {}, config):
            for key in CONTEXT_KEYS:
                value = source.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_context(max_new_tokens: int, context: int | None, prompt_lengths: Sequence[int] = ()) -> None:
    """Refuse a prompt longer than the model's context, or prompt + `max_new_tokens` beyond it (with no
    prompt lengths yet: `max_new_tokens` alone, as every prompt has at least one token)."""
    if context is None:
        return
    if not prompt_lengths and max_new_tokens >= context:
        raise GenerateError(f"max_new_tokens={max_new_tokens} does not fit the model's context of {context} positions "
                            f"(max_position_embeddings) with even a one-token prompt; use at most {context - 1}.")
    for index, length in enumerate(prompt_lengths):
        if length > context:
            raise GenerateError(f"prompt {index} has {length} tokens, more than the model's context of {context} "
                                "positions (max_position_embeddings); shorten the prompt or use a model with a "
                                "longer context.")
        if length + max_new_tokens > context:
            raise GenerateError(f"prompt {index}: {length} tokens + max_new_tokens {max_new_tokens} = "
                                f"{length + max_new_tokens} exceeds the model's context of {context} positions "
                                f"(max_position_embeddings); use max_new_tokens <= {context - length} or a "
                                "shorter prompt.")
