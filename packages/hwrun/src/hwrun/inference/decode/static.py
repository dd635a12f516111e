"""Decoding with no host work per token: a static KV cache, one decode step captured as a
device graph (CUDA graphs on NVIDIA and ROCm, XPU graphs on Intel GPUs, HPU graphs on Gaudi in lazy
mode), replayed once per token.

Why: at batch 1 `model.generate` is bound by Python and kernel-launch overhead, not by memory
bandwidth (the baseline in docs/benchmarks/decode.md: 4% of roofline). Here every per-token
input lives in a fixed device buffer: the token, its position, the output row; Transformers'
`StaticLayer` keeps its write position in a device tensor (`cumulative_length`, cache_utils.py),
so the step `forward -> argmax -> copy into buffers -> position += 1` has fixed shapes and
addresses and is captured once. Sampling (temperature, top-p, top-k, a seed per row) runs inside
the step from per-row tensors and counter-based noise (hwrun.inference.decode.sampling), captured
as a second graph the first time a call samples. The host only calls `graph.replay()` N times (and checks for EOS
every `check_every` tokens). Graphs, streams and synchronisation come from the model's platform
(`hwenv.platforms.runtime.graph_tools` / `synchronize`); where it has none (CPU, MPS, Gaudi in
eager mode, where the step may be compiled with `hpu_backend` instead; never compiled in lazy mode)
the same step runs eagerly, which is how CPU tests prove that its tokens equal
`model.generate(do_sample=False)`'s. The Gaudi and XPU fakes of hwenv.testing record and replay
captured ops, so the capture path is tested on CPU too (tests/test_hwrun_decode_graph_fakes.py).
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import FastDecodeError
from .sampling import SamplingParams, SamplingRows, next_tokens

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


#: "fused": hwrun.inference.decode.fused_step (llama/mistral/qwen2); "model": the model's own forward over a StaticCache;
#: "auto": fused where it applies, else the model's forward (logged).
STEPS = ("auto", "fused", "model")


def cache_keyword(model: Any) -> str:
    """The KV-cache keyword of `model.forward`: `cache` from Transformers 5.25 (`past_key_values` still
    works there, with a deprecation warning, until 5.40), `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


class GraphDecoder:
    """Static-cache decoder (greedy, or sampled per row) for `model` at a fixed batch size and cache length.

    `use_graphs=None` captures a graph where the model's platform (`platform`, default: the one of
    `model.device`) has graph tools the decoder drives (CUDA, XPU, or HPU graphs in Gaudi's lazy mode); `compile_backend`
    compiles the step with torch.compile first (fuses the small ops; the graph is then captured over
    the compiled code). One decoder serves many prompts as long as `prompt + new tokens <= max_cache_len`.
    """

    def __init__(self, model: Any, *, batch_size: int = 1, max_cache_len: int, use_graphs: bool | None = None,
                 compile_backend: Any = None, compile_mode: str | None = None, check_every: int = 32,
                 step: str = "auto", tune: bool = False, platform: Any = None) -> None:
        import torch
        from transformers import StaticCache

        from .fused_step import FusedLlamaStep, fused_step_support

        self.platform = model_platform(model, platform)
        check_compile_allowed(self.platform, compile_backend)
        self.graph_tools = decoder_graph_tools(self.platform) if use_graphs is not False else None
        check_decoder_args(model, batch_size, max_cache_len, use_graphs, self.graph_tools, self.platform)
        self.model = model
        self.device = model.device
        self.batch_size = batch_size
        self.max_cache_len = max_cache_len
        self.check_every = max(1, check_every)
        self.use_graphs = self.graph_tools is not None if use_graphs is None else use_graphs
        if step not in STEPS:
            raise FastDecodeError(f"step={step!r} is not a decode step; use one of {', '.join(STEPS)}.")
        unsupported = fused_step_support(model) if step != "model" else "step='model' given"
        if step == "fused" and unsupported:
            raise FastDecodeError(f"step='fused' cannot run {type(model).__name__}: {unsupported}. Use step='model'.")
        self.fused = None
        self.cache = None
        if unsupported is None:
            self.fused = FusedLlamaStep(model, batch_size=batch_size, max_cache_len=max_cache_len)
            self.step_reason = ("fused: q/k/v and gate/up read as one matrix each (the model's weights are views "
                                "into them: no second copy), plain K/V tensors")
        else:
            self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
            self.cache_keyword = cache_keyword(model)
            self.step_reason = f"model forward over a StaticCache ({unsupported})"
            if step == "auto":
                logger.info("graph decode runs the model's own forward: the fused step does not apply (%s)",
                            unsupported)
        long = dict(dtype=torch.long, device=self.device)
        self.token = torch.zeros((batch_size, 1), **long)
        self.position = torch.zeros((batch_size, 1), **long)
        self.count = torch.zeros((batch_size, 1), **long)  # tokens produced so far (the sampling noise's counter)
        self.tokens = torch.zeros((batch_size, max_cache_len + 1), **long)
        self.sampling = SamplingRows(batch_size, self.device)
        self._filter = FilterChoice()  # the sampled step's filter (see with_filter_fallback)
        self.sampling_fallback: str | None = None  # why the filter runs eagerly in the compiled step, if it does
        self._step_fns = {sample: compile_step(lambda s=sample: self._step(s), compile_backend, compile_mode, tune)
                          for sample in (False, True)}
        if compile_backend is not None:
            self._step_fns[True] = with_filter_fallback(self._step_fns[True], self._filter, self)
        self._step_fn = self._step_fns[False]  # the greedy step (kept under its old name)
        self.graphs: dict[bool, Any] = {}
        self.capture_seconds: float | None = None

    @property
    def graph(self) -> Any:
        """The captured greedy step (None before capture or without graphs)."""
        return self.graphs.get(False)

    def _step(self, sample: bool = False) -> None:
        """One decode step: every input and output is a fixed device buffer (capturable). `sample` picks
        tokens with each row's sampling parameters (hwrun.inference.decode.sampling), else the argmax."""
        if self.fused is not None:
            last = self.fused(self.token, self.position)
        else:
            last = self.model(input_ids=self.token, position_ids=self.position, **{self.cache_keyword: self.cache},
                              use_cache=True, logits_to_keep=1).logits[:, -1]
        if sample:
            nxt = next_tokens(last, *self.sampling.all(), self.count, filter=self._filter.filter).unsqueeze(-1)
            self.count.add_(1)  # the noise counter (greedy steps need none; the prefill resets it)
        else:
            nxt = last.argmax(dim=-1, keepdim=True)
        self.token.copy_(nxt)
        self.position.add_(1)
        self.tokens.index_copy_(1, self.position[0], nxt)

    def _prefill(self, input_ids: Any) -> int:
        import torch

        batch, length = input_ids.shape
        positions = torch.arange(length, device=self.device).unsqueeze(0).expand(batch, length)
        if self.fused is not None:
            last = self.fused(input_ids, positions)
        else:
            self.cache.reset()
            last = self.model(input_ids=input_ids, position_ids=positions, **{self.cache_keyword: self.cache},
                              use_cache=True, logits_to_keep=1).logits[:, -1]
        if self.sampling.sampling():
            first = next_tokens(last, *self.sampling.all(), torch.zeros_like(self.count)).unsqueeze(-1)
        else:
            first = last.argmax(dim=-1, keepdim=True)
        self.token.copy_(first)
        self.position.fill_(length)  # the position of `token`
        self.count.fill_(1)
        self.tokens.zero_()
        self.tokens[:, length:length + 1].copy_(first)
        return length

    def _step_buffers(self) -> list[Any]:
        """What one step moves (tokens, positions, counters, cache lengths): restored after capture warm-ups."""
        return [self.token, self.position, self.count, *self._cache_lengths()]

    def _cache_lengths(self) -> list[Any]:
        # the fused step writes K/V at the position buffer's value: nothing else moves
        return [] if self.cache is None else [layer.cumulative_length for layer in self.cache.layers]

    def _runner(self, sample: bool) -> Any:
        """The callable that runs one step: its captured graph (captured now if needed) or the step itself."""
        if not self.use_graphs:
            return self._step_fns[sample]
        if sample not in self.graphs:
            # capture restores every buffer the warm-up steps moved
            self.graphs[sample], seconds = capture_graph(self._step_fns[sample], self.device, self._step_buffers(),
                                                         tools=self.graph_tools, platform=self.platform)
            self.capture_seconds = (self.capture_seconds or 0.0) + seconds
        return self.graphs[sample].replay

    def generate(self, input_ids: Any, max_new_tokens: int, *, eos_token_id: Any = "model",
                 sampling: SamplingParams | None = None, streamer: Any = None) -> Any:
        """New tokens after `input_ids` (batch, length): a (batch, <= max_new_tokens) tensor; greedy unless
        `sampling` (one `SamplingParams` for every row) says otherwise.

        Stops early (at a `check_every` boundary) once every row has produced an EOS; tokens after a
        row's EOS are whatever decoding continued with, so callers cut at the first EOS.
        `streamer` (Transformers' protocol: `put(tensor)`, `end()`; batch 1 only) gets the prompt first,
        as `model.generate` gives it, then the new tokens as they are produced: the first right after
        the prefill, then each `check_every` chunk (cut after the first EOS), then `end()`.
        """
        import torch

        sampling = SamplingParams() if sampling is None else sampling
        if input_ids.dim() != 2 or input_ids.shape[0] != self.batch_size:
            raise FastDecodeError(f"input_ids of shape {tuple(input_ids.shape)}: expected ({self.batch_size}, length).")
        if streamer is not None and self.batch_size != 1:
            raise FastDecodeError(f"a streamer takes one row; this decoder has batch_size={self.batch_size}. "
                                  "Stream one prompt at a time.")
        length = input_ids.shape[1]
        if max_new_tokens <= 0:
            raise FastDecodeError(f"max_new_tokens={max_new_tokens} must be positive.")
        if length + max_new_tokens > self.max_cache_len:
            raise FastDecodeError(
                f"prompt length {length} + max_new_tokens {max_new_tokens} exceeds max_cache_len={self.max_cache_len}; "
                "build the decoder with a larger max_cache_len."
            )
        ids = eos_ids(self.model, eos_token_id)
        eos = torch.tensor(ids, device=self.device) if ids else None
        stream = _Stream(streamer, self.tokens, length, set(ids)) if streamer is not None else None
        if stream is not None:
            streamer.put(input_ids.cpu())
        with torch.inference_mode():
            self.sampling.fill(sampling)
            self._prefill(input_ids.to(self.device))
            run = self._runner(not sampling.greedy) if max_new_tokens > 1 else None
            done = 1
            if stream is not None:
                stream.flush(done)
            while done < max_new_tokens and not (stream is not None and stream.stopped):
                chunk = min(self.check_every, max_new_tokens - done)
                for _ in range(chunk):
                    run()
                done += chunk
                if stream is not None:
                    stream.flush(done)  # the chunk's tokens, read once: also the EOS check of the one row
                elif eos is not None and done < max_new_tokens:
                    produced = self.tokens[:, length:length + done]
                    if bool(torch.isin(produced, eos).any(dim=1).all()):
                        break
            out = self.tokens[:, length:length + done].clone()
        if streamer is not None:
            streamer.end()
        return out


class _Stream:
    """Hands one row's new tokens to a streamer as chunks are read, up to and including its first EOS."""

    def __init__(self, streamer: Any, tokens: Any, start: int, eos: set[int]) -> None:
        self.streamer, self.tokens, self.start, self.eos = streamer, tokens, start, eos
        self.sent = 0
        self.stopped = False

    def flush(self, done: int) -> None:
        """Put tokens `sent..done` (one device read), stopping after an EOS."""
        if self.stopped or done <= self.sent:
            return
        fresh = self.tokens[0, self.start + self.sent:self.start + done].cpu()
        hit = next((i for i, t in enumerate(fresh.tolist()) if t in self.eos), None)
        if hit is not None:
            fresh, self.stopped = fresh[: hit + 1], True
        self.sent = done
        self.streamer.put(fresh)


def eos_ids(model: Any, eos_token_id: Any) -> list[int]:
    """The stop tokens: `eos_token_id` (an id, a list, or None for none), or the model's own for "model"."""
    if eos_token_id == "model":
        eos_token_id = model.generation_config.eos_token_id
    if eos_token_id is None:
        return []
    return [int(t) for t in eos_token_id] if isinstance(eos_token_id, (list, tuple)) else [int(eos_token_id)]


def check_decoder_args(model: Any, batch_size: int, max_cache_len: int, use_graphs: bool | None,
                       tools: Any = None, platform: Any = None) -> None:
    """Reject (FastDecodeError) what a static-cache graph decoder cannot run, before anything is built.
    `use_graphs=True` needs graph `tools` (from `decoder_graph_tools`) for a model on `platform`'s device."""
    if max_cache_len <= 1:
        raise FastDecodeError(f"max_cache_len={max_cache_len} must exceed 1 (prompt length + new tokens).")
    if batch_size <= 0:
        raise FastDecodeError(f"batch_size={batch_size} must be positive.")
    if use_graphs and (tools is None or platform is None or platform.device_type != model.device.type):
        api = "none" if platform is None else f"{platform.kind}: {platform.graph_api}"
        raise FastDecodeError(f"use_graphs=True needs a model on a device with CUDA or XPU graphs (or Gaudi's HPU "
                              f"graphs in lazy mode); this one is on "
                              f"{model.device} (graph API {api}). Pass use_graphs=None or False.")
    reason = attention_blocker(model, max_cache_len)
    if reason is not None:
        raise FastDecodeError(f"{type(model).__name__} {reason}; the graph decoder attends over the whole cache. "
                              "Use decode='generate'.")


def attention_blocker(model: Any, max_cache_len: int) -> str | None:
    """Why the decoders' full attention over `max_cache_len` positions would differ from the model's, or None.
    Sliding-window layers are fine when the window covers the whole cache (every cached key is inside it)."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    kinds = set(getattr(config, "layer_types", None) or ())
    other = sorted(kinds - {"full_attention", "sliding_attention"})
    if other:
        return f"has {', '.join(other)} layers"
    if (window or "sliding_attention" in kinds) and not (window and window >= max_cache_len):
        return (f"uses sliding-window attention (window {window}) shorter than max_cache_len={max_cache_len}")
    return None


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
    """`compiled` (a decoder's sampled step), retried once with its top-k/top-p filter out of the compiled graph
    (eager, still inside the device graph) if compiling it fails: on an H200 (torch 2.11) Inductor failed on the
    filter of an 8-row sampled step ("list indices must be integers or slices, not NoneType"). Sets `choice.filter`
    and the decoder's `sampling_fallback` (the error) and logs it. Until the step has run once, the decoder's step
    buffers (`decoder._step_buffers()`) are kept and restored before the retry (a graph before a graph break may have
    run); a recompile that fails later falls back too, without them. Any other error propagates."""
    def run() -> None:
        kept = [] if run.ran else [(buffer, buffer.clone()) for buffer in decoder._step_buffers()]
        try:
            compiled()
        except Exception as error:  # noqa: BLE001 - only compile failures are taken, the rest re-raised
            if choice.filter is not None or not _is_compile_failure(error):
                raise
            import torch

            from .sampling import filter_logits

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
