"""The rank side of tensor parallelism: is this process one of the `tp` processes, their group (hwdist), and the
check that every rank decoded the same tokens (one sampling seed for all of them: `hwrun.parallel.generate`).

Every rank runs the same decode on its shards (Transformers' plan all-reduces after each row-wise layer and gathers
the vocabulary, so every rank sees the same logits): greedy and seeded sampling pick the same token on every rank.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from ..errors import RankDivergenceError, TensorParallelError

if TYPE_CHECKING:
    import hwdist

logger = logging.getLogger(__name__)

#: Variable the launcher sets in the ranks it starts, so a rank never starts ranks of its own.
RANK_MARK = "HWRUN_TP_RANK"


def launched_ranks(tp: int, environ: Any = None) -> bool:
    """Whether this process is one of `tp` launched ranks (torchrun's WORLD_SIZE equals `tp`); False when no launcher
    started it (the CLI then starts the ranks); TensorParallelError when a launcher started another number."""
    env = os.environ if environ is None else environ
    world = env.get("WORLD_SIZE")
    if tp <= 1 or world is None:
        if env.get(RANK_MARK) and tp > 1:  # pragma: no cover - the launcher always sets WORLD_SIZE
            raise TensorParallelError(f"{RANK_MARK} is set but WORLD_SIZE is not: a rank hwrun started lost its "
                                      "launcher variables.")
        return False
    if world.strip() != str(tp):
        raise TensorParallelError(f"tp={tp} but this process was launched as one of WORLD_SIZE={world} processes: "
                                  f"launch exactly {tp} (hwrun starts them itself when run without a launcher).")
    return True


def rank() -> int:
    """This process's rank (0 without a launcher)."""
    return int(os.environ.get("RANK", "0") or 0)


def is_leader() -> bool:
    """Whether this process is rank 0: it prints, serves HTTP, and drives the others."""
    return rank() == 0


def ensure_group(plan: Any) -> hwdist.DistContext:
    """This rank's process group (hwdist: the plan's backend, the launcher's variables checked, the local device
    bound) before Transformers builds its device mesh on it; TensorParallelError where the ranks cannot start."""
    import hwdist

    parallel = plan.parallel
    if parallel is None:
        raise TensorParallelError("ensure_group needs a plan made with tp > 1.")
    if not launched_ranks(plan.tp):
        raise TensorParallelError(f"tp={plan.tp}: this process was not started as one of {plan.tp} ranks. Run "
                                  f"`hwrun generate --tp {plan.tp} ...` (it starts them), or start it with "
                                  f"`torchrun --nproc-per-node {plan.tp} -m hwrun.cli ...`.")
    context = hwdist.init(parallel.backend, accel=plan.accelerator)
    check_mesh_device(plan)
    return context


def check_mesh_device(plan: Any) -> None:
    """Transformers builds its tensor-parallel mesh on torch's current accelerator (`torch.accelerator`, CPU when there
    is none): refuse a plan for another device type (it would place the shards elsewhere)."""
    import torch

    current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    mesh_type = current.type if current is not None else "cpu"
    if mesh_type != plan.accelerator.device_type:
        raise TensorParallelError(
            f"tp={plan.tp} planned for {plan.accelerator.kind} ({plan.accelerator.device_type}), but Transformers "
            f"builds its tensor-parallel mesh on torch's current accelerator, {mesh_type}. Plan for {mesh_type}, or hide "
            f"the {mesh_type} devices from these processes (e.g. CUDA_VISIBLE_DEVICES=-1 for a CPU run).")


def check_same_tokens(token_ids: list[list[int]]) -> None:
    """Every rank decoded the same tokens (all-gathered and compared); RankDivergenceError naming the first difference."""
    import hwdist

    everyone = hwdist.all_gather_object([list(map(int, row)) for row in token_ids])
    leader = everyone[0]
    for other, rows in enumerate(everyone[1:], start=1):
        if rows != leader:
            for index, (mine, theirs) in enumerate(zip(leader, rows, strict=False)):
                if mine != theirs:
                    at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                              min(len(mine), len(theirs)))
                    raise RankDivergenceError(
                        f"rank {other} decoded prompt {index + 1} differently from rank 0 from new token {at + 1} on "
                        f"({theirs[at:at + 4]} against {mine[at:at + 4]}): the ranks' logits differ, so their sharded "
                        "caches no longer agree. Report it with the model and the command.")
            raise RankDivergenceError(f"rank {other} decoded {len(rows)} prompts, rank 0 {len(leader)}.")


def finish() -> None:
    """Destroy this rank's group (gloo is not destroyed at exit, and a process leaving one may abort on its way out)."""
    import hwdist

    hwdist.shutdown()
