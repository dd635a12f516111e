"""`hwdist bench`: time, algorithm and bus bandwidth per message size, nccl-tests conventions.

Size S is the whole buffer as nccl-tests counts it: the reduced buffer for all_reduce and
broadcast, the gathered output for all_gather, the input for reduce_scatter. algbw = S / t;
busbw = algbw * factor, factor = 2(n-1)/n for all_reduce, (n-1)/n for all_gather and
reduce_scatter, 1 for broadcast (nccl-tests `doc/PERFORMANCE.md`). GB/s are 10^9 bytes/s.
Each size is checked for the right result first, then raw `torch.distributed` calls and
hwdist's (with and without the descriptor check) are timed interleaved on the same buffers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import BenchError
from .progress import Progress
from .sizes import format_size

if TYPE_CHECKING:  # the collectives (and hwenv's platforms) load when a benchmark runs, not for `hwdist --help`
    from .context import DistContext

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64",
          "int32": "int32", "int64": "int64"}
#: Bytes per element of each dtype (known without torch, for the memory check before anything is allocated).
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "int32": 4, "int64": 8}


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw ratio for `op` on `world_size` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise BenchError(f"op {op!r} is not benchmarked; use one of {', '.join(OPS)} or all.")


@dataclass(frozen=True)
class BenchRow:
    """One op at one size: ours (checked and unchecked) against raw torch.distributed."""

    op: str
    size: int  # bytes, nccl-tests' S
    count: int  # elements per rank's input buffer
    dtype: str
    time_us: float  # hwdist, descriptor check on
    algbw: float  # GB/s
    busbw: float  # GB/s
    raw_time_us: float
    raw_busbw: float
    overhead: float  # time_us / raw_time_us
    unchecked_time_us: float
    unchecked_overhead: float
    correct: bool


@dataclass(frozen=True)
class BenchResult:
    """Every row plus where it ran."""

    world_size: int
    backend: str
    device: str
    dtype: str
    iters: int
    warmup: int
    repeats: int
    rows: tuple[BenchRow, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """JSON-ready."""
        data = asdict(self)
        data["rows"] = [asdict(r) for r in self.rows]
        return data


def peak_bytes(op: str, size: int, dtype: str) -> int:
    """About the most memory one rank holds for `op` at nominal size `size` (bytes): its buffers plus
    the correctness check's temporaries (reduce_scatter's check builds an int64 index of every element)."""
    element = ELEMENT_BYTES[dtype]
    if op == "reduce_scatter":
        return size * 3 + (size // element) * 8
    if op == "all_gather":
        return size * 3
    return size * 2


def check_memory(ops: Sequence[str], sizes: Sequence[int], dtype: str, available: int | None, where: str,
                 ranks_sharing: int = 1, label: str | None = None) -> None:
    """Refuse sizes whose buffers cannot fit in `available` bytes (shared by `ranks_sharing` ranks), before allocating.

    `available` None (unknown) checks nothing; allocation failures are still turned into `BenchError`.
    """
    if available is None or not sizes:
        return
    largest = max(sizes)
    need = max(peak_bytes(op, largest, dtype) for op in ops) * max(ranks_sharing, 1)
    if need > available:
        shared = f" x {ranks_sharing} ranks" if ranks_sharing > 1 else ""
        raise BenchError(
            f"--sizes {label or format_size(largest)!r} reaches {format_size(largest)}, which needs about {format_size(need)} ({dtype}{shared}, buffers and "
            f"the result check), but {where} has {format_size(available)} available; pass smaller --sizes, "
            f"e.g. 8B..{format_size(_largest_fitting(ops, dtype, available // max(ranks_sharing, 1))).replace(' ', '')}."
        )


def _largest_fitting(ops: Sequence[str], dtype: str, budget: int) -> int:
    size = 8
    while max(peak_bytes(op, size * 2, dtype) for op in ops) <= budget:
        size *= 2
    return size


def host_available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes of host memory available now (Linux `MemAvailable`), else None."""
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory(ctx: DistContext) -> tuple[int | None, str]:
    """(bytes free where the buffers live, a description): the device's free memory, else the host's."""
    if ctx.on_accelerator:
        from hwenv.platforms import runtime

        index = int(ctx.device.partition(":")[2] or 0)
        info = runtime.mem_get_info(ctx.platform, index)
        return (info[0] if info else None), ctx.device
    return host_available_memory(), "host memory"


def _allocation_failure(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, MemoryError) or "out of memory" in text or "allocate" in text


def _torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise BenchError(f"--dtype {name!r} is not supported; use one of {', '.join(DTYPES)}.")
    return getattr(torch, DTYPES[name])


def _sync(ctx: DistContext) -> None:
    """Wait for the device's queued work (through hwenv's runtime: Gaudi's synchronize() takes no device)."""
    if ctx.on_accelerator:
        from hwenv.platforms import runtime

        runtime.synchronize(ctx.platform, ctx.device)


def _buffers(op: str, size: int, dtype: Any, ctx: DistContext) -> tuple[Any, int, int]:
    """(input tensor, elements per input, actual S in bytes) for `op` at nominal `size`."""
    import torch

    element = torch.empty((), dtype=dtype).element_size()
    n = ctx.world_size
    if op in ("all_reduce", "broadcast"):
        count = max(size // element, 1)
        total = count * element
    elif op == "all_gather":
        count = max(size // (element * n), 1)
        total = count * element * n
    else:  # reduce_scatter: input holds n chunks
        count = max(size // (element * n), 1) * n
        total = count * element
    return torch.empty(count, dtype=dtype, device=ctx.device), count, total


def _check(op: str, x: Any, ctx: DistContext) -> bool:
    """Run hwdist's `op` once on a known pattern and compare with the exact expected result."""
    import torch

    from . import collectives

    n, r = ctx.world_size, ctx.rank
    total = n * (n + 1) // 2
    if op == "all_reduce":
        x.fill_(r + 1)
        ok = bool(torch.all(collectives.all_reduce(x) == total))
    elif op == "broadcast":
        x.fill_(7 if r == 0 else 0)
        ok = bool(torch.all(collectives.broadcast(x, 0) == 7))
    elif op == "all_gather":
        x.fill_(r + 1)
        out = collectives.all_gather(x)
        expected = torch.arange(1, n + 1, device=x.device).to(x.dtype).view(n, 1).expand_as(out)
        ok = bool(torch.equal(out, expected))
    else:
        per = x.numel() // n
        chunk = torch.arange(n, device=x.device).repeat_interleave(per).to(x.dtype)  # value = chunk index
        x.copy_(chunk + (r % 2))
        out = collectives.reduce_scatter(x)
        expected = n * r + n // 2  # sum over ranks of (r + rank % 2)
        ok = bool(torch.all(out == expected))
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=ctx.device)
    collectives.all_reduce(flag, "min", check=False)
    return bool(flag.item())


def _raw(op: str, x: Any, out: Any) -> Callable[[], Any]:
    import torch.distributed as dist

    flat = out.view(-1) if out is not None else None  # gloo takes only the flat output form
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_gather": lambda: dist.all_gather_into_tensor(flat, x),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, x),
    }[op]


def _ours(op: str, x: Any, out: Any, check: bool) -> Callable[[], Any]:
    """hwdist's call on the same buffers as the raw one (`out=` reused, as the raw call does)."""
    from . import collectives

    return {
        "all_reduce": lambda: collectives.all_reduce(x, check=check),
        "broadcast": lambda: collectives.broadcast(x, 0, check=check),
        "all_gather": lambda: collectives.all_gather(x, out=out, check=check),
        "reduce_scatter": lambda: collectives.reduce_scatter(x, out=out, check=check),
    }[op]


def _time(fn: Callable[[], Any], iters: int, ctx: DistContext) -> float:
    """Seconds per call on the slowest rank: sync, `iters` back-to-back calls, sync."""
    import torch
    import torch.distributed as dist

    _sync(ctx)
    dist.all_reduce(torch.zeros(1, device=ctx.device))  # start together
    _sync(ctx)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(ctx)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def bench_op(op: str, size: int, dtype: str = "fp32", *, iters: int = 20, warmup: int = 5,
             repeats: int = 3) -> BenchRow:
    """Check and time one op at one nominal size (bytes); call on every rank."""
    import torch

    from .context import current

    ctx = current()
    bus_factor(op, ctx.world_size)
    torch_dtype = _torch_dtype(dtype)
    x, count, total = _buffers(op, size, torch_dtype, ctx)
    correct = _check(op, x, ctx)
    x.zero_()
    n = ctx.world_size
    out = (torch.empty((n, count), dtype=torch_dtype, device=ctx.device) if op == "all_gather"
           else torch.empty(count // n, dtype=torch_dtype, device=ctx.device) if op == "reduce_scatter" else None)
    variants = {"raw": _raw(op, x, out), "unchecked": _ours(op, x, out, False), "checked": _ours(op, x, out, True)}
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(repeats):
        order = list(variants) if repeat % 2 == 0 else list(reversed(variants))  # cancel order effects
        for name in order:
            samples[name].append(_time(variants[name], iters, ctx))
    t = {name: statistics.median(values) for name, values in samples.items()}
    factor = bus_factor(op, n)
    algbw = total / t["checked"] / 1e9
    raw_algbw = total / t["raw"] / 1e9
    return BenchRow(op, total, count, dtype, t["checked"] * 1e6, algbw, algbw * factor, t["raw"] * 1e6,
                    raw_algbw * factor, t["checked"] / t["raw"], t["unchecked"] * 1e6,
                    t["unchecked"] / t["raw"], correct)


def run_bench(ops: Sequence[str], sizes: Sequence[int], dtype: str = "fp32", *, iters: int = 20,
              warmup: int = 5, repeats: int = 3, progress: bool | None = None) -> BenchResult:
    """Every op at every size on the initialised context; rows are identical on every rank."""
    from .context import current

    ctx = current()
    for op in ops:
        bus_factor(op, ctx.world_size)
    _torch_dtype(dtype)
    if iters < 1 or warmup < 0 or repeats < 1:
        raise BenchError(f"iters={iters}, warmup={warmup}, repeats={repeats}: need iters >= 1, warmup >= 0, repeats >= 1.")
    bar = Progress(len(ops) * len(sizes), enabled=progress if ctx.is_main else False)
    rows = []
    try:
        for op in ops:
            for size in sizes:
                try:
                    rows.append(bench_op(op, size, dtype, iters=iters, warmup=warmup, repeats=repeats))
                except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
                    if not _allocation_failure(error):
                        raise
                    raise BenchError(f"{op} at size {format_size(size)} ({dtype}) cannot be allocated on "
                                     f"{ctx.device}: {error}. Pass smaller --sizes.") from error
                bar.step(f"{op} {format_size(size)}")
    finally:
        bar.close()
    return BenchResult(ctx.world_size, ctx.backend, ctx.device, dtype, iters, warmup, repeats, tuple(rows))


COLUMNS = ("op", "size", "count", "dtype", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "raw time (us)",
           "raw busbw (GB/s)", "overhead", "overhead (no check)", "correct")


def table_rows(result: BenchResult) -> list[list[str]]:
    """The table body as strings."""
    return [[r.op, format_size(r.size), str(r.count), r.dtype, f"{r.time_us:.1f}", f"{r.algbw:.3f}",
             f"{r.busbw:.3f}", f"{r.raw_time_us:.1f}", f"{r.raw_busbw:.3f}", f"{r.overhead:.2f}x",
             f"{r.unchecked_overhead:.2f}x", "yes" if r.correct else "NO"] for r in result.rows]


def format_table(result: BenchResult, markdown: bool = False) -> str:
    """A plain aligned table (stdout) or a markdown table."""
    body = table_rows(result)
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(c), *(len(row[i]) for row in body)) if body else len(c) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


def summary(result: BenchResult) -> str:
    """One line: where it ran and the median overhead ratios."""
    if not result.rows:
        return "no rows"
    checked = statistics.median(r.overhead for r in result.rows)
    unchecked = statistics.median(r.unchecked_overhead for r in result.rows)
    bad = [f"{r.op} {format_size(r.size)}" for r in result.rows if not r.correct]
    return (f"# {result.backend} on {result.device}, world size {result.world_size}, {result.dtype}, "
            f"{result.iters} iters x {result.repeats} repeats: median overhead vs raw torch.distributed "
            f"{checked:.2f}x (with descriptor check), {unchecked:.2f}x (without); "
            + ("all results correct" if not bad else f"WRONG results: {', '.join(bad)}"))
