"""How each slot picks its next token: the per-row sampling state the runner's steps read (temperature, top-k, top-p,
seed: `SamplingRows`; bias, penalties, min-p, grammar bitmask, logprobs ring: `LogitRows`), which step kind a set of
rows needs, and the token choice itself, inside a decode step (views of the first rows: capturable) or after a
prefill (gathered rows, eager). Device work only where the runner calls it; the host flags say which kind runs.

Step kinds are bits: SAMPLED (temperature / top-k / top-p / seed; without it every row takes the argmax), PROCESSED
(each row's bias, penalties, min-p and logprobs) and MASKED (also each row's grammar bitmask; it includes PROCESSED):
0 greedy, 1 sampled, 2 processed, 3 processed and sampled, 6 masked, 7 masked and sampled. A kind serves every row a
kind with fewer bits serves, so one captured graph per (kind, rows, columns) takes any mix of requests, and a step of
greedy rows only never pays for the sampler's sort (greedy + logprobs, greedy tool calls under a grammar).
"""

from __future__ import annotations

from typing import Any

from ..decode.logits import LogitRows, check_vocab
from ..decode.sampling import SamplingParams, SamplingRows, next_tokens

#: The step kind bits (a kind is the first item of a step's key; GREEDY and SAMPLED equal False and True).
GREEDY, SAMPLED, PROCESSED, MASKED = 0, 1, 2, 6
#: Every kind, and its name (the name of a step's code object).
KINDS = (0, 1, 2, 3, 6, 7)
KIND_NAMES = {0: "greedy", 1: "sampled", 2: "processed", 3: "processed_sampled", 6: "masked", 7: "masked_sampled"}


def vocab_size(model: Any) -> int:
    """Logits per token: the output embedding's rows (else the config's `vocab_size`)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(model.config.get_text_config().vocab_size)


class RowChoice:
    """The token-choosing state of `slots` rows over a `vocab`-token vocabulary on `device`."""

    def __init__(self, slots: int, vocab: int, device: Any) -> None:
        import torch

        self.vocab = vocab
        self.sampling = SamplingRows(slots, device)
        self.logits = LogitRows(slots, vocab, device)
        self.host_mask = torch.full_like(self.logits.bitmask, -1, device="cpu")  # matchers fill it, then copied
        self.constrained = [False] * slots  # host: whether a row's request has a grammar matcher

    # ---- host: rows' settings ---------------------------------------------------------------------------------

    def check(self, params: SamplingParams) -> None:
        """Refuse (`GenerateError`) what this vocabulary cannot take (a `logit_bias` id past it)."""
        check_vocab(params, self.vocab)

    def set(self, slot: int, params: SamplingParams, prompt: list[int] = (), constrained: bool = False) -> None:
        """Give `slot` the sampling `params` (seed resolved now), its prompt (repetition penalty) and grammar flag."""
        self.sampling.set(slot, params)
        if params.processed or self.logits.processed[slot] or constrained or self.constrained[slot]:
            self.logits.set(slot, params, list(prompt))
        self.constrained[slot] = constrained

    def fill(self, params: SamplingParams) -> None:
        """Give every slot the sampling `params` (each drawing its own seed when `params.seed` is None)."""
        self.sampling.fill(params)

    def kind(self, slots: Any) -> int:
        """The cheapest step kind that serves every one of `slots`."""
        slots = list(slots)
        kind = SAMPLED if self.sampling.sampling(slots) else GREEDY
        if any(self.constrained[s] for s in slots):
            return kind | MASKED
        return kind | PROCESSED if any(self.logits.processed[s] for s in slots) else kind

    def move(self, source: int, target: int) -> None:
        """Row `source`'s settings into row `target`."""
        self.sampling.move(source, target)
        self.logits.move(source, target)
        self.constrained[target] = self.constrained[source]

    def masks(self, matchers: list[tuple[int, Any]]) -> None:
        """Fill the bitmask rows of (slot, matcher) pairs on the host (`matcher.fill(bitmask, row)`; None: all
        tokens allowed) and copy them to the device rows the next step reads."""
        import torch

        if not matchers:
            return
        for slot, matcher in matchers:
            self.host_mask[slot] = -1
            if matcher is not None:
                matcher.fill(self.host_mask, slot)
        index = torch.tensor([s for s, _ in matchers], dtype=torch.long)
        self.logits.bitmask[index.to(self.logits.bitmask.device)] = self.host_mask[index].to(self.logits.bitmask.device)

    def read_logprobs_later(self, slots: list[int], columns: list[int], transfers: Any) -> Any:
        """Queue the copies of {slot: (logprob, top pairs)} of token `columns[i]` of `slots[i]`, for the slots that
        report logprobs, to the host (`transfers.Transfers.read_later`); the returned function waits and gives them."""
        from ..decode.logits import RING

        asked = [(s, c % RING) for s, c in zip(slots, columns, strict=True) if self.logits.logprobs[s] is not None]
        if not asked:
            return dict
        rows, ring = [s for s, _ in asked], [c for _, c in asked]
        reads = [transfers.read_later(t, rows, ring) for t in (self.logits.logprob, self.logits.top_logprobs,
                                                                self.logits.top_ids)]

        def values() -> dict[int, tuple[float, tuple]]:
            chosen, top, ids = (read() for read in reads)
            return {slot: (chosen[i], tuple(zip(ids[i][:self.logits.logprobs[slot] or 0],
                                                top[i][:self.logits.logprobs[slot] or 0], strict=True)))
                    for i, slot in enumerate(rows)}

        return values

    # ---- device: the choice ---------------------------------------------------------------------------------------

    def decode(self, kind: int, last: Any, rows: int, count: Any, filter: Any = None) -> Any:
        """(rows, 1) next tokens of the first `rows` rows from their step's logits `last` (views: capturable);
        `count` is each row's index of the token being chosen."""
        if kind & PROCESSED:
            processed = self.logits.process(last, rows=rows, mask=kind & MASKED == MASKED)
            if kind & SAMPLED:
                nxt = next_tokens(processed, *self.sampling.first(rows), count, filter=filter,
                                  min_p=self.logits.min_p[:rows]).unsqueeze(-1)
            else:
                nxt = processed.argmax(dim=-1, keepdim=True)
            self.logits.record(last, nxt, count, rows=rows)
            return nxt
        if kind == SAMPLED:
            return next_tokens(last, *self.sampling.first(rows), count, filter=filter).unsqueeze(-1)
        return last.argmax(dim=-1, keepdim=True)

    def first(self, logits: Any, rows: Any, slots: list[int]) -> Any:
        """(n,) first tokens of the rows `rows` (a long tensor of `slots`) from their prompts' last logits (eager)."""
        import torch

        kind = self.kind(slots)
        zeros = torch.zeros_like(rows)
        if kind & PROCESSED:
            processed = self.logits.process(logits, index=rows, mask=kind & MASKED == MASKED)
            first = (next_tokens(processed, *self.sampling.take(rows), zeros, min_p=self.logits.min_p[rows])
                     if kind & SAMPLED else processed.argmax(dim=-1))
            self.logits.record(logits, first, zeros, index=rows)
            return first
        if kind == SAMPLED:
            return next_tokens(logits, *self.sampling.take(rows), zeros)
        return logits.argmax(dim=-1)
