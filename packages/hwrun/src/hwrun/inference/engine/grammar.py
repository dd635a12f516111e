"""Grammar-constrained requests in the engine's loop (host side): before each decode step, every constrained choice's
matcher accepts the tokens the device produced since it last looked, and its bitmask row is filled for the step;
before a prefill that ends a constrained prompt, the rows it gives a first token get their matchers' first masks.

A matcher is any object with `fill(bitmask, row)` (write the allowed tokens into row `row` of an int32 bitmask in
xgrammar's / llguidance's layout), `accept(token_id)` (False, or an exception, when the grammar rejects it) and
`finished` (the grammar has ended: the choice stops after that token). `hwrun.inference.structured` makes them.
A choice whose matcher rejects a token ends with an "error" event; the device step applies the masks, so that only
happens when a matcher and its own mask disagree. Requests without a matcher cost nothing here.
"""

from __future__ import annotations

from typing import Any

from .requests import Request, TokenEvent


def _ended(matcher: Any) -> bool:
    finished = getattr(matcher, "finished", False)
    return bool(finished() if callable(finished) else finished)


def _accepts(matcher: Any, token: int) -> tuple[bool, str]:
    try:
        return matcher.accept(token) is not False, ""
    except Exception as error:  # noqa: BLE001 - a rejection reported by raising: the choice fails, not the engine
        return False, f" ({type(error).__name__}: {error})"


def constrain(scheduler: Any, runner: Any) -> list[TokenEvent]:
    """Bring every decoding constrained choice's matcher up to its produced tokens (one device read for all) and fill
    their bitmask rows for the next step; an "error" event for each choice whose matcher rejected a token."""
    constrained = [r for r in scheduler.decoding() if r.matcher is not None and r.stop_after is None]
    if not constrained:
        return []
    pairs = [(r, column) for r in constrained for column in range(r.accepted, r.produced)]
    tokens = runner.read([r.slot for r, _ in pairs], [c for _, c in pairs]) if pairs else []
    events, failed = [], set()
    for (request, _), token in zip(pairs, tokens, strict=True):
        if request.key in failed or request.stop_after is not None:
            continue
        ok, why = _accepts(request.matcher, token)
        if not ok:
            failed.add(request.key)
            scheduler.leave(request)
            events.append(TokenEvent(request.request_id, None, True, "error", request.index,
                                     error=f"the grammar rejected token {token} at position {request.accepted} of "
                                           f"the answer{why}"))
            continue
        request.accepted += 1
        if _ended(request.matcher):
            request.stop_after = request.accepted
    runner.masks([(r.slot, r.matcher if r.stop_after is None else None) for r in constrained if r.key not in failed])
    return events


def first_masks(scheduler: Any, forward: list) -> list[tuple[int, Any]]:
    """(slot, matcher) of each constrained row that the prefill `forward` gives a first token (the rows whose prompt
    it ends, and the rows of their other choices)."""
    pairs = []
    for chunk in forward:
        if not chunk.last:
            continue
        for slot in (chunk.slot, *chunk.copies):
            request: Request = scheduler.requests[scheduler.kv.owner[slot]]
            if request.matcher is not None:
                pairs.append((slot, request.matcher))
    return pairs
