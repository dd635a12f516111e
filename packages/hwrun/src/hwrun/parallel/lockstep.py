"""Serving with tensor parallelism: rank 0 runs the scheduler, every other rank repeats its engine calls in lockstep.

Rank 0's engine core (`hwrun.serve.core.CoreLoop`, unchanged) drives a `LeaderBackend`: each call that changes the
engine's state (`add`, `cancel`, `step`, `close`) is first broadcast to the other ranks (torch.distributed's
`broadcast_object_list` on a gloo group: the control plane stays on the host whatever the devices' backend), then
run on rank 0's own backend. The other ranks run `follow()`: receive a call, run it on their backend, repeat. So
every rank admits, cancels and steps the same requests in the same order, and the model's all-reduces pair up.
This is Transformers' continuous batching's own scheme for tensor parallelism (its TP driver broadcasts request
ingress from rank 0 on a CPU gloo group, `generation/continuous_batching/distributed.py`), applied to hwrun's engine.

Each `step` message carries rank 0's tokens of the previous step; a rank whose own differ stops with a
`RankDivergenceError` (their sharded caches would no longer agree). A sampled request without a seed gets one drawn
on rank 0, so every rank samples the same token.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from typing import Any

from ..errors import RankDivergenceError

logger = logging.getLogger(__name__)

#: The calls rank 0 broadcasts (`close` ends the followers).
CALLS = ("add", "cancel", "step", "close")
#: How long a follower waits for rank 0's next call: an idle server sends none (the process group's own timeout,
#: 10 minutes by default, would end an idle server). A rank 0 that dies closes its connections, which ends the wait
#: at once ("Connection closed by peer"), and torchrun stops the other ranks.
CONTROL_TIMEOUT_DAYS = 365


def control_group() -> Any:
    """The group the engine calls go over: a gloo group of every rank (the host carries them whatever the devices'
    backend) whose timeout an idle server never reaches. Call it on every rank at the same point (collective)."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(days=CONTROL_TIMEOUT_DAYS))


def _broadcast(message: Any, group: Any) -> Any:
    import torch.distributed as dist

    holder = [message]
    dist.broadcast_object_list(holder, src=0, group=group)
    return holder[0]


def digest(events: list[Any]) -> list[tuple[str, tuple[int, ...], bool]]:
    """What every rank must agree on after a step: each event's request, tokens and whether it finished."""
    return [(e.request_id, tuple(int(t) for t in e.token_ids), bool(e.finished)) for e in events]


def seeded(request: Any) -> Any:
    """`request` with a seed drawn here when it samples without one (every rank must draw the same tokens)."""
    sampling = getattr(request, "sampling", None)
    if sampling is None or getattr(sampling, "seed", None) is not None or getattr(sampling, "greedy", True):
        return request
    seed = secrets.randbits(31)
    logger.debug("request %s samples without a seed: rank 0 gives it %d for every rank", request.request_id, seed)
    return dataclasses.replace(request, sampling=dataclasses.replace(sampling, seed=seed))


class LeaderBackend:
    """Rank 0's backend: `backend` (the engine's `Backend`), with every state-changing call sent to the other ranks
    first. `free_slots` is read locally (every rank holds the same state)."""

    def __init__(self, backend: Any, group: Any = None, *, end_group: bool = False) -> None:
        self.backend = backend
        self.name = backend.name
        self.group = group
        self.end_group = end_group  # destroy the process group after `close` (the engine process is ending)
        self._last: list[tuple[str, tuple[int, ...], bool]] | None = []
        self.steps = 0

    def __getattr__(self, name: str) -> Any:  # anything else the server reads (e.g. the slot decoder)
        return getattr(self.__dict__.get("backend"), name)

    def free_slots(self) -> int:
        """The backend's free slots (the same on every rank)."""
        return self.backend.free_slots()

    def add(self, request: Any) -> None:
        """Admit `request` on every rank."""
        request = seeded(request)
        _broadcast(("add", request), self.group)
        self.backend.add(request)

    def cancel(self, request_id: str) -> None:
        """Cancel `request_id` on every rank."""
        _broadcast(("cancel", request_id), self.group)
        self.backend.cancel(request_id)

    def step(self) -> list[Any]:
        """One engine step on every rank (with the previous step's tokens, for the others to compare)."""
        _broadcast(("step", self._last), self.group)
        try:
            events = self.backend.step()
        except BaseException:
            self._last = None  # the others' step fails the same way
            raise
        self._last = digest(events)
        self.steps += 1
        return events

    def close(self) -> None:
        """End the other ranks' loops, then close this rank's backend."""
        try:
            _broadcast(("close", None), self.group)
        except Exception:  # noqa: BLE001 - a follower that is already gone: closing goes on here
            logger.warning("tensor parallel: the other ranks could not be told to stop (already gone?)", exc_info=True)
        finally:
            try:
                self.backend.close()
            finally:
                if self.end_group:
                    from .ranks import finish

                    finish()


def follow(backend: Any, group: Any = None) -> int:
    """A rank other than 0: repeat rank 0's engine calls on `backend` until it says `close`; returns the steps run.
    A call that fails here fails on rank 0 too (the same state, the same inputs): it is logged and the loop goes on;
    tokens that differ from rank 0's are a `RankDivergenceError`."""
    last: list[tuple[str, tuple[int, ...], bool]] | None = []
    steps = 0
    while True:
        call, argument = _broadcast(None, group)
        if call == "close":
            backend.close()
            return steps
        if call == "step":
            if argument != last:
                raise RankDivergenceError(
                    f"tensor parallel: after step {steps} this rank's tokens {last} differ from rank 0's {argument}: "
                    "the ranks' logits differ, so their sharded caches no longer agree.")
            try:
                last = digest(backend.step())
            except Exception:  # noqa: BLE001 - rank 0's step failed the same way; it fails those requests
                logger.debug("tensor parallel: step %d failed here as on rank 0", steps, exc_info=True)
                last = None
            steps += 1
        elif call in ("add", "cancel"):
            try:
                getattr(backend, call)(argument)
            except Exception:  # noqa: BLE001 - rank 0 refused the same request
                logger.debug("tensor parallel: %s failed here as on rank 0", call, exc_info=True)
        else:
            raise RankDivergenceError(f"tensor parallel: rank 0 sent an unknown engine call {call!r}.")
