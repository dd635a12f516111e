"""One request's state in the engine (its prompt, budget, stop ids, sampling, slot and progress), the event a step
reports for it, and how a request's stop ids are read (`eos_ids`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..decode.sampling import SamplingParams

#: The sampling of a request that names none: greedy (the argmax).
GREEDY = SamplingParams()


@dataclass(frozen=True)
class TokenEvent:
    """One new token of one request: `finish_reason` is "stop" (an EOS id, included), "length"
    (its `max_new_tokens`-th token) or None (more follow)."""

    request_id: Any
    token_id: int
    finished: bool
    finish_reason: str | None = None


@dataclass(eq=False)
class Request:
    """A request from admission to its last token. `prefilled` prompt tokens have their K/V written (a long prompt
    is prefilled in chunks); the device has `produced` new tokens (the prefill's first, then one per decode step),
    of which the host has `read` (and reported or checked for EOS)."""

    request_id: Any
    prompt: list[int]
    budget: int
    eos: frozenset[int]
    sampling: SamplingParams = GREEDY
    slot: int = -1
    prefilled: int = 0
    produced: int = 0
    read: int = 0

    @property
    def length(self) -> int:
        """Prompt tokens."""
        return len(self.prompt)

    @property
    def decoding(self) -> bool:
        """Whether its whole prompt is prefilled (it steps with the others from now on)."""
        return self.prefilled == len(self.prompt)

    @property
    def written(self) -> int:
        """Cache positions holding its K/V: the prefilled prompt, then one per decode step (the newest token's K/V
        is written by the next step)."""
        return self.prefilled + max(self.produced - 1, 0)


def eos_ids(model: Any, eos_token_id: Any) -> list[int]:
    """The stop tokens: `eos_token_id` (an id, a list, or None for none), or the model's own for "model"."""
    if eos_token_id == "model":
        eos_token_id = model.generation_config.eos_token_id
    if eos_token_id is None:
        return []
    return [int(t) for t in eos_token_id] if isinstance(eos_token_id, (list, tuple)) else [int(eos_token_id)]
