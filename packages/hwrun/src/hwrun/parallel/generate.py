"""`hwrun generate --tp N` and `hwrun.generate` on a tensor-parallel plan, in a rank: every rank runs hwrun's engine
(`EngineCore.generate`, the model's own forward over the slot cache: the fused step reads whole weights) on the same
prompts; rank 0 prints. `hwrun.inference.decision` decides it (`_tp_planned`, the rule `decide_serving` applies to
`hwrun serve --tp`); this module holds the rank's side: the arguments agreed, who prints, the rank's life.

Why no lockstep messages, as `hwrun serve --tp` sends (`hwrun.parallel.lockstep`): a server's requests arrive on rank
0 alone, when only rank 0 knows, so rank 0 must tell the others each engine call. A `generate()` call knows every
input up front, and `EngineCore.generate` is a deterministic function of them and of the tokens: it admits, prefills,
steps and retires the same rows in the same order on every rank (its host decisions read only the prompts, budgets,
sampling, EOS ids, the engine's sizes and the tokens read back), and every rank reads the same tokens because it sees
the same logits (the row-wise layers all-reduce and the head gathers the vocabulary). So the calls rank 0 would
broadcast are the ones every rank already makes. What the lockstep checks is checked here instead: `agree_inputs`
all-gathers each rank's arguments before the first forward (a `RankDivergenceError` where one differs from rank 0's)
and, for sampling without a seed, seeds torch's generator with rank 0's draw on every rank (each prompt's row draws
its own seed from it, the same on every rank); after the last step `hwrun.generate` compares every rank's tokens
(`check_same_tokens`). One assumption is shared with `serve --tp`: the engine's KV pool is sized per rank (on an
accelerator, a fraction of the free memory, capped at what every slot needs); ranks whose pools differ would preempt
differently.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import RankDivergenceError
from .ranks import finish, is_leader

logger = logging.getLogger(__name__)

#: The `generate()` arguments every rank must pass as rank 0 does (`agree_inputs` compares them in this order).
AGREED = ("prompts", "max_new_tokens", "sampling", "seed", "decode", "batching")


def agree_inputs(prompts: Sequence[str], max_new_tokens: int, sampling: dict[str, Any], seed: int | None, *,
                 decode: str, batching: str) -> int | None:
    """The seed of torch's generator for this call on every rank (`seed`; rank 0's draw when sampling without one: the
    rows' own seeds, drawn from that generator, then agree while each prompt keeps its own), after checking that every
    rank passed rank 0's arguments (one all-gather; a `RankDivergenceError` naming the rank and the argument where
    not). Collective: every rank calls it at the same point of the same `generate()` call."""
    import hwdist

    mine = {"prompts": list(prompts), "max_new_tokens": max_new_tokens, "sampling": dict(sampling), "seed": seed,
            "decode": decode, "batching": batching}
    draw = secrets.randbits(62) if is_leader() and sampling.get("do_sample") and seed is None else None
    everyone = hwdist.all_gather_object((mine, draw))
    leader, drawn = everyone[0]
    for other, (theirs, _) in enumerate(everyone[1:], start=1):
        for name in AGREED:
            if theirs[name] != leader[name]:
                raise RankDivergenceError(
                    f"tensor parallel: rank {other} called generate() with {name}={_short(theirs[name])}, rank 0 with "
                    f"{_short(leader[name])}: every rank must run the same call (the same prompts, budget and "
                    "sampling), or their steps do not pair up. Pass every rank the same arguments.")
    if drawn is not None:
        logger.info("sampling without a seed under tensor parallelism: every rank uses rank 0's seed %d", drawn)
        return int(drawn)
    return seed


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:117]}..."


def rank_roles(decision: Any, n_prompts: int) -> tuple[bool, bool]:
    """(whether this rank prints, whether it streams) for a tensor-parallel rank of `hwrun generate` whose ranks take
    `decision` (`hwrun.inference.decision.planned`'s): rank 0 prints; it streams only where the ranks run
    Transformers' loop (hwrun's engine returns the tokens at the end)."""
    leader = is_leader()
    streams = leader and decision.runner == "generate"
    if leader and not streams and n_prompts == 1:
        logger.info("tensor parallel: the text is printed at the end (%s)", decision.reason)
    return leader, streams


def run_rank(plan: Any, body: Callable[[], int]) -> int:
    """Run `body` as one of the plan's ranks: the other ranks log errors only (rank 0 speaks for them), and the
    group is destroyed at the end whatever happens."""
    from .launch import exit_with_launcher

    exit_with_launcher()
    if not is_leader() and logging.getLogger().getEffectiveLevel() > logging.INFO:
        logging.getLogger().setLevel(logging.ERROR)
    try:
        return body()
    finally:
        finish()
