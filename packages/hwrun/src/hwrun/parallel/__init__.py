"""Tensor parallelism for `hwrun generate --tp N`, `hwrun serve --tp N` and `plan(tp=N)` (issue 37), built on
torchrun (through `hwdist launch`), torch.distributed and Transformers' tensor-parallel plans:

- `checks`: can N processes split this model here, and how (the plan's `tensor_parallel` row);
- `launch`: the CLI starts its N ranks itself (torchrun `--standalone`, no shell);
- `ranks`: the rank side (group, every rank decoded the same tokens);
- `generate`: `generate()` in a rank: every rank runs hwrun's engine on the same arguments (agreed), one seed;
- `lockstep`: serving, where rank 0 runs the scheduler and the other ranks repeat its engine calls.

Nothing here imports torch at import time. Public names load from their module on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TensorParallelPlan": "checks", "plan_tensor_parallel": "checks", "declared_tp_plan": "checks",
    "RankLaunch": "launch", "rank_launch": "launch", "run_ranks": "launch",
    "ensure_group": "ranks", "is_leader": "ranks", "launched_ranks": "ranks",
    "check_same_tokens": "ranks", "agree_inputs": "generate",
    "LeaderBackend": "lockstep", "follow": "lockstep",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hwrun.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
