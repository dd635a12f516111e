"""One request's state in the engine (its prompt, budget, stop ids, sampling, slot and progress; the choice it is of
a request with several, and its grammar matcher), the event a step reports for it, and how a request's stop ids are
read (`eos_ids`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import FastDecodeError
from ..decode.sampling import SamplingParams, choice_seed

#: The sampling of a request that names none: greedy (the argmax).
GREEDY = SamplingParams()


@dataclass(frozen=True)
class TokenEvent:
    """One new token of one request: `finish_reason` is "stop" (an EOS id, included), "length"
    (its `max_new_tokens`-th token) or None (more follow)."""

    request_id: Any
    token_id: int | None  # None: an event without a token (a request that failed: `error` says why)
    finished: bool
    finish_reason: str | None = None
    index: int = 0  # which choice of the request (its `n`)
    logprob: float | None = None  # the model's log-probability of the token (when the request asked for logprobs)
    top: tuple[tuple[int, float], ...] = ()  # the most likely (token id, logprob) pairs of that step
    error: str | None = None


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
    index: int = 0  # its choice among the request's `n`
    leader: Request | None = None  # the choice whose prefill this one copies (None: it prefills itself)
    followers: list[Request] = field(default_factory=list)  # the choices that copy this one's prefill
    matcher: Any = None  # a grammar matcher (fill / accept / finished) constraining its tokens
    accepted: int = 0  # tokens the matcher has accepted
    stop_after: int | None = None  # the grammar ended: it stops after this many tokens
    recompute: list[int] | None = None  # preempted while decoding: prompt + its tokens but the newest, to prefill again
    saved: Any = None  # its choosing row as it was when preempted (restored when its recompute ends)

    @property
    def key(self) -> Any:
        """What the scheduler and the KV-cache manager hold it by: its request id (choice 0), else (id, index)."""
        return self.request_id if self.index == 0 else (self.request_id, self.index)

    @property
    def length(self) -> int:
        """Prompt tokens."""
        return len(self.prompt)

    @property
    def decoding(self) -> bool:
        """Whether its whole prompt is prefilled (it steps with the others from now on)."""
        return self.prefilled == len(self.prompt) and self.recompute is None

    @property
    def source(self) -> list[int]:
        """The tokens its prefill writes: its prompt, or what a preempted request recomputes."""
        return self.prompt if self.recompute is None else self.recompute

    @property
    def waits(self) -> bool:
        """Whether it waits for its leader's prefill (a choice that copies it instead of prefilling)."""
        return self.leader is not None and not self.decoding

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


def check_choices(request_id: Any, n: Any, matchers: Any, slots: int) -> None:
    """Refuse (FastDecodeError) a number of choices no engine of `slots` slots holds, or matchers not one per choice."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= slots:
        raise FastDecodeError(f"n={n!r} choices for request {request_id!r}: give 1 to slots={slots} (each choice "
                              "holds a slot).")
    if matchers is not None and len(matchers) != n:
        raise FastDecodeError(f"{len(matchers)} matchers for n={n} choices of request {request_id!r}: give one per "
                              "choice (or None).")


def choices(request_id: Any, prompt: list[int], budget: int, eos: frozenset[int], sampling: SamplingParams, n: int,
            matchers: Any = None) -> list[Request]:
    """The `n` choices of one request: the first prefills the prompt, the others follow it (they copy its K/V);
    choice i samples with `choice_seed(sampling, i)` and is constrained by `matchers[i]`."""
    leader = None
    made = []
    for index in range(n):
        request = Request(request_id, prompt, budget, eos, choice_seed(sampling, index), index=index, leader=leader,
                          matcher=None if matchers is None else matchers[index])
        if leader is None:
            leader = request
        else:
            leader.followers.append(request)
        made.append(request)
    return made
