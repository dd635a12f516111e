"""Sampling inside the graph decoders: temperature, top-k, top-p and a seed per row, on the device,
with fixed shapes and no host sync, so one captured graph samples every row.

Why this shape: a device graph replays fixed kernels over fixed buffers, so everything that differs
per request lives in per-row tensors (`SamplingRows`: temperature, top_p, top_k, seed) and the noise
is counter-based instead of drawn from a generator. Each row's noise is an integer hash of (seed,
the index of the token being chosen within its request, vocabulary index) turned into a uniform
number and then Gumbel noise; the token is `argmax(filtered logits / temperature + gumbel)`
(Gumbel-max: an exact draw from the filtered softmax). Consequences: a seeded request gives the
same tokens alone or in any batch and in any slot (the noise never depends on the other rows),
replay needs no generator state (the counter is a buffer the step already moves), and a graph
captured once serves greedy and sampled rows together. The draws are not the ones
`torch.multinomial` would make for the same seed, so sampled tokens differ from
`model.generate(do_sample=True)`'s; the distribution is the same.

Filtering follows Transformers' warpers in their order: temperature, then top-k, then top-p over what
top-k kept (keep the most likely tokens until their mass reaches `top_p`, always at least one).
Tokens tied with the last kept logit are kept too (a threshold, not a count: no data-dependent
shapes). `temperature == 0` is greedy: that row takes the plain argmax of the logits, exactly
`model.generate(do_sample=False)`'s token.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from ...errors import GenerateError

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. `temperature=0.0` is greedy; `top_p=1.0` and `top_k=0` are off;
    `seed=None` draws one from torch's global generator when the request starts (so `torch.manual_seed`
    makes it reproducible). Invalid values raise `GenerateError` (a `ValueError`) naming the value and the rule."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k, self.seed)

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax (temperature 0)."""
        return self.temperature == 0


def check_sampling(temperature: Any, top_p: Any, top_k: Any, seed: Any) -> None:
    """Raise `GenerateError` for a sampling value no decoder can use (before any model runs)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise GenerateError(f"temperature={temperature!r} must be a number >= 0 (0 is greedy; 0.7 is a common "
                            "sampling value).")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
        raise GenerateError(f"top_p={top_p!r} must be in (0, 1] (1.0 turns top-p filtering off).")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
        raise GenerateError(f"top_k={top_k!r} must be an integer >= 0 (0 turns top-k filtering off).")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise GenerateError(f"seed={seed!r} must be an integer or None.")


def resolve_seed(params: SamplingParams) -> int:
    """The 32-bit seed a row uses: the request's own, else one drawn from torch's global generator."""
    if params.seed is not None:
        return int(params.seed) & _MASK32
    import torch

    return int(torch.randint(0, 2**31 - 1, (1,)).item())


class SamplingRows:
    """Per-row sampling parameters as device tensors with fixed addresses (a captured graph reads them).
    `set(row, params)` writes one row between steps; `sampling` says whether any of `rows` samples."""

    def __init__(self, rows: int, device: Any) -> None:
        import torch

        self.temperature = torch.zeros(rows, dtype=torch.float32, device=device)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(rows, dtype=torch.long, device=device)
        self.seed = torch.zeros(rows, dtype=torch.long, device=device)
        self._sampled = [False] * rows

    def set(self, row: int, params: SamplingParams) -> None:
        """Give `row` the parameters of `params` (its seed resolved now)."""
        self.temperature[row] = float(params.temperature)
        self.top_p[row] = float(params.top_p)
        self.top_k[row] = int(params.top_k)
        self.seed[row] = resolve_seed(params) if not params.greedy else 0
        self._sampled[row] = not params.greedy

    def fill(self, params: SamplingParams) -> None:
        """Give every row the parameters of `params`; with `seed=None` each row draws its own seed."""
        import torch

        self.temperature.fill_(float(params.temperature))
        self.top_p.fill_(float(params.top_p))
        self.top_k.fill_(int(params.top_k))
        if params.greedy:
            self.seed.zero_()
        elif params.seed is not None:
            self.seed.fill_(int(params.seed) & _MASK32)
        else:
            self.seed.copy_(torch.randint(0, 2**31 - 1, self.seed.shape))
        self._sampled = [not params.greedy] * len(self._sampled)

    def sampling(self, rows: Any = None) -> bool:
        """Whether any of `rows` (default: all) samples."""
        rows = range(len(self._sampled)) if rows is None else rows
        return any(self._sampled[r] for r in rows)

    def take(self, rows: Any) -> tuple[Any, Any, Any, Any]:
        """(temperature, top_p, top_k, seed) of the given rows (a long tensor)."""
        return self.temperature[rows], self.top_p[rows], self.top_k[rows], self.seed[rows]

    def all(self) -> tuple[Any, Any, Any, Any]:
        """(temperature, top_p, top_k, seed) of every row."""
        return self.temperature, self.top_p, self.top_k, self.seed

    def first(self, rows: int) -> tuple[Any, Any, Any, Any]:
        """(temperature, top_p, top_k, seed) of the first `rows` rows: views with fixed addresses."""
        if rows == len(self._sampled):
            return self.all()
        return self.temperature[:rows], self.top_p[:rows], self.top_k[:rows], self.seed[:rows]

    def move(self, source: int, target: int) -> None:
        """Give row `target` row `source`'s parameters (its seed too: a row's noise depends only on its seed
        and its token counter, so a request that moves keeps its draws)."""
        for values in self.all():
            values[target] = values[source]
        self._sampled[target] = self._sampled[source]


def _mul32(x: Any, constant: int) -> Any:
    """(x * constant) mod 2**32 for int64 tensors holding 32-bit values, without int64 overflow
    (split into 16-bit halves: every product stays below 2**49)."""
    low, high = x & 0xFFFF, x >> 16
    return (low * constant + (((high * constant) & 0xFFFF) << 16)) & _MASK32


def mix32(x: Any) -> Any:
    """A 32-bit integer hash (the "lowbias32" finaliser) of an int64 tensor's low 32 bits."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seed: Any, counter: Any, vocab: int) -> Any:
    """(rows, vocab) float32 uniforms in (0, 1), a pure function of each row's (seed, counter) and the
    vocabulary index: counter-based, so no generator state and no dependence on other rows."""
    import torch

    key = mix32(mix32(seed ^ 0x9E3779B9) ^ counter.reshape(-1))  # (rows,)
    index = mix32(torch.arange(vocab, device=seed.device, dtype=torch.long) + 0x632BE5AB)  # (vocab,)
    bits = mix32(key[:, None] ^ index[None, :]) >> 8  # 24 random bits
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def block_cumsum(values: Any, block: int = 64) -> Any:
    """The cumulative sum over the last dim of a (rows, n) float32 tensor by matrix products with triangular ones
    instead of a scan: within blocks of `block`, then (recursively) each block's running total. On an H200 (torch
    2.11) Inductor failed to compile the filter's scan at 8 rows over 128,256 entries (docs/benchmarks/decode.md);
    matrix products compile. ~2 * n * block multiply-adds a row (16 M at 128,256 entries). Where CUDA's float32
    matrix products run in TF32 (`torch.backends.cuda.matmul.allow_tf32`, which `set_float32_matmul_precision("high")`
    turns on; read when traced), the values are split into their top 11 significant bits (exact in TF32) and the rest,
    so the sums stay within ~1e-6 of float32's. Used compiled and eager alike, so a compiled step, an eager one and
    the prefill keep the same tokens at the top-p boundary (torch.cumsum's rounding differs by ~1e-7)."""
    import torch

    if block < 2:
        raise ValueError(f"block={block!r}: block_cumsum needs blocks of at least 2 values")
    rows, width = values.shape
    if width <= block:
        ones = torch.ones(width, width, device=values.device, dtype=values.dtype).triu()
        if not torch.backends.cuda.matmul.allow_tf32:  # a flag Dynamo reads when tracing (the getter breaks)
            return values @ ones
        # the top 11 significant bits (exact in TF32) by a bit mask: Inductor folds a float32 -> bfloat16 ->
        # float32 round trip away, which would leave the remainder 0
        high = (values.contiguous().view(torch.int32) & -8192).view(values.dtype)
        return high @ ones + (values - high) @ ones
    blocks = -(-width // block)
    padded = torch.nn.functional.pad(values, (0, blocks * block - width)).reshape(rows * blocks, block)
    inner = block_cumsum(padded, block).reshape(rows, blocks, block)
    totals = inner[..., -1]
    before = block_cumsum(totals, block) - totals  # the sum of the blocks before each
    return (inner + before[..., None]).reshape(rows, blocks * block)[:, :width]


def filter_logits(logits: Any, temperature: Any, top_k: Any, top_p: Any) -> Any:
    """float32 logits / temperature with everything outside top-k, then top-p, set to -inf (per row;
    `top_k` 0 and `top_p` 1 are off; a row with temperature 0 is divided by 1). Fixed shapes."""
    import torch

    divisor = torch.where(temperature > 0, temperature, 1.0)[:, None]
    scaled = logits.to(torch.float32) / divisor
    vocab = scaled.shape[-1]
    # sorted in the logits' own dtype (bf16 keys have half the bits of float32: fewer radix-sort passes; the sort
    # was 55 of the filter's 73 us for one row on the H200); a positive divisor keeps the order, so these are
    # exactly the sorted `scaled` values
    ordered = logits.sort(dim=-1, descending=True).values.to(torch.float32) / divisor
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)[:, None]
    in_k = ranks < k
    probs = torch.softmax(ordered.masked_fill(~in_k, float("-inf")), dim=-1)
    before = block_cumsum(probs) - probs  # mass of the more likely tokens (Inductor failed on a scan here)
    keep = in_k & ((before < top_p[:, None]) | (top_p[:, None] >= 1))
    last = keep.sum(dim=-1, keepdim=True).clamp(min=1) - 1
    threshold = ordered.gather(1, last)
    return scaled.masked_fill(scaled < threshold, float("-inf"))


def next_tokens(logits: Any, temperature: Any, top_p: Any, top_k: Any, seed: Any, counter: Any, *,
                filter: Any = None) -> Any:
    """(rows,) long: greedy argmax for rows with temperature 0, else a Gumbel-max draw from the filtered
    softmax with the row's counter-based noise. `counter` is each row's index of the token being chosen;
    `filter` replaces `filter_logits` (a compiled step passes an eager one where Inductor cannot compile it)."""
    import torch

    greedy = logits.argmax(dim=-1)
    filtered = (filter or filter_logits)(logits, temperature, top_k, top_p)
    gumbel = -torch.log(-torch.log(uniform_noise(seed, counter, logits.shape[-1])))
    drawn = (filtered + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, greedy)
