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
(`hwenv.platforms.runtime.graph_tools` / `synchronize`, through hwrun.inference.engine.graphs, the capture
toolkit this decoder shares with hwrun's engine); where it has none (CPU, MPS, Gaudi in
eager mode, where the step may be compiled with `hpu_backend` instead; never compiled in lazy mode)
the same step runs eagerly, which is how CPU tests prove that its tokens equal
`model.generate(do_sample=False)`'s. The Gaudi and XPU fakes of hwenv.testing record and replay
captured ops, so the capture path is tested on CPU too (tests/test_hwrun_decode_graph_fakes.py).
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import FastDecodeError
from ..engine.graphs import (
    FilterChoice,
    capture_graph,
    check_compile_allowed,
    compile_step,
    decoder_graph_tools,
    model_platform,
    with_filter_fallback,
)
from ..engine.requests import eos_ids
from ..engine.steps import STEPS, cache_keyword, check_decoder_args
from .sampling import SamplingParams, SamplingRows, next_tokens

logger = logging.getLogger(__name__)


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

    def step_buffers(self) -> list[Any]:
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
            self.graphs[sample], seconds = capture_graph(self._step_fns[sample], self.device, self.step_buffers(),
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
        if sampling.processed:
            raise FastDecodeError("the static GraphDecoder samples with temperature, top-k, top-p and a seed only; "
                                  "min_p, penalties, logit_bias and logprobs run in hwrun's engine (EngineCore, "
                                  "generate(batching='continuous')).")
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
