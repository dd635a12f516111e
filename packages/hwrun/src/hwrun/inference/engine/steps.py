"""The engine's two step implementations behind one interface, and which of them runs a model.

`FusedStep` is hwrun.inference.decode.fused_step (Llama, Mistral, Qwen2: q/k/v and gate/up read as one matrix each)
over the KV-cache manager's paged K/V (its block pool, through each row's block table); `ModelStep` runs the model's
own forward over a `SlotCache` (hwrun.inference.decode.slot_cache: each row's K/V written at that row's position
through its block table, a 4D mask per row, per-row
`position_ids`), so any family whose attention goes through Transformers' attention interface with sdpa or eager
attention runs. Both answer:

- `select(rows, columns)`: outside any compiled or captured region, what the next decode steps run over;
- `decode(token, position, columns) -> logits`: one decode step of the first rows (fixed buffers only: capturable);
- `prefill(prompts, rows) -> logits`: prompts starting at position 0, padded into one forward, into cache `rows`;
- `extend(tokens, row, offset) -> logits`: a chunk continuing one row's prompt at positions `offset..`.

`slot_step_support` picks the step ("auto": fused where it applies, an optimisation, else the model's own forward);
`check_decoder_args` and `attention_blocker` refuse what no step of hwrun's runners can run.
"""

from __future__ import annotations

from typing import Any

from ...errors import FastDecodeError

#: "fused": the fused Llama-family step (llama/mistral/qwen2); "model": the model's own forward; "auto": fused
#: where it applies, else the model's forward (logged).
STEPS = ("auto", "fused", "model")

FUSED_REASON = "the fused Llama-family step (q/k/v and gate/up as one matrix each, per-row K/V writes)"


def slot_step_support(model: Any, step: str = "auto", max_cache_len: int | None = None) -> tuple[str | None, str]:
    """(step, reason): which step the engine runs `model` with for `step` ("auto", "fused" or "model"):
    "fused" where `fused_step_support` says it applies (an optimisation), else "model", the model's own
    forward over a `SlotCache` with per-row positions and masks; (None, why neither can) otherwise, e.g. a
    RoPE whose frequencies depend on the batch's longest row (`slot_cache.rope_blocker`, for `max_cache_len`)."""
    from ..decode.fused_step import fused_step_support
    from ..decode.slot_cache import model_step_support, rope_blocker

    if step not in STEPS:
        raise FastDecodeError(f"step={step!r} is not a decode step; use one of {', '.join(STEPS)}.")
    rope = rope_blocker(model.config, max_cache_len)
    if rope is not None:
        return None, f"neither slot step runs {type(model).__name__}: {rope}"
    window = None if max_cache_len is None else attention_blocker(model, max_cache_len)
    if window is not None:  # the question check_decoder_args asks at build, asked before it
        return None, f"neither slot step runs {type(model).__name__}: it {window} (the steps attend over every position)"
    unfused = fused_step_support(model) if step != "model" else None
    if step != "model" and unfused is None:
        return "fused", FUSED_REASON
    if step == "fused":
        return None, f"step='fused' cannot run {type(model).__name__}: {unfused}. Use step='model' or 'auto'"
    own = model_step_support(model)
    why = "step='model' given" if step == "model" else f"the fused step does not apply: {unfused}"
    if own is not None:
        return None, f"the model's own forward cannot run here ({own}; {why})"
    return "model", f"the model's own forward over a per-row slot cache ({why})"


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


def prefill_attention() -> Any:
    """A context in which a prefill forward's attention may use every SDPA backend but cuDNN's. cuDNN attention builds
    a plan per shape, and prefill shapes change with every prompt width and chunk: on an H100 (torch 2.11, bf16) each
    new shape cost ~39 ms, against ~0.05 ms (flash, causal) and ~0.4 ms (memory-efficient, masked) once the kernels
    were loaded. Decode steps keep cuDNN where it is chosen: their shapes are fixed (one plan per bucket, at capture)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "OVERRIDEABLE", "MATH")  # OVERRIDEABLE: XPU's and others'
    return sdpa_kernel([getattr(SDPBackend, name) for name in names if hasattr(SDPBackend, name)])


def cache_keyword(model: Any) -> str:
    """The KV-cache keyword of `model.forward`: `cache` from Transformers 5.25 (`past_key_values` still
    works there, with a deprecation warning, until 5.40), `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def padded(prompts: list[list[int]], left: bool, transfers: Any) -> tuple[Any, Any]:
    """(ids, lengths) on the device of `transfers` (`transfers.Transfers`: no stream synchronize): `prompts` padded
    with 0 to the longest, on the left or the right."""
    import torch

    lengths = [len(p) for p in prompts]
    width = max(lengths)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        start = width - len(prompt) if left else 0
        ids[row, start:start + len(prompt)] = torch.tensor(prompt, dtype=torch.long)
    return transfers.to_device(ids), transfers.to_device(lengths)


class FusedStep:
    """The fused Llama-family step over the KV manager's paged K/V (prompts right-padded)."""

    name = "fused"

    def __init__(self, model: Any, kv: Any, position: Any, adapters: Any = None) -> None:
        from ..decode.fused_step import FusedLlamaStep

        self.device = model.device
        self.kv = kv
        self.fused = FusedLlamaStep(model, batch_size=kv.slots, max_cache_len=kv.max_cache_len,
                                    per_row_positions=True, storage=kv)

    def select(self, rows: int, columns: int) -> None:
        """Nothing to tell: the fused step reads the rows and columns from its inputs."""

    def decode(self, token: Any, position: Any, columns: int) -> Any:
        """Logits of one decode step of the first `token.shape[0]` rows, attending over `columns` positions."""
        return self.fused(token, position, columns=columns)

    def prefill(self, prompts: list[list[int]], rows: Any) -> Any:
        """Each prompt's last-token logits; their K/V into cache `rows` from column 0."""
        import torch

        ids, lengths = padded(prompts, False, self.kv.transfers)
        width = ids.shape[1]
        positions = torch.arange(width, device=self.device).unsqueeze(0).expand(len(prompts), width)
        return self.fused(ids, positions, rows=rows, last_index=lengths - 1)

    def extend(self, tokens: list[int], row: int, offset: int) -> Any:
        """The last-token logits of `tokens`, continuing row `row`'s prompt at positions `offset..`."""
        import torch

        ids, rows = self.kv.transfers.to_device([tokens]), self.kv.transfers.to_device([row])
        positions = torch.arange(offset, offset + len(tokens), device=self.device).unsqueeze(0)
        return self.fused(ids, positions, rows=rows, offset=offset)


class ModelStep:
    """The model's own forward over a `SlotCache` of the KV manager's blocks (prompts left-padded: each row's last
    token in the last column). Allocates the block pools by a one-token prefill of slot 0 (its writes land in the
    scratch block), outside inference mode so later steps may update them from any mode."""

    name = "model"

    def __init__(self, model: Any, kv: Any, position: Any, adapters: Any = None) -> None:
        import torch

        from ..decode.slot_cache import SlotCache, attention_kind

        config = model.config.get_text_config(decoder=True)
        self.model = model if adapters is None else adapters.model  # a PeftModel over `model` with LoRA adapters
        self.adapters = adapters  # each slot's adapter name (hwrun.inference.engine.adapters.AdapterRows) or None
        self.device = model.device
        self.kv = kv
        self.cache = SlotCache(kv, config.num_hidden_layers, position)
        self.cache_keyword = cache_keyword(model)
        self.attention = attention_kind(model)
        self.mask_dtype = model.dtype
        self.key_index = torch.arange(kv.span_len, device=self.device)
        with torch.inference_mode(False), torch.no_grad():
            self._left_padded(torch.zeros((1, 1), dtype=torch.long, device=self.device),
                              torch.zeros(1, dtype=torch.long, device=self.device))

    def select(self, rows: int, columns: int) -> None:
        """Tell the cache the rows and columns of the next decode steps."""
        self.cache.decoding(rows, columns)

    def _forward(self, ids: Any, positions: Any, visible: Any, slots: Any = None) -> Any:
        """The model's last-column logits for `ids` at `positions`, each query seeing the keys `visible` says; with
        adapters, each batch row runs the adapter of its slot in `slots` (PEFT's mixed-batch `adapter_names`)."""
        from ..decode.slot_cache import visible_mask

        mask = visible_mask(visible, self.attention, self.mask_dtype)
        extra = {} if self.adapters is None else {"adapter_names": self.adapters.names(slots)}
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                          **{self.cache_keyword: self.cache}, use_cache=True, logits_to_keep=1, **extra).logits[:, -1]

    def decode(self, token: Any, position: Any, columns: int) -> Any:
        """Logits of one decode step of the first `token.shape[0]` rows; each row sees the columns up to its own
        position (written by this step's update)."""
        span = self.kv.span(columns)  # attention reads whole blocks; the mask hides positions past each row's
        keys = self.key_index if span == self.kv.span_len else self.key_index[:span]
        return self._forward(token, position, keys[None, None, :] <= position[:, :, None], range(token.shape[0]))

    def prefill(self, prompts: list[list[int]], rows: Any) -> Any:
        """Each prompt's last-token logits; their K/V into cache `rows` from column 0."""
        ids, lengths = padded(prompts, True, self.kv.transfers)
        return self._left_padded(ids, rows, ids.shape[1] - lengths)

    def _left_padded(self, ids: Any, rows: Any, pads: Any = None) -> Any:
        import torch

        batch, width = ids.shape
        pads = torch.zeros(batch, dtype=torch.long, device=self.device) if pads is None else pads
        cols = torch.arange(width, device=self.device)
        positions = (cols[None, :] - pads[:, None]).clamp(min=0)
        shift = (cols[None, :] + pads[:, None]).clamp(max=width - 1)
        query, key = cols[None, :, None], cols[None, None, :]
        # causal over the row's real tokens; a pad column sees only itself (no row is fully masked)
        visible = (key <= query) & ((key >= pads[:, None, None]) | (key == query))
        self.cache.prefilling(rows, shift)
        try:
            return self._forward(ids, positions, visible, None if self.adapters is None else rows.tolist())
        finally:
            self.cache.decoding()

    def extend(self, tokens: list[int], row: int, offset: int) -> Any:
        """The last-token logits of `tokens`, continuing row `row`'s prompt at positions `offset..`."""
        import torch

        ids = self.kv.transfers.to_device([tokens])
        positions = torch.arange(offset, offset + len(tokens), device=self.device).unsqueeze(0)
        visible = self.key_index[:offset + len(tokens)][None, None, :] <= positions[:, :, None]
        self.cache.extending(self.kv.transfers.to_device([row]), offset)
        try:
            return self._forward(ids, positions, visible, [row])
        finally:
            self.cache.decoding()


#: The step implementations by name (what `slot_step_support` returns).
STEP_KINDS = {"fused": FusedStep, "model": ModelStep}
