"""Per-request logits processing inside hwrun's engine step: logit bias, repetition / presence / frequency penalties,
a grammar's token mask, min-p, and the model's own log-probabilities, from per-row device buffers with fixed
addresses (`LogitRows`), so one captured graph serves every mix of plain, penalised, constrained and logprobs rows.

Order, as Transformers' `generate` applies its processors (and vLLM V1 its own): the bias (`SequenceBiasLogitsProcessor`
/ vLLM's logit bias), then `RepetitionPenaltyLogitsProcessor` over the prompt and the generated tokens (a seen token's
logit divided by the penalty when positive, multiplied when negative), then OpenAI's presence and frequency penalties
over the generated tokens (`logit - frequency * count - presence * (count > 0)`, as vLLM applies them after the
repetition penalty), then the grammar's mask; a greedy row takes the argmax of that, a sampled row goes on through
temperature, top-k, top-p and min-p (hwrun.inference.decode.sampling). Every knob at its off value leaves the
logits bit for bit as they were (x / 1, x * 1, x - 0, + 0.0), so greedy rows stay `model.generate`'s.

Logprobs are the raw model's (log-softmax of the logits before any processing: vLLM's default `raw_logprobs` and
OpenAI's meaning): the chosen token's and the `MAX_LOGPROBS` most likely, written into a small ring of columns per
row (the token's index modulo `RING`) that the host reads with the tokens.

The grammar mask is the int32 bitmask layout of xgrammar and llguidance: bit `j` of word `i` allows token
`32 * i + j`; a row without a grammar holds all ones (-1).
"""

from __future__ import annotations

from typing import Any

from ...errors import GenerateError
from .sampling import MAX_LOGPROBS, SamplingParams

#: Columns of each row's logprobs ring: the host reads a token at most RING - 1 steps after it was chosen.
RING = 4


def bitmask_words(vocab: int) -> int:
    """int32 words of one row's token bitmask."""
    return -(-vocab // 32)


def allowed_tokens(bitmask: Any, vocab: int) -> Any:
    """(rows, vocab) bool: which tokens each row's bitmask allows (fixed shapes)."""
    import torch

    index = torch.arange(vocab, device=bitmask.device)
    words = bitmask[:, index >> 5]
    return ((words >> (index & 31).to(words.dtype)) & 1).bool()


def apply_bitmask(logits: Any, bitmask: Any) -> Any:
    """`logits` with every token the row's bitmask forbids set to -inf."""
    return logits.masked_fill(~allowed_tokens(bitmask, logits.shape[-1]), float("-inf"))


def penalise(logits: Any, bias: Any, counts: Any, seen: Any, repetition: Any, presence: Any, frequency: Any) -> Any:
    """float32 logits with each row's bias added, then its repetition penalty over the tokens it has seen (prompt
    and generated: `seen | counts > 0`), then presence / frequency penalties over its generated-token `counts`."""
    import torch

    x = logits.to(torch.float32) + bias
    penalty = repetition[:, None]
    x = torch.where(seen | (counts > 0), torch.where(x < 0, x * penalty, x / penalty), x)
    return x - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(x.dtype)


def logprobs_of(logits: Any, chosen: Any) -> tuple[Any, Any, Any]:
    """(chosen token's logprob (rows,), top logprobs (rows, MAX_LOGPROBS), their ids) of the raw `logits`."""
    import torch

    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    top = logprobs.topk(min(MAX_LOGPROBS, logprobs.shape[-1]), dim=-1)
    return logprobs.gather(1, chosen.reshape(-1, 1)).squeeze(1), top.values, top.indices


def check_vocab(params: SamplingParams, vocab: int) -> None:
    """Refuse (`GenerateError`) a `logit_bias` id outside the model's vocabulary."""
    for token, _ in params.logit_bias:
        if token >= vocab:
            raise GenerateError(f"logit_bias token id {token} is outside this model's vocabulary ({vocab} ids: "
                                f"0..{vocab - 1}).")


class LogitRows:
    """The processing buffers of `rows` requests over a `vocab`-token vocabulary (fixed addresses): bias, generated
    token counts, prompt tokens seen, the three penalties, min-p, the grammar bitmask, and the logprobs ring."""

    def __init__(self, rows: int, vocab: int, device: Any) -> None:
        import torch

        f32 = dict(dtype=torch.float32, device=device)
        self.vocab = vocab
        self.bias = torch.zeros((rows, vocab), **f32)
        self.counts = torch.zeros((rows, vocab), **f32)
        self.seen = torch.zeros((rows, vocab), dtype=torch.bool, device=device)
        self.repetition = torch.ones(rows, **f32)
        self.presence = torch.zeros(rows, **f32)
        self.frequency = torch.zeros(rows, **f32)
        self.min_p = torch.zeros(rows, **f32)
        self.bitmask = torch.full((rows, bitmask_words(vocab)), -1, dtype=torch.int32, device=device)
        top = min(MAX_LOGPROBS, vocab)
        self.logprob = torch.zeros((rows, RING), **f32)
        self.top_logprobs = torch.zeros((rows, RING, top), **f32)
        self.top_ids = torch.zeros((rows, RING, top), dtype=torch.long, device=device)
        self.processed = [False] * rows  # host: whether a row needs the processed step
        self.logprobs: list[int | None] = [None] * rows  # host: how many alternatives a row reports (None: none)

    def set(self, row: int, params: SamplingParams, prompt: list[int]) -> None:
        """Give `row` the bias, penalties, min-p and logprobs of `params`, its seen tokens `prompt`, no counts."""
        import torch

        self.bias[row].zero_()
        if params.logit_bias:
            ids, values = zip(*params.logit_bias, strict=True)
            self.bias[row, list(ids)] = torch.tensor(values, dtype=torch.float32, device=self.bias.device)
        self.counts[row].zero_()
        self.seen[row].zero_()
        if params.repetition_penalty != 1 and prompt:
            self.seen[row, torch.tensor(prompt, dtype=torch.long, device=self.seen.device)] = True
        self.repetition[row] = float(params.repetition_penalty)
        self.presence[row] = float(params.presence_penalty)
        self.frequency[row] = float(params.frequency_penalty)
        self.min_p[row] = float(params.min_p)
        self.bitmask[row] = -1
        self.processed[row] = params.processed
        self.logprobs[row] = params.logprobs

    def tensors(self) -> list[Any]:
        """Every per-row buffer (moved with a row)."""
        return [self.bias, self.counts, self.seen, self.repetition, self.presence, self.frequency, self.min_p,
                self.bitmask, self.logprob, self.top_logprobs, self.top_ids]

    def move(self, source: int, target: int) -> None:
        """Row `source`'s buffers and flags into row `target`."""
        for values in self.tensors():
            values[target] = values[source]
        self.processed[target] = self.processed[source]
        self.logprobs[target] = self.logprobs[source]

    def process(self, logits: Any, index: Any = None, rows: int | None = None, mask: bool = False) -> Any:
        """float32 logits of the rows `index` (a long tensor) or of the first `rows` rows, biased, penalised and,
        with `mask`, masked by the rows' bitmasks."""
        def pick(t: Any) -> Any:
            return t[index] if index is not None else t[:rows]

        x = penalise(logits, pick(self.bias), pick(self.counts), pick(self.seen), pick(self.repetition),
                     pick(self.presence), pick(self.frequency))
        return apply_bitmask(x, pick(self.bitmask)) if mask else x

    def record(self, logits: Any, chosen: Any, column: Any, index: Any = None, rows: int | None = None) -> None:
        """After choosing `chosen` (rows,) from raw `logits`: count it and write its logprobs at `column` of the
        ring (rows, 1). Rows by `index` (eager, a prefill) or the first `rows` (views: capturable)."""
        import torch

        lp, top, ids = logprobs_of(logits, chosen)
        slot = column % RING
        if index is not None:
            self.counts.index_put_((index, chosen.reshape(-1)), torch.ones_like(lp), accumulate=True)
            self.logprob[index, slot.reshape(-1)] = lp
            self.top_logprobs[index, slot.reshape(-1)] = top
            self.top_ids[index, slot.reshape(-1)] = ids
            return
        self.counts[:rows].scatter_add_(1, chosen.reshape(-1, 1), torch.ones_like(lp).unsqueeze(1))
        self.logprob[:rows].scatter_(1, slot, lp.unsqueeze(1))
        spread = slot.unsqueeze(-1).expand(-1, 1, top.shape[-1])
        self.top_logprobs[:rows].scatter_(1, spread, top.unsqueeze(1))
        self.top_ids[:rows].scatter_(1, spread, ids.unsqueeze(1))

    def read(self, slots: list[int], columns: list[int]) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
        """(logprob, top (id, logprob) pairs) of token `columns[i]` of `slots[i]`, for rows that report logprobs."""
        import torch

        device = self.logprob.device
        index = torch.tensor(slots, dtype=torch.long, device=device)
        ring = torch.tensor([c % RING for c in columns], dtype=torch.long, device=device)
        chosen = self.logprob[index, ring].tolist()
        top, ids = self.top_logprobs[index, ring].tolist(), self.top_ids[index, ring].tolist()
        out = []
        for i, slot in enumerate(slots):
            k = self.logprobs[slot] or 0
            out.append((chosen[i], tuple(zip(ids[i][:k], top[i][:k], strict=True))))
        return out
