"""`hwrun generate --tp N` in a rank: which options the ranks run with, and the rank's life (group up, decode,
group down). Every rank runs the same static batch through Transformers' `generate` on its shards; rank 0 prints.

Why static batches and Transformers' loop: every rank must run the same forward passes in the same order (each holds
a slice of every layer and the all-reduces pair them up). A static batch does; hwrun's graph decoders run a fused
Llama-family step that reads whole weights, which tensor-parallel shards are not, and have not been run on shards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import TensorParallelError
from .ranks import agreed_seed, finish, is_leader

logger = logging.getLogger(__name__)

#: Why the ranks decode with Transformers' loop on one static batch.
RANK_DECODE_REASON = ("tensor parallel: every rank runs Transformers' generate on the same static batch (the ranks' "
                      "all-reduces pair up step by step; hwrun's graph decoders read whole weights)")


def check_generate_options(args: Any) -> None:
    """Refuse `hwrun generate` options that tensor-parallel ranks do not run, before anything starts."""
    tp = args.tp
    if getattr(args, "decode", "auto") == "graphs":
        raise TensorParallelError(f"--tp {tp} with --decode graphs: hwrun's graph decoders have not run on "
                                  "tensor-parallel shards (the fused Llama-family step reads whole weights); the ranks "
                                  "decode with Transformers' generate. Leave --decode out (or --decode generate).")
    if getattr(args, "batching", "auto") == "continuous":
        raise TensorParallelError(f"--tp {tp} with --batching continuous: tensor-parallel ranks run one static batch "
                                  "(every rank the same steps); leave --batching out or pass --batching static.")


def rank_options(plan: Any, options: dict[str, Any], batching: str) -> tuple[dict[str, Any], str, bool]:
    """(generate() options, batching, whether this rank prints) for a tensor-parallel rank: Transformers' loop on a
    static batch, one sampling seed for every rank."""
    options = dict(options)
    if options.get("decode", "auto") == "auto":
        options["decode"] = "generate"
        logger.info("decode: generate (%s)", RANK_DECODE_REASON)
    if batching == "auto":
        batching = "static"
    if options.get("do_sample"):
        options["seed"] = agreed_seed(options.get("seed"))
    return options, batching, is_leader()


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
