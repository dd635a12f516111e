"""The capture and compile toolkit of hwrun's step runners: which platform a model runs on, the platform's graph
tools, torch.compile of a step (and the sampled step's fallback when the compile of its filter fails), and the
capture of one step as a device graph (CUDA graphs on NVIDIA and ROCm, XPU graphs on Intel GPUs, HPU graphs on
Gaudi in lazy mode), and the warm-up that captures or compiles every bucket of the engine's runner before the first
request, reporting each bucket as it is done (`warm_buckets`, `BucketWarmed`). Used by the engine's runner
(`hwrun.inference.engine.runner`) and the static-batch runner (`hwrun.inference.decode.static.GraphDecoder`).

A step handed to this module moves fixed buffers only (tokens, positions, counters); its owner lists them in
`step_buffers()`, which capture warm-ups and a compile fallback restore. Where the platform has no graph tools
(CPU, MPS, Gaudi in eager mode) the step runs eagerly; the Gaudi and XPU fakes of hwenv.testing record and replay
captured ops, so capture is tested on CPU too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import FastDecodeError

logger = logging.getLogger(__name__)

#: The platform graph APIs the decoders capture with (`runtime.graph_tools` returns tools for them):
#: CUDA graphs (NVIDIA, ROCm), XPU graphs, and Gaudi's HPU graphs, which the bridge records in lazy
#: mode only (hwenv returns no tools in eager mode, where the step runs eagerly, compiled with
#: `hpu_backend` when the plan compiles).
CAPTURE_APIS = ("cuda_graphs", "xpu_graphs", "hpu_graphs")


def model_platform(model: Any, platform: Any = None) -> Any:
    """The `hwenv.Platform` the decoders use for `model`: `platform` if given, else the platform of
    `model.device`'s type here (NVIDIA or AMD for "cuda": the one hwenv detects)."""
    if platform is not None:
        return platform
    import hwenv

    from ...devices import kind_of_device_type

    return hwenv.get_platform(kind_of_device_type(model.device.type))


def decoder_graph_tools(platform: Any) -> Any:
    """The platform's `GraphTools` (graph class, capture, streams) when the decoders can capture with
    them, else None (no graph API hwrun drives, this torch lacks its classes, Gaudi without the bridge
    or in eager mode; logged)."""
    if platform.graph_api not in CAPTURE_APIS:
        return None
    from hwenv.platforms import runtime

    try:
        tools = runtime.graph_tools(platform)
    except (AttributeError, ImportError) as error:
        logger.info("no %s in this torch (%s): decoding eagerly", platform.graph_api, error)
        return None
    if tools is None:
        logger.info("%s: no %s that capture here (Gaudi: the bridge records HPU graphs in lazy mode only): "
                    "decoding eagerly", platform.kind, platform.graph_api)
    return tools


def check_compile_allowed(platform: Any, backend: Any) -> None:
    """Refuse (FastDecodeError) to compile the step where the platform runs a lazy mode that forbids it:
    Gaudi compiles only in eager mode (`hwcompile.check_compile_mode`, G2); HPU graphs serve lazy mode."""
    if backend is None or platform.lazy_mode_variable is None:
        return
    import hwcompile

    try:
        hwcompile.check_compile_mode(platform)
    except hwcompile.HwcompileError as error:
        raise FastDecodeError(f"compile_backend={backend!r}: {error}") from error


def _is_compile_failure(error: BaseException) -> bool:
    """Whether `error` came from torch.compile's backend (Inductor), not from running the step."""
    import sys

    failures = [getattr(sys.modules.get("torch._dynamo.exc"), "BackendCompilerFailed", None),
                getattr(sys.modules.get("torch._inductor.exc"), "InductorError", None)]  # loaded if they raised
    return isinstance(error, tuple(kind for kind in failures if kind is not None))


class FilterChoice:
    """The top-k/top-p filter one compiled sampled step passes to `next_tokens`: None (the default one, compiled
    with the step) until compiling the step fails, then an eager one (see `with_filter_fallback`). One per step,
    so one step falling back does not invalidate (recompile) the others."""

    __slots__ = ("filter",)

    def __init__(self) -> None:
        self.filter: Any = None


def with_filter_fallback(compiled: Any, choice: FilterChoice, decoder: Any) -> Any:
    """`compiled` (the sampled step of `decoder`, a runner), retried once with its top-k/top-p filter out of the compiled graph
    (eager, still inside the device graph) if compiling it fails: on an H200 (torch 2.11) Inductor failed on the
    filter of an 8-row sampled step ("list indices must be integers or slices, not NoneType"). Sets `choice.filter`
    and the decoder's `sampling_fallback` (the error) and logs it. Until the step has run once, the decoder's step
    buffers (`decoder.step_buffers()`) are kept and restored before the retry (a graph before a graph break may have
    run); a recompile that fails later falls back too, without them. Any other error propagates."""
    def run() -> None:
        kept = [] if run.ran else [(buffer, buffer.clone()) for buffer in decoder.step_buffers()]
        try:
            compiled()
        except Exception as error:  # noqa: BLE001 - only compile failures are taken, the rest re-raised
            if choice.filter is not None or not _is_compile_failure(error):
                raise
            import torch

            from ..decode.sampling import filter_logits

            for buffer, value in kept:
                buffer.copy_(value)
            root = error
            for _ in range(8):  # the backend's own error, under torch.compile's wrappers
                root = getattr(root, "inner_exception", None) or root.__cause__ or root
            said = (str(root).strip().splitlines() or [""])[0][:200]
            decoder.sampling_fallback = f"{type(error).__name__} ({type(root).__name__}: {said})"
            logger.warning("compiling a sampled %s step failed (%s); its top-k/top-p filter runs eagerly from now "
                           "on (the rest stays compiled)", type(decoder).__name__, decoder.sampling_fallback)
            choice.filter = torch.compiler.disable(filter_logits)
            compiled()
        run.ran = True

    run.ran = False
    return run


def compile_step(step: Any, backend: Any, mode: str | None, tune: bool = False) -> Any:
    """`step` compiled with `backend` (None: `step` itself), static shapes.

    `tune=True` adds inductor's coordinate-descent tuning of its matrix-vector reductions. It is off
    by default: on an H200 at batch 1 it gave +13% tokens/s in one run (938 vs 829) and -4% in
    another (791 vs 827, docs/benchmarks/decode.md) for 2.5x the warm-up (~60 s instead of ~25 s).
    It is a per-call option, so no global inductor config changes; torch.compile takes either a mode
    or options, so a given mode turns it off.
    """
    import torch

    if backend is None:
        return step
    options = {"coordinate_descent_tuning": True} if tune and mode is None else None
    return torch.compile(step, backend=backend, mode=mode, fullgraph=False, dynamic=False, options=options)


def capture_graph(step: Any, device: Any, buffers: list[Any], *, tools: Any = None,
                  platform: Any = None) -> tuple[Any, float]:
    """(device graph of one `step()`, seconds taken): three warm-up steps on a side stream, then the
    capture; every tensor in `buffers` (what a step moves: tokens, positions, counters) is restored.

    `tools` are the platform's `GraphTools` (default: those of `platform`, or of `device`'s platform):
    CUDA's `Stream` / `CUDAGraph` / `graph`, or XPU's `Stream` / `XPUGraph` / `graph`, from torch's device module.
    """
    import time

    import hwenv
    from hwenv.platforms import runtime

    from ...devices import kind_of_device_type

    if platform is None:
        platform = hwenv.get_platform(kind_of_device_type(getattr(device, "type", str(device).split(":")[0])))
    tools = tools if tools is not None else decoder_graph_tools(platform)
    if tools is None:
        raise FastDecodeError(f"cannot capture a graph on {device}: {platform.kind} has no CUDA, XPU or HPU graphs "
                              f"(graph API {platform.graph_api}); decode eagerly (use_graphs=False).")
    start = time.perf_counter()
    saved = [b.clone() for b in buffers]
    stream = tools.stream_class(device=device)
    stream.wait_stream(tools.current_stream(device))
    with tools.use_stream(stream):
        for _ in range(3):
            step()
    tools.current_stream(device).wait_stream(stream)
    graph = tools.graph_class()
    with tools.capture(graph):
        step()
    for buffer, value in zip(buffers, saved, strict=True):
        buffer.copy_(value)
    runtime.synchronize(platform, device)
    seconds = time.perf_counter() - start
    logger.info("captured the decode step as a graph (%s) in %.2fs", platform.graph_api, seconds)
    return graph, seconds


@dataclass(frozen=True)
class BucketWarmed:
    """One (rows, cache length) bucket warmed at start: bucket `index` of `total`, its shape, how many step kinds were
    captured as graphs or compiled now (`how`; 0 when all were warm already), and the seconds it took."""

    index: int
    total: int
    rows: int
    columns: int
    steps: int
    how: str
    seconds: float

    def line(self) -> str:
        """One progress line: `warm-up: bucket 3/6 (2 rows x 40 cache positions): 6 HPU graphs captured in 0.41 s`."""
        rows = f"{self.rows} row{'s' if self.rows != 1 else ''}"
        done = f"{self.steps} {self.how} in {self.seconds:.2f} s" if self.steps else "warm already"
        return f"warm-up: bucket {self.index}/{self.total} ({rows} x {self.columns} cache positions): {done}"


#: How `BucketWarmed.how` names what was warmed, per graph API (and for a compiled step without graphs).
WARM_NAMES = {"cuda_graphs": "CUDA graphs captured", "xpu_graphs": "XPU graphs captured",
              "hpu_graphs": "HPU graphs captured", None: "compiled steps"}


def warm_buckets(runner: Any, buckets: Sequence[int], cache_buckets: Sequence[int], kinds: Sequence[int],
                 progress: Callable[[BucketWarmed], None] | None = None) -> list[BucketWarmed]:
    """Capture (where `runner.use_graphs`) or compile (where `runner.compiled`) every step kind of every (rows, cache
    length) bucket of `runner`, bucket by bucket in ascending shape; each bucket done is logged and told to
    `progress`. An eager, uncompiled runner has nothing to warm: it reports nothing and returns []."""
    import torch

    if not runner.use_graphs and not runner.compiled:
        for key in ((k, r, c) for k in kinds for r in buckets for c in cache_buckets):
            runner.warmed.add(key)
        return []
    api = getattr(runner.graph_tools, "api", None) if runner.use_graphs else None
    how = WARM_NAMES.get(api, f"{api} graphs captured")
    shapes = [(rows, columns) for rows in buckets for columns in cache_buckets]
    done = []
    with torch.inference_mode():
        for index, (rows, columns) in enumerate(shapes, 1):
            start, steps = time.perf_counter(), 0
            for key in ((kind, rows, columns) for kind in kinds):
                if runner.use_graphs and key not in runner.graphs:
                    runner.runnable(*key)
                    steps += 1
                elif not runner.use_graphs and key not in runner.warmed:
                    saved = [(buffer, buffer.clone()) for buffer in runner.step_buffers()]
                    runner.step_function(*key)()
                    for buffer, value in saved:
                        buffer.copy_(value)
                    steps += 1
                runner.warmed.add(key)
            warmed = BucketWarmed(index, len(shapes), rows, columns, steps, how, time.perf_counter() - start)
            logger.info("%s", warmed.line())
            if progress is not None:
                progress(warmed)
            done.append(warmed)
    return done
