"""The engine's two step implementations behind one interface (hwrun.inference.engine.steps decides which runs).

`FusedStep` is hwrun.inference.decode.fused_step (Llama, Mistral, Qwen2: q/k/v and gate/up read as one matrix each)
over the KV-cache manager's paged K/V (its block pool, through each row's block table); `ModelStep` runs the model's
own forward over a `SlotCache` (hwrun.inference.decode.slot_cache: each row's K/V written at that row's position
through its block table, a 4D mask per row, per-row `position_ids`), so any family whose attention goes through Transformers' attention interface with sdpa or eager
attention runs. Both answer:

- `select(rows, columns)`: outside any compiled or captured region, what the next decode steps run over;
- `decode(token, position, columns) -> logits`: one decode step of the first rows (fixed buffers only: capturable);
- `prefill(prompts, rows) -> logits`: prompts starting at position 0, padded into one forward, into cache `rows`;
- `extend(tokens, row, offset) -> logits`: a chunk continuing one row's prompt at positions `offset..`;
- `extend_rows(prompts, rows, starts) -> logits`: several continued prompts padded into one forward, each at its own
  positions (after cached prefixes: 64 repeated prompts were 64 forwards before).
"""

from __future__ import annotations

from typing import Any

from .steps import cache_keyword


def padded(prompts: list[list[int]], left: bool, transfers: Any) -> tuple[Any, Any]:
    """(ids, lengths) on the device of `transfers` (`transfers.Transfers`: no stream synchronize): `prompts` padded
    with 0 to the longest, on the left or the right."""
    return padded_ids(prompts, left, transfers), transfers.to_device([len(p) for p in prompts])


def padded_ids(prompts: list[list[int]], left: bool, transfers: Any) -> Any:
    """`prompts` padded with 0 to the longest, on the left or the right, on the device of `transfers`."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        start = width - len(prompt) if left else 0
        ids[row, start:start + len(prompt)] = torch.tensor(prompt, dtype=torch.long)
    return transfers.to_device(ids)


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

    def extend_rows(self, prompts: list[list[int]], rows: Any, starts: list[int]) -> Any:
        """Each row's last-token logits: `prompts[i]` continues row `rows[i]`'s prompt at positions `starts[i]..`
        (right-padded together; one forward for every continued prompt, e.g. after a shared cached prefix)."""
        positions, valid, end, lengths = continued_positions(prompts, starts, False, self.kv.transfers, self.device)
        ids = padded_ids(prompts, False, self.kv.transfers)
        return self.fused(ids, positions, rows=rows, last_index=lengths - 1, continued=(valid, end))


def continued_positions(prompts: list[list[int]], starts: list[int], left: bool, transfers: Any,
                        device: Any) -> tuple[Any, Any, int, Any]:
    """(positions (batch, T), valid (batch, T), end, lengths) of prompts continuing at `starts`, padded on the left or
    the right to the longest: row i's tokens at positions `starts[i]..`; a padding column is not valid and sits at its
    row's first position (its K/V go to the scratch block)."""
    import torch

    lengths = transfers.to_device([len(p) for p in prompts])
    begin = transfers.to_device(list(starts))
    width = max(len(p) for p in prompts)
    cols = torch.arange(width, device=device)[None, :]
    pads = (width - lengths)[:, None] if left else torch.zeros_like(lengths)[:, None]
    valid = (cols >= pads) & (cols < pads + lengths[:, None])
    positions = torch.where(valid, begin[:, None] + cols - pads, begin[:, None])
    return positions, valid, max(s + len(p) for s, p in zip(starts, prompts, strict=True)), lengths


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

    def extend_rows(self, prompts: list[list[int]], rows: Any, starts: list[int]) -> Any:
        """Each row's last-token logits: `prompts[i]` continues row `rows[i]`'s prompt at positions `starts[i]..`
        (left-padded together: every row's last token in the last column; one forward for every continued prompt)."""
        positions, valid, end, _ = continued_positions(prompts, starts, True, self.kv.transfers, self.device)
        ids = padded_ids(prompts, True, self.kv.transfers)
        visible = self.key_index[:end][None, None, :] <= positions[:, :, None]
        self.cache.continuing(rows, positions, valid, end)
        try:
            return self._forward(ids, positions, visible, None if self.adapters is None else rows.tolist())
        finally:
            self.cache.decoding()


#: The step implementations by name (what `slot_step_support` returns).
STEP_KINDS = {"fused": FusedStep, "model": ModelStep}
