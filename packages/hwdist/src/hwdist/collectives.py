"""Collectives with one signature on every backend, each bounded by the context's timeout.

The hot path is the raw `torch.distributed` call plus a few attribute reads (issue 29 point 5:
<= 2 us over raw torch at world size 1; `docs/benchmarks/collectives.md`): what depends only on
the group (the backend's reduce ops, whether `mean` is native, whether checks run) is decided
once per context and cached, and the argument checks run only when torch refuses a call, to turn
its error into hwdist's (which argument, why, the fix).

Checks on request (`init(check=True)`, `HWDIST_CHECKS=1`, or `check=True` per call): every argument
is validated before the call, and the ranks exchange a small fixed-size descriptor (operation,
dtype, shape, reduce op / source rank) first, so a dtype or shape mismatch is a
`CollectiveMismatchError` on every rank instead of a hang or silently wrong data (world size 1
never needs the exchange).
"""

from __future__ import annotations

import logging
import operator
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import context as _context
from .context import DistContext, current
from .errors import CollectiveArgumentError, CollectiveError, CollectiveMismatchError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

REDUCE_OPS = ("sum", "mean", "max", "min")
#: Backends whose ReduceOp.AVG we use; elsewhere `mean` is a sum divided by the world size
#: (gloo in older torch has no AVG, hccl/ccl support varies).
NATIVE_AVG = frozenset({"nccl", "xccl"})
#: Backends whose all-gather takes the stacked `(world_size, *shape)` output as it is: they check only
#: `output.numel() == world_size * input.numel()` (ProcessGroupNCCL/XCCL/HCCL `_allgather_base`); gloo
#: compares every dim-0 chunk of the output with the input's shape, and unknown backends get that form too.
STACKED_GATHER = frozenset({"nccl", "xccl", "hccl"})
#: Backends whose all-gather refuses (in its argument checks, before sending anything) an output whose dim-0
#: chunks differ from the input's shape: the view of a reused `out` that fits them is kept between calls.
SHAPED_GATHER = frozenset({"gloo"})
_OP_CODES = {"all_reduce": 1, "all_gather": 2, "broadcast": 3, "reduce_scatter": 4,
             "all_gather_object": 5, "barrier": 6}
_OP_NAMES = {code: name for name, code in _OP_CODES.items()}
_MAX_DIMS = 8
_HEADER = 6  # op, status, dtype, extra, ndim, numel
DESCRIPTOR_LENGTH = _HEADER + _MAX_DIMS
_logged_mean: set[str] = set()


def _dtype_code(dtype: torch.dtype) -> int:
    return sum(ord(c) * 31**i for i, c in enumerate(str(dtype))) % (2**31)


def _describe(row: list[int], dtypes: dict[int, str]) -> str:
    op, status, dtype, extra, ndim, _numel = row[:_HEADER]
    if status:
        return f"{_OP_NAMES.get(op, op)} with an invalid input (see that rank's error)"
    shape = row[_HEADER:_HEADER + min(ndim, _MAX_DIMS)]
    dims = ", ".join(str(d) for d in shape) + (", ..." if ndim > _MAX_DIMS else "")
    text = f"{_OP_NAMES.get(op, op)} {dtypes.get(dtype, 'dtype#' + str(dtype))}[{dims}]"
    if op in (_OP_CODES["all_reduce"], _OP_CODES["reduce_scatter"]):
        text += f" op={REDUCE_OPS[extra] if 0 <= extra < len(REDUCE_OPS) else extra}"
    if op == _OP_CODES["broadcast"]:
        text += f" src={extra}"
    return text


def _fail(ctx: DistContext, name: str, error: BaseException) -> CollectiveError:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return CollectiveError(
        f"{name} failed on rank {ctx.rank} of {ctx.world_size} ({ctx.backend}, timeout "
        f"{ctx.timeout.total_seconds():g} s): {first}. A peer rank probably exited or is stuck; read the "
        f"other ranks' output (or raise the timeout with hwdist.init(timeout=...))."
    )


def _call(ctx: DistContext, name: str, run: Callable[[], Any]) -> None:
    """Run a collective; a backend failure becomes a `CollectiveError`.

    Calls are synchronous in torch's sense: gloo blocks the host and gives up after the
    process-group timeout `init()` set; device backends (nccl, xccl, hccl) order the current
    stream after the collective and their watchdog enforces the same timeout. (An async call
    plus `Work.wait(timeout)` would cost more on gloo and block the host in a polling loop on
    NCCL, `ProcessGroupNCCL.cpp` `WorkNCCL::wait`.)
    """
    try:
        run()
    except RuntimeError as error:  # DistBackendError, gloo timeouts and closed connections
        raise _fail(ctx, name, error) from error


def _exchange(ctx: DistContext, name: str, tensor: torch.Tensor | None, extra: int = 0,
              problem: str | None = None, shape: tuple[int, ...] | None = None,
              same_extra: bool = True) -> list[list[int]]:
    """All ranks compare one descriptor row each; any difference raises on every rank.

    Returns the gathered rows; `same_extra=False` lets the `extra` slot differ (object sizes)."""
    import torch
    import torch.distributed as dist

    row = [0] * DESCRIPTOR_LENGTH
    row[0], row[1], row[3] = _OP_CODES[name], 1 if problem else 0, extra
    dtypes: dict[int, str] = {}
    if tensor is not None:
        dims = tuple(tensor.shape) if shape is None else shape
        code = _dtype_code(tensor.dtype)
        dtypes[code] = str(tensor.dtype).removeprefix("torch.")
        row[2], row[4], row[5] = code, len(dims), int(tensor.numel())
        row[_HEADER:_HEADER + min(len(dims), _MAX_DIMS)] = list(dims[:_MAX_DIMS])
    mine = torch.tensor(row, dtype=torch.int64, device=ctx.device)
    gathered = torch.empty(ctx.world_size * DESCRIPTOR_LENGTH, dtype=torch.int64, device=ctx.device)
    _call(ctx, name, lambda: dist.all_gather_into_tensor(gathered, mine))
    rows = gathered.view(ctx.world_size, DESCRIPTOR_LENGTH).cpu().tolist()
    if problem:
        raise CollectiveArgumentError(problem)
    return _compare(ctx, name, rows, dtypes, same_extra)


def _compare(ctx: DistContext, name: str, rows: list[list[int]], dtypes: dict[int, str],
             same_extra: bool = True) -> list[list[int]]:
    """`rows` if every rank sent the same descriptor; else the error that names what differs."""
    import torch

    def key(r: list[int]) -> list[int]:
        return r if same_extra else r[:3] + r[4:]

    if all(key(r) == key(rows[0]) for r in rows):
        return rows
    for candidate in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool"):
        dtypes.setdefault(_dtype_code(getattr(torch, candidate)), candidate)  # name other ranks' dtypes
    bad = [i for i, r in enumerate(rows) if r[1]]
    if bad:
        raise CollectiveArgumentError(
            f"{name}: rank(s) {bad} rejected their input (their own error says why), so rank {ctx.rank} "
            f"stops too instead of waiting."
        )
    listing = "; ".join(f"rank {i}: {_describe(r, dtypes)}" for i, r in enumerate(rows))
    raise CollectiveMismatchError(
        f"{name}: ranks passed different arguments ({listing}). Every rank must call the same collective "
        f"with the same dtype and shape (and op / src)."
    )


def _prepare(name: str, tensor: Any, ctx: DistContext) -> str | None:
    """Local checks; returns a problem message (raised after the exchange) or None."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return f"{name} takes a torch.Tensor, got {type(tensor).__name__}; use all_gather_object for objects."
    wanted = ctx.device_type
    if tensor.device.type != wanted:
        return (f"{name}: tensor is on {tensor.device} but the {ctx.backend} group reduces {wanted} tensors; "
                f"move it first: tensor.to({ctx.device!r}).")
    return None


def _checked(ctx: DistContext, check: bool | None) -> bool:
    return (ctx.check if check is None else check) and ctx.world_size > 1


def _raise_or_exchange(ctx: DistContext, name: str, tensor: Any, problem: str | None, check: bool | None,
                       extra: int = 0, shape: tuple[int, ...] | None = None) -> None:
    if _checked(ctx, check):
        import torch

        _exchange(ctx, name, tensor if isinstance(tensor, torch.Tensor) else None, extra, problem, shape)
    elif problem:
        raise CollectiveArgumentError(problem)


_ops: dict[str, Any] = {}


def _torch_ops() -> dict[str, Any]:
    if not _ops:
        import torch.distributed as dist

        _ops.update(sum=dist.ReduceOp.SUM, max=dist.ReduceOp.MAX, min=dist.ReduceOp.MIN, avg=dist.ReduceOp.AVG)
    return _ops


def _reduce_op(name: str, op: str, tensor: Any, ctx: DistContext) -> tuple[Any, bool, str | None]:
    """(torch ReduceOp, divide-afterwards?, problem) for op name `op`."""
    import torch

    if op not in REDUCE_OPS:
        return None, False, f"{name}(op={op!r}) is not supported; use one of {', '.join(REDUCE_OPS)}."
    if op != "mean":
        return _torch_ops()[op], False, None
    if isinstance(tensor, torch.Tensor) and not (tensor.is_floating_point() or tensor.is_complex()):
        return None, False, (f"{name}(op='mean') needs a floating-point tensor, got {tensor.dtype}; "
                             f"cast first (tensor.float()) or use op='sum'.")
    if ctx.backend in NATIVE_AVG:
        return _torch_ops()["avg"], False, None
    if ctx.backend not in _logged_mean:
        _logged_mean.add(ctx.backend)
        logger.info("%s: mean is computed as sum / world_size (no ReduceOp.AVG used on %s)", name, ctx.backend)
    return _torch_ops()["sum"], True, None


class _Fast:
    """What the hot path needs, decided once per context: the torch calls, the reduce ops, whether checks
    run, whether the backend's all-gather takes the stacked output, and the last gloo all-gather target."""

    __slots__ = ("ctx", "checked", "world_size", "ops", "tensor", "on_device", "all_reduce", "broadcast",
                 "all_gather", "reduce_scatter", "stacked", "keeps", "gather", "barrier", "equal")

    def __init__(self, ctx: DistContext) -> None:
        import torch
        import torch.distributed as dist

        ops = _torch_ops()
        self.ctx = ctx
        self.checked = ctx.check and ctx.world_size > 1
        self.world_size = ctx.world_size
        # `mean` is on the fast path only where the backend averages (ReduceOp.AVG) and for float tensors;
        # elsewhere it is a sum divided afterwards, on the checked path
        self.ops = {"sum": ops["sum"], "max": ops["max"], "min": ops["min"]}
        if ctx.backend in NATIVE_AVG:
            self.ops["mean"] = ops["avg"]
        self.tensor = torch.Tensor
        # a tensor on another device than the group reduces is refused on the fast path too (a meta tensor
        # passes gloo silently); `tensor.is_cpu` costs ~50 ns where `tensor.device.type` costs ~300-600
        kind = ctx.device_type
        flag = f"is_{kind}"
        self.on_device = (operator.attrgetter(flag) if hasattr(torch.Tensor, flag)
                          else lambda tensor: tensor.device.type == kind)
        self.all_reduce, self.broadcast = dist.all_reduce, dist.broadcast
        # torch >= 2.15 names the single-tensor forms `*_single`; `*_into_tensor` / `*_tensor` became aliases
        # that call them (one decorated Python frame more, ~0.3 us)
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self.stacked = ctx.backend in STACKED_GATHER
        self.keeps = ctx.backend in SHAPED_GATHER
        # gloo's all-gather: [out, its version after the last call, data pointer, input shape, version bump of
        # one call, out viewed as gloo takes it]
        self.gather: list | None = None
        self.barrier: tuple | None = None  # barrier's descriptor tensors, made on its first call
        self.equal = torch.equal

    def gloo_gather(self, out: Any, tensor: Any) -> None:
        """All-gather into a contiguous `out` in the form gloo takes: gloo compares each dim-0 chunk of the
        output with the input's shape, so a stacked `(world_size, *shape)` out is viewed as
        `(world_size * shape[0], *shape[1:])` (a 0-d input: both flat). On gloo (`keeps`) the view is kept
        for the next call with the same `out` (one view costs ~1-2 us a call), with what
        `all_gather` checks before reusing it: `out`'s version counter as this call left it (any in-place
        change of `out` through its own methods bumps it: `resize_`, `set_`, `t_`, ...), its data pointer
        (`out.data = ...` does not bump the counter), and the input's shape (checked when gloo refuses the
        kept view). Not detected: `out.data = ` a tensor of another layout or dtype over the same memory (same
        pointer, counter kept); give such an `out` a new tensor instead. An `out` made under
        `torch.inference_mode()` is never kept (no version counter)."""
        shape = tensor.shape
        if not shape:
            self.all_gather(out.view(-1), tensor.view(1))
            return
        target = out if out.dim() == 1 and len(shape) == 1 else out.view(self.world_size * shape[0], *shape[1:])
        if not self.keeps or out.is_inference():  # inference tensors have no version counter: nothing to key on
            self.all_gather(target, tensor)
            return
        before = out._version
        self.all_gather(target, tensor)
        after = out._version  # the collective's own bump is learnt here, not assumed
        self.gather = [out, after, out.data_ptr(), shape, after - before, target]

    def gather_new(self, tensor: Any) -> Any:
        """A new `(world_size, *shape)` tensor of every rank's contiguous `tensor` (sizes as arguments, not a
        tuple: torch parses those ~1 us faster). Gloo gets the `(world_size * shape[0], *shape[1:])` form it
        takes, returned as a view (a 0-d input: the flat `(world_size,)` result needs none)."""
        shape, n = tensor.shape, self.world_size
        if self.stacked:
            out = tensor.new_empty(n, *shape)
            self.all_gather(out, tensor)
            return out
        if not shape:
            out = tensor.new_empty(n)
            self.all_gather(out, tensor.view(1))
            return out
        out = tensor.new_empty(n * shape[0], *shape[1:])
        self.all_gather(out, tensor)
        return out.view(n, *shape)

    def forget(self) -> None:
        """Drop the kept all-gather view (it holds the last `out` alive)."""
        self.gather = None


_fast: _Fast | None = None


def _fast_path() -> _Fast:
    """The cached `_Fast` of the current context (rebuilt when `init()` made another one);
    `NotInitializedError` before `init()`. The public calls inline its first test (an identity check)."""
    global _fast
    fast, ctx = _fast, _context._current
    if fast is None or fast.ctx is not ctx:
        if fast is not None:
            fast.forget()
        fast = _fast = _Fast(current())
    return fast


def forget() -> None:
    """Drop what the hot path keeps between calls (the last gloo all-gather view); `shutdown()` calls it."""
    if _fast is not None:
        _fast.forget()


def _refused(ctx: DistContext, name: str, error: Exception, problem: str | None) -> Exception:
    """The error to raise when torch refused a fast-path call: the argument problem hwdist's checks find,
    else a `CollectiveError` for a backend failure, else torch's own error."""
    if problem:
        return CollectiveArgumentError(problem)
    if isinstance(error, RuntimeError):
        return _fail(ctx, name, error)
    return error


def _out_problem(name: str, out: Any, shape: tuple[int, ...], tensor: Any) -> str | None:
    import torch

    if out is None:
        return None
    if not (isinstance(out, torch.Tensor) and tuple(out.shape) == shape and out.dtype == tensor.dtype
            and out.device == tensor.device and out.is_contiguous()):
        got = f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
        return (f"{name}(out=...) must be a contiguous {tensor.dtype} tensor of shape {shape} on {tensor.device}, "
                f"got {got}; pass out=None to get a new tensor.")
    return None


def _all_reduce_problem(ctx: DistContext, tensor: Any, op: Any) -> str | None:
    return _prepare("all_reduce", tensor, ctx) or _reduce_op("all_reduce", op, tensor, ctx)[2]


def _all_gather_problem(ctx: DistContext, tensor: Any, out: Any) -> str | None:
    return _prepare("all_gather", tensor, ctx) or _out_problem("all_gather", out, (ctx.world_size, *tensor.shape),
                                                               tensor)


def _broadcast_problem(ctx: DistContext, tensor: Any, src: Any) -> str | None:
    if not isinstance(src, int) or not 0 <= src < ctx.world_size:
        return _prepare("broadcast", tensor, ctx) or f"broadcast(src={src!r}) must be a rank in 0..{ctx.world_size - 1}."
    return _prepare("broadcast", tensor, ctx)


def _reduce_scatter_problem(ctx: DistContext, tensor: Any, op: Any, out: Any) -> str | None:
    problem = _prepare("reduce_scatter", tensor, ctx) or _reduce_op("reduce_scatter", op, tensor, ctx)[2]
    if problem:
        return problem
    if tensor.dim() == 0 or tensor.shape[0] % ctx.world_size:
        return (f"reduce_scatter: dim 0 of shape {tuple(tensor.shape)} must be divisible by the world size "
                f"{ctx.world_size} (each rank gets one equal chunk); pad or reshape the tensor.")
    return _out_problem("reduce_scatter", out, (tensor.shape[0] // ctx.world_size, *tensor.shape[1:]), tensor)


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, check: bool | None = None) -> torch.Tensor:
    """Reduce `tensor` across ranks in place (`sum`, `mean`, `max`, `min`) and return it."""
    fast = _fast
    if fast is None or fast.ctx is not _context._current:
        fast = _fast_path()
    # the hot path: no checks asked for, a contiguous tensor of the group's device, an op the backend has
    reduce = fast.ops.get(op) if type(op) is str else None
    if (reduce is None or (fast.checked if check is None else check) or not isinstance(tensor, fast.tensor)
            or not fast.on_device(tensor) or not tensor.is_contiguous()
            or (op == "mean" and not tensor.is_floating_point())):
        return _all_reduce_checked(fast.ctx, tensor, op, check)
    try:
        fast.all_reduce(tensor, reduce)
    except Exception as error:
        raise _refused(fast.ctx, "all_reduce", error, _all_reduce_problem(fast.ctx, tensor, op)) from error
    return tensor


def _all_reduce_checked(ctx: DistContext, tensor: Any, op: str, check: bool | None) -> Any:
    import torch.distributed as dist

    problem = _all_reduce_problem(ctx, tensor, op)
    _raise_or_exchange(ctx, "all_reduce", tensor, problem, check, REDUCE_OPS.index(op) if not problem else 0)
    reduce, divide, _ = _reduce_op("all_reduce", op, tensor, ctx)
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    _call(ctx, "all_reduce", lambda: dist.all_reduce(work, op=reduce))
    if divide:
        work.div_(ctx.world_size)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def all_gather(tensor: torch.Tensor, *, out: torch.Tensor | None = None, check: bool | None = None) -> torch.Tensor:
    """Every rank's `tensor`, stacked: shape `(world_size, *tensor.shape)`, row r from rank r.

    A new tensor, or `out` (that shape, contiguous) reused to avoid an allocation per call; with checks off
    any contiguous `out` of `world_size * tensor.numel()` elements is filled as it is (a flat one, say)."""
    fast = _fast
    if fast is None or fast.ctx is not _context._current:
        fast = _fast_path()
    if ((fast.checked if check is None else check) or not isinstance(tensor, fast.tensor)
            or not fast.on_device(tensor) or not tensor.is_contiguous()):
        return _all_gather_checked(fast.ctx, tensor, out, check)
    if out is None:
        try:
            return fast.gather_new(tensor)
        except Exception as error:
            raise _refused(fast.ctx, "all_gather", error, _all_gather_problem(fast.ctx, tensor, None)) from error
    # gloo: the view of `out` it takes is kept while the same out comes back unchanged (see gloo_gather)
    kept = fast.gather
    if not (kept is not None and kept[0] is out and kept[1] == out._version and kept[2] == out.data_ptr()):
        kept = None
        if not (isinstance(out, fast.tensor) and out.is_contiguous()):
            return _all_gather_checked(fast.ctx, tensor, out, check)
    try:
        if kept is not None:
            fast.all_gather(kept[5], tensor)
            kept[1] += kept[4]
        elif fast.stacked:  # nccl, xccl, hccl: the stacked out as it is
            fast.all_gather(out, tensor)
        else:
            fast.gloo_gather(out, tensor)
    except Exception as error:
        if kept is None or kept[3] == tensor.shape:
            raise _refused(fast.ctx, "all_gather", error, _all_gather_problem(fast.ctx, tensor, out)) from error
        fast.gather = None  # kept for an input of another shape, which gloo refused before sending: view anew
        return all_gather(tensor, out=out, check=check)
    return out


def _all_gather_checked(ctx: DistContext, tensor: Any, out: Any, check: bool | None) -> Any:
    import torch
    import torch.distributed as dist

    problem = _all_gather_problem(ctx, tensor, out)
    _raise_or_exchange(ctx, "all_gather", tensor, problem, check)
    source = tensor.contiguous().view(-1)
    if out is None:
        out = torch.empty((ctx.world_size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    target = out.view(-1)  # the flat form: gloo rejects the stacked one
    _call(ctx, "all_gather", lambda: dist.all_gather_into_tensor(target, source))
    return out


def broadcast(tensor: torch.Tensor, src: int = 0, *, check: bool | None = None) -> torch.Tensor:
    """Copy rank `src`'s `tensor` into every rank's `tensor` (same dtype and shape) and return it."""
    fast = _fast
    if fast is None or fast.ctx is not _context._current:
        fast = _fast_path()
    if (type(src) is not int or not 0 <= src < fast.world_size or (fast.checked if check is None else check)
            or not isinstance(tensor, fast.tensor) or not fast.on_device(tensor) or not tensor.is_contiguous()):
        return _broadcast_checked(fast.ctx, tensor, src, check)
    try:
        fast.broadcast(tensor, src)
    except Exception as error:
        raise _refused(fast.ctx, "broadcast", error, _broadcast_problem(fast.ctx, tensor, src)) from error
    return tensor


def _broadcast_checked(ctx: DistContext, tensor: Any, src: Any, check: bool | None) -> Any:
    import torch.distributed as dist

    problem = _broadcast_problem(ctx, tensor, src)
    _raise_or_exchange(ctx, "broadcast", tensor, problem, check, src if not problem else 0)
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    _call(ctx, "broadcast", lambda: dist.broadcast(work, src=src))
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, out: torch.Tensor | None = None,
                   check: bool | None = None) -> torch.Tensor:
    """Reduce `tensor` across ranks and return this rank's chunk of dim 0: shape
    `(tensor.shape[0] // world_size, *tensor.shape[1:])`; dim 0 must divide by the world size.

    A new tensor, or `out` (that shape, contiguous) reused to avoid an allocation per call."""
    fast = _fast
    if fast is None or fast.ctx is not _context._current:
        fast = _fast_path()
    reduce = fast.ops.get(op) if type(op) is str else None
    if (reduce is None or (fast.checked if check is None else check) or not isinstance(tensor, fast.tensor)
            or not fast.on_device(tensor) or not tensor.is_contiguous()
            or (op == "mean" and not tensor.is_floating_point())):
        return _reduce_scatter_checked(fast.ctx, tensor, op, out, check)
    if out is None:
        shape = tensor.shape
        if not shape or shape[0] % fast.world_size:
            return _reduce_scatter_checked(fast.ctx, tensor, op, out, check)  # refused there, with the reason
        out = tensor.new_empty(shape[0] // fast.world_size, *shape[1:])  # sizes as arguments: ~1 us less than a tuple
    elif not (isinstance(out, fast.tensor) and out.is_contiguous()):
        return _reduce_scatter_checked(fast.ctx, tensor, op, out, check)
    try:
        fast.reduce_scatter(out, tensor, reduce)
    except Exception as error:
        raise _refused(fast.ctx, "reduce_scatter", error, _reduce_scatter_problem(fast.ctx, tensor, op, out)) from error
    return out


def _reduce_scatter_checked(ctx: DistContext, tensor: Any, op: str, out: Any, check: bool | None) -> Any:
    import torch
    import torch.distributed as dist

    problem = _reduce_scatter_problem(ctx, tensor, op, out)
    _raise_or_exchange(ctx, "reduce_scatter", tensor, problem, check, REDUCE_OPS.index(op) if not problem else 0)
    reduce, divide, _ = _reduce_op("reduce_scatter", op, tensor, ctx)
    source = tensor.contiguous()
    if out is None:
        out = torch.empty((tensor.shape[0] // ctx.world_size, *tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
    _call(ctx, "reduce_scatter", lambda: dist.reduce_scatter_tensor(out, source, op=reduce))
    if divide:
        out.div_(ctx.world_size)
    return out


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, as a list indexed by rank (pickle: trust your peers)."""
    import torch
    import torch.distributed as dist

    ctx = current()
    data = pickle.dumps(obj)
    if ctx.world_size == 1:
        return [pickle.loads(data)]  # a copy, as other ranks would get
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(ctx.device)
    rows = _exchange(ctx, "all_gather_object", None, payload.numel(), same_extra=False)
    lengths = [r[3] for r in rows]
    longest = max(lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=ctx.device)
    padded[: payload.numel()] = payload
    out = torch.empty(ctx.world_size * longest, dtype=torch.uint8, device=ctx.device)
    _call(ctx, "all_gather_object", lambda: dist.all_gather_into_tensor(out, padded))
    rows = out.view(ctx.world_size, longest).cpu()
    return [pickle.loads(bytes(rows[i, : lengths[i]].numpy())) for i in range(ctx.world_size)]


def barrier() -> None:
    """Wait until every rank arrives (a descriptor exchange, so it also times out cleanly, and a peer in
    another checked collective is a `CollectiveMismatchError`). Its tensors are made once per context."""
    fast = _fast
    if fast is None or fast.ctx is not _context._current:
        fast = _fast_path()
    if fast.world_size == 1:
        return
    if fast.barrier is None:
        fast.barrier = _barrier_tensors(fast.ctx)
    mine, gathered, expected = fast.barrier
    try:
        fast.all_gather(gathered, mine)
    except RuntimeError as error:
        raise _fail(fast.ctx, "barrier", error) from error
    if not fast.equal(gathered, expected):
        _compare(fast.ctx, "barrier", gathered.view(fast.world_size, DESCRIPTOR_LENGTH).cpu().tolist(), {})


def _barrier_tensors(ctx: DistContext) -> tuple[Any, Any, Any]:
    """(this rank's barrier descriptor, the buffer every rank's lands in, what it holds when all are in barrier)."""
    import torch

    row = [0] * DESCRIPTOR_LENGTH
    row[0] = _OP_CODES["barrier"]
    mine = torch.tensor(row, dtype=torch.int64, device=ctx.device)
    return mine, torch.empty(ctx.world_size * DESCRIPTOR_LENGTH, dtype=torch.int64, device=ctx.device), \
        mine.repeat(ctx.world_size)
