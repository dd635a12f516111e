"""A worker for hwdist's multi-process tests: run as `python hwdist_worker.py SCENARIO OUT_DIR`
under real launcher variables (set by the test, or by torchrun through `hwdist launch`).

Writes OUT_DIR/rank{RANK}.json with every observed result; the tests assert on them.
Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import hwdist
import torch

TIMEOUT_S = 10.0  # set from HWDIST_TEST_TIMEOUT in main() (forked ranks share this module)


def _error(fn):
    try:
        fn()
    except hwdist.HwdistError as error:
        return {"type": type(error).__name__, "message": str(error)}
    return None


def collectives(results: dict, ctx: hwdist.DistContext) -> None:
    r, n = ctx.rank, ctx.world_size
    results["again_same"] = hwdist.init() is ctx
    results["sum"] = hwdist.all_reduce(torch.tensor([r + 1.0, 2.0 * (r + 1)])).tolist()
    results["mean"] = hwdist.all_reduce(torch.tensor([r + 1.0, 10.0 * r]), "mean").tolist()
    results["max"] = hwdist.all_reduce(torch.tensor([float(r), -float(r)]), "max").tolist()
    results["min"] = hwdist.all_reduce(torch.tensor([float(r), -float(r)]), "min").tolist()
    results["sum_int"] = hwdist.all_reduce(torch.tensor([r + 1, 100], dtype=torch.int64)).tolist()
    results["sum_bf16"] = hwdist.all_reduce(torch.full((3,), r + 1.0, dtype=torch.bfloat16)).float().tolist()
    base = torch.arange(6.0).view(2, 3) + r
    view = base.t()  # non-contiguous
    returned = hwdist.all_reduce(view)
    results["sum_noncontiguous"] = view.tolist()
    results["sum_noncontiguous_same_object"] = returned is view
    results["gather"] = hwdist.all_gather(torch.tensor([r, 10 * r])).tolist()
    results["gather_2d_shape"] = list(hwdist.all_gather(torch.zeros(2, 3)).shape)
    buffer = torch.empty(n, 2, 2)
    results["gather_out_reused"] = hwdist.all_gather(torch.full((2, 2), float(r)), out=buffer) is buffer
    results["gather_out"] = buffer[:, 0, 0].tolist()
    kept = []  # the same out again (gloo: its kept view), then changed in place, then inputs of other shapes
    for step in range(3):
        hwdist.all_gather(torch.full((2, 2), float(r + 10 * step)), out=buffer)
        kept.append(buffer[:, 1, 1].tolist())
    buffer.zero_()
    hwdist.all_gather(torch.full((2, 2), float(r + 100)), out=buffer)
    kept.append(buffer[:, 1, 1].tolist())
    flat = torch.empty(n * 6)
    for shape in ((2, 3), (3, 2), (6,)):
        hwdist.all_gather(torch.full(shape, float(r + len(shape))), out=flat)
        kept.append(flat.view(n, 6)[:, 5].tolist())
    results["gather_out_kept"] = kept
    chunk = torch.empty(1, 3)
    results["reduce_scatter_out_reused"] = hwdist.reduce_scatter(torch.ones(n, 3) * (r + 1), out=chunk) is chunk
    results["reduce_scatter_out"] = chunk.tolist()
    results["gather_object"] = hwdist.all_gather_object({"rank": r, "text": "x" * r})
    results["broadcast"] = hwdist.broadcast(torch.full((3,), float(r * 10)), src=n - 1).tolist()
    results["reduce_scatter"] = hwdist.reduce_scatter(torch.arange(2.0 * n) + r).tolist()
    results["reduce_scatter_mean"] = hwdist.reduce_scatter(torch.arange(2.0 * n) + r, "mean").tolist()
    results["reduce_scatter_max"] = hwdist.reduce_scatter(torch.arange(2.0 * n) * (r + 1), "max").tolist()
    for _ in range(3):  # its descriptor tensors are made on the first call and reused
        hwdist.barrier()
    results["barrier"] = True
    # Mismatches: with checks on (opt-in: check=True, init(check=True) or HWDIST_CHECKS=1) every rank must get
    # an error and none may hang.
    start = time.perf_counter()
    results["shape_mismatch"] = _error(lambda: hwdist.all_reduce(torch.zeros(2 if r == 0 else 3), check=True))
    results["dtype_mismatch"] = _error(
        lambda: hwdist.all_gather(torch.zeros(2, dtype=torch.float32 if r == 0 else torch.float64), check=True))
    results["op_mismatch"] = _error(
        lambda: hwdist.all_reduce(torch.zeros(2), check=True) if r == 0 else hwdist.broadcast(torch.zeros(2), check=True))
    results["reduce_op_mismatch"] = _error(lambda: hwdist.all_reduce(torch.zeros(2), "sum" if r == 0 else "max", check=True))
    results["broadcast_src_mismatch"] = _error(lambda: hwdist.broadcast(torch.zeros(2), src=0 if r == 0 else 1, check=True))
    results["barrier_mismatch"] = _error(
        lambda: hwdist.barrier() if r == 0 else hwdist.all_reduce(torch.zeros(2), check=True))
    results["bad_op_on_rank0"] = _error(lambda: hwdist.all_reduce(torch.zeros(2), "bogus" if r == 0 else "sum", check=True))
    results["mean_int"] = _error(lambda: hwdist.all_reduce(torch.zeros(2, dtype=torch.int64), "mean", check=True))
    results["reduce_scatter_indivisible"] = _error(lambda: hwdist.reduce_scatter(torch.zeros(n + 1), check=True))
    results["gather_bad_out"] = _error(lambda: hwdist.all_gather(torch.zeros(2), out=torch.empty(n, 3), check=True))
    # The same bad inputs with checks off (the default): refused on every rank alike, locally (no exchange needed)
    results["unchecked_mean_int"] = _error(lambda: hwdist.all_reduce(torch.zeros(2, dtype=torch.int64), "mean"))
    results["unchecked_reduce_scatter_indivisible"] = _error(lambda: hwdist.reduce_scatter(torch.zeros(n + 1)))
    results["unchecked_gather_bad_out"] = _error(lambda: hwdist.all_gather(torch.zeros(2), out=torch.empty(n, 3)))
    results["unchecked_bad_op"] = _error(lambda: hwdist.all_reduce(torch.zeros(2), "bogus"))
    results["mismatch_seconds"] = time.perf_counter() - start
    results["after_errors_sum"] = hwdist.all_reduce(torch.ones(1)).tolist()
    from dataclasses import asdict

    from hwdist.bench import OPS, run_bench

    bench = run_bench(OPS, [64, 4096], "bf16", iters=2, warmup=1, repeats=1, progress=False)
    results["bench"] = [asdict(row) for row in bench.rows]


def early_exit(results: dict, ctx: hwdist.DistContext, out_dir: str) -> None:
    """The last rank leaves; the others must fail within the timeout with a CollectiveError."""
    if ctx.rank == ctx.world_size - 1:
        write(results, out_dir, ctx.rank)
        os._exit(0)
    time.sleep(0.5)
    start = time.perf_counter()
    results["early_exit"] = _error(lambda: hwdist.all_reduce(torch.ones(4)))
    results["early_exit_seconds"] = time.perf_counter() - start


def stuck(results: dict, ctx: hwdist.DistContext, out_dir: str) -> None:
    """The last rank stays alive but never calls; the others must fail after the timeout."""
    if ctx.rank == ctx.world_size - 1:
        write(results, out_dir, ctx.rank)
        time.sleep(TIMEOUT_S + 1.5)  # alive past the others' timeout, then gone
        os._exit(0)
    start = time.perf_counter()
    results["stuck"] = _error(lambda: hwdist.all_reduce(torch.ones(4), check=False))
    results["stuck_seconds"] = time.perf_counter() - start


def launch(results: dict, ctx: hwdist.DistContext) -> None:
    results["sum"] = hwdist.all_reduce(torch.tensor([ctx.rank + 1.0])).tolist()
    results["objects"] = hwdist.all_gather_object([ctx.rank, ctx.local_rank, ctx.world_size])
    results["env"] = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                      "ZE_AFFINITY_MASK", "HWDIST_TEST_MARK")}
    results["argv"] = sys.argv[3:]


def write(results: dict, out_dir: str, rank: int) -> None:
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(results, handle)
    os.replace(path + ".tmp", path)


def main() -> None:
    global TIMEOUT_S
    TIMEOUT_S = float(os.environ.get("HWDIST_TEST_TIMEOUT", "10"))
    scenario, out_dir = sys.argv[1], sys.argv[2]
    results: dict = {"scenario": scenario}
    rank = int(os.environ.get("RANK", "0"))
    try:
        ctx = hwdist.init(timeout=TIMEOUT_S)
        results["context"] = ctx.to_dict()
        torch.set_default_device(ctx.device)  # the same checks on a GPU (nccl) as on CPU (gloo)
        if scenario in ("collectives", "collectives+exit"):
            collectives(results, ctx)
        if scenario in ("exit", "collectives+exit"):
            early_exit(results, ctx, out_dir)
            write(results, out_dir, rank)
            os._exit(0)  # peers are gone: skip destroying the group
        if scenario == "stuck":
            stuck(results, ctx, out_dir)
            write(results, out_dir, rank)
            os._exit(0)
        if scenario == "launch":
            launch(results, ctx)
        hwdist.shutdown()
        results["initialized_after_shutdown"] = hwdist.is_initialized()
    except BaseException:
        results["crash"] = traceback.format_exc()
    write(results, out_dir, rank)


if __name__ == "__main__":
    main()
