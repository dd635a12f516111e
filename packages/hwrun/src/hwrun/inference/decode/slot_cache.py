"""A `transformers.Cache` over the engine's paged K/V, one row per slot at its own position, for running a model's
own forward in hwrun's engine.

Why: the engine (hwrun.inference.engine) steps every slot at once, each at its own position.
Transformers' `StaticCache` writes every row at one shared position (`cumulative_length`), so it
cannot hold slots that joined at different times. `SlotCache` speaks the cache protocol the models
call (`update(key_states, value_states, layer_idx, ...)` on a `transformers.Cache`, the same in 5.22
and 5.25) and writes each row's new K/V at that row's own position, read from a device tensor with a
fixed address, through the row's block table into the KV-cache manager's block pool
(hwrun.inference.engine.kv_cache: no host sync), so the decode step is capturable as one device graph. The
engine passes the matching 4D attention mask (each row sees the columns up to its own position) and
per-row `position_ids`; a 4D mask reaches the attention function as it is (masking_utils returns it
unchanged), so any family whose attention goes through Transformers' attention interface with sdpa or
eager attention runs here.

A prefill writes only the admitted slots: its prompts are left-padded (every row's last token is the
last column, so `logits_to_keep=1` gives each row's next-token logits), and `update` shifts each row
left by its padding as it writes the prompt's K/V at positions 0..length-1 of that slot's blocks.
The other rows are not touched. A long prompt may be prefilled in chunks: `extending(row, offset)` makes the
next forward (one row, its tokens at positions `offset..`) write its K/V at those positions of that row and attend
over the row's positions before them too.

A decode step may run over the first rows only (the engine keeps its busy requests in the lowest
rows and steps as many as it needs): `decoding(rows, columns)` makes every layer write into the pool
and return the first `rows` rows' blocks up to `columns` positions (whole blocks) for attention, gathered
through fixed views of the block table, so each row count and length keeps fixed shapes and addresses.

This module imports torch and Transformers at the top: import it where a model is already loaded.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Cache
from transformers.cache_utils import CacheLayerMixin

#: Attention implementations that take the engine's 4D mask as it is (sdpa: boolean, eager: additive).
MASK_ATTENTION = ("sdpa", "eager")


def model_step_support(model: Any) -> str | None:
    """None when hwrun's engine can run `model`'s own forward over a `SlotCache`, else the reason it cannot.
    (Sliding windows shorter than the cache are `engine.steps.attention_blocker`'s to refuse, for every step.)"""
    import inspect

    config = model.config
    name = type(model).__name__
    if getattr(config, "is_encoder_decoder", False):
        return f"{name} is an encoder-decoder model (the slot cache holds decoder self-attention only)"
    if not any(k in inspect.signature(type(model).forward).parameters for k in ("cache", "past_key_values")):
        return f"{name}.forward takes no KV cache (neither `cache` nor `past_key_values`)"
    check = getattr(type(model), "is_backend_compatible", None)
    if check is not None and not check():
        return (f"{name} computes attention itself instead of through Transformers' attention interface "
                "(is_backend_compatible() is False), so it may not honour a per-row 4D mask")
    attention = attention_kind(model)
    if attention not in MASK_ATTENTION:
        return (f"its attention is {attention!r}, which takes no per-row 4D mask; the model step needs "
                f"{' or '.join(MASK_ATTENTION)} (plan with attention='sdpa')")
    return None


def rope_blocker(config: Any, max_cache_len: int | None = None) -> str | None:
    """Why a slot step (fused or the model's own) cannot run `config`'s RoPE per row, else None. A slot step runs
    rows at different positions in one batch, but "dynamic" RoPE rescales its frequencies on the host from the
    batch's longest position, and "longrope" picks its long or short factors from the batch's largest
    position id: a long row would change its neighbours' tokens. Longrope is fine while every position stays
    within `original_max_position_embeddings` (`max_cache_len` None: not known, refused)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    groups = [v for v in params.values() if isinstance(v, dict)] if isinstance(params, dict) else []
    for group in groups or [params]:
        kind = group.get("rope_type") or group.get("type") if isinstance(group, dict) else None
        if kind == "dynamic":
            return ("its RoPE is 'dynamic' (frequencies rescaled from the batch's longest position), so rows at "
                    "different positions would change each other's tokens")
        if kind == "longrope":
            original = group.get("original_max_position_embeddings") or getattr(
                text, "original_max_position_embeddings", None)
            if original is None or max_cache_len is None or max_cache_len > original:
                return (f"its RoPE is 'longrope', which switches to its long factors for the whole batch once any "
                        f"row passes original_max_position_embeddings={original} (cache of {max_cache_len} "
                        "positions): a long row would change its neighbours' tokens")
    return None


def attention_kind(model: Any) -> str:
    """The model's attention implementation ("sdpa" or "eager"), which decides the mask's form."""
    text = model.config.get_text_config(decoder=True)
    return getattr(text, "_attn_implementation", None) or getattr(model.config, "_attn_implementation", None)


def visible_mask(visible: Any, attention: str, dtype: Any) -> Any:
    """A 4D mask (batch, 1, queries, keys) from a boolean `visible` (batch, queries, keys): boolean for sdpa,
    additive (0 or the dtype's minimum) for eager, as Transformers' own mask builders make them."""
    visible = visible[:, None]
    if attention == "sdpa":
        return visible
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill(~visible, torch.finfo(dtype).min)


class SlotLayer(CacheLayerMixin):
    """One layer's view of the engine's paged K/V (hwrun.inference.engine.kv_cache.KVCache): the pools are allocated
    on the first update (the prefill the engine runs when it is built), where the model's own heads, head size,
    dtype and device are known; every write goes through the rows' block tables."""

    is_compileable = True
    is_sliding = False

    def __init__(self, kv: Any, index: int) -> None:
        super().__init__()
        self.kv = kv
        self.index = index
        self.slots = kv.slots
        self.max_cache_len = kv.max_cache_len
        # set by SlotCache: ("decode", rows, columns), ("prefill", rows, shift), ("extend", row, offset) or
        # ("continue", rows, positions, valid, end)
        self.mode: tuple | None = None
        self.positions: Any = None  # the engine's (slots, 1) positions tensor itself (SlotCache sets it)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.num_heads = key_states.shape[1]
        self.kv.allocate(self.kv.layers, self.num_heads, key_states.shape[-1], key_states.dtype, self.device)
        pool = self.kv.keys[self.index]
        if pool.shape[0] != self.num_heads or pool.shape[3] != key_states.shape[-1]:
            from ...errors import FastDecodeError

            raise FastDecodeError(f"layer {self.index} has K/V of {self.num_heads} heads x {key_states.shape[-1]}, "
                                  f"the first layer {pool.shape[0]} x {pool.shape[3]}: the engine's block pool holds "
                                  "one shape for every layer.")
        self.keys, self.values = pool, self.kv.values[self.index]
        self.batch_size = self.slots
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new K/V (per-row positions when decoding, the admitted rows when prefilling) through the block
        tables; return what attention reads: the stepped rows' blocks up to the step's columns when decoding, the
        row's blocks up to its last position when continuing a prompt, the prompt's own K/V when prefilling."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        mode = self.mode
        if mode is None:
            raise RuntimeError("SlotCache.update outside an engine step or prefill")
        if mode[0] == "decode":
            # each stepped row's one new column at that row's own position: (rows, heads, 1, dim)
            # a view taken here, inside the step, of the engine's own positions tensor: the step sees one tensor
            # (a view made outside would be a second, aliased input of a step that mutates it; torch.compile then
            # rebuilds both from a synthetic base every call, and refuses that outright with torchao weights)
            position = self.positions[:mode[1]]
            self.kv.write_decode(self.index, position, key_states[:, :, 0], value_states[:, :, 0])
            return self.kv.gather(self.index, position.shape[0], mode[2])
        if mode[0] == "continue":
            # continued prompts of several rows, each at its own positions: attention over each row's blocks up to
            # the furthest end (the engine's mask hides what a query may not see)
            _, rows, positions, valid, end = mode
            self.kv.write_positions(self.index, rows, positions, valid, key_states, value_states)
            return self.kv.gather_rows(self.index, rows, end)
        if mode[0] == "extend":
            # a continued prompt of one row: its columns offset.. written, attention over the row up to them
            _, row, offset = mode
            self.kv.write(self.index, row, offset, key_states, value_states)
            return self.kv.gather_rows(self.index, row, offset + key_states.shape[2])
        _, rows, shift = mode
        # left-padded prompts: input column c of row i holds position c - pad_i; cache column c gets position c
        keys = key_states.gather(2, shift[:, None, :, None].expand_as(key_states))
        values = value_states.gather(2, shift[:, None, :, None].expand_as(value_states))
        self.kv.write(self.index, rows, 0, keys, values)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, offset): the columns attention reads when decoding (or continuing a prompt), the prompt when
        prefilling (the engine passes its own 4D masks, so Transformers' mask builders never read this)."""
        mode = self.mode or ("prefill",)
        if mode[0] == "decode":
            return self.kv.span(mode[2]), 0
        if mode[0] == "continue":
            return mode[4], 0
        return (mode[2] + query_length, 0) if mode[0] == "extend" else (query_length, 0)

    def get_seq_length(self) -> int:
        """0: rows sit at different positions, so there is no one length (the engine passes position_ids)."""
        return 0

    def get_max_length(self) -> int:
        """The columns each row holds."""
        return self.max_cache_len


class SlotCache(Cache):
    """A `transformers.Cache` whose layers write per-row positions (decode steps) or whole prompts into chosen
    rows (prefills). `positions` is the engine's (slots, 1) long device tensor: where each row's next K/V go."""

    def __init__(self, kv: Any, n_layers: int, positions: torch.Tensor) -> None:
        kv.layers = n_layers
        super().__init__(layers=[SlotLayer(kv, index) for index in range(n_layers)])
        self.positions = positions
        for layer in self.layers:
            layer.positions = positions
        self.slots = kv.slots
        self.max_cache_len = kv.max_cache_len
        # one tuple per (rows, columns): a compiled step sees the same objects every time
        self._decodes: dict[tuple[int, int], tuple] = {}
        self.decoding()

    def _set(self, mode: tuple) -> None:
        for layer in self.layers:
            layer.mode = mode

    def decoding(self, rows: int | None = None, columns: int | None = None) -> None:
        """Decode steps from now on, over the first `rows` rows (default: all): each writes its one new column
        at `positions[row]`, and attention reads those rows' first `columns` positions (default: all)."""
        key = (self.slots if rows is None else rows, self.max_cache_len if columns is None else columns)
        if key not in self._decodes:
            self._decodes[key] = ("decode", key[0], key[1])
        self._set(self._decodes[key])

    def prefilling(self, rows: torch.Tensor, shift: torch.Tensor) -> None:
        """The next forward is a left-padded prefill of cache rows `rows`; `shift[i, c]` is the input column whose
        K/V go to cache column c of row i (its column c + padding, clamped)."""
        self._set(("prefill", rows, shift))

    def continuing(self, rows: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, end: int) -> None:
        """The next forward continues the prompts of table rows `rows`, each token at its row's own `positions`
        (batch, T); the columns `valid` marks False are padding (written to the scratch block); `end` is the
        furthest position + 1 (attention reads each row's blocks up to it)."""
        self._set(("continue", rows, positions, valid, end))

    def extending(self, row: torch.Tensor, offset: int) -> None:
        """The next forward continues the prompt of table row `row` (a one-element long tensor): its tokens sit at
        positions `offset..`."""
        self._set(("extend", row, offset))
