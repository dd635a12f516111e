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

What else a request may ask (`SamplingParams`: `min_p`, `presence_penalty`, `frequency_penalty`,
`repetition_penalty`, `logit_bias`, `logprobs`) is applied by hwrun.inference.decode.logits from per-row
buffers of the same kind (hwrun's engine steps such rows with its "processed" step); `min_p` filters after top-p,
as Transformers' `MinPLogitsWarper` does.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from ...errors import GenerateError

_MASK32 = 0xFFFFFFFF
#: Most alternatives a request may ask per token (`logprobs=k`), OpenAI's `top_logprobs` bound too.
MAX_LOGPROBS = 20
#: Largest |bias| of one `logit_bias` entry (OpenAI's range).
MAX_LOGIT_BIAS = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. `temperature=0.0` is greedy; `top_p=1.0`, `top_k=0` and `min_p=0.0` are
    off; `seed=None` draws one from torch's global generator when the request starts (so `torch.manual_seed`
    makes it reproducible). `presence_penalty` / `frequency_penalty` (OpenAI's, over the tokens generated so far),
    `repetition_penalty` (Transformers' and vLLM's, over the prompt and the generated tokens; 1.0 is off) and
    `logit_bias` ((token id, bias) pairs) change the logits before any filter, greedy rows too; `logprobs`
    (None: off; 0: the chosen token's log-probability; k <= 20: also the k most likely) reports the model's own
    distribution (log-softmax of the raw logits). Invalid values raise `GenerateError` (a `ValueError`) naming the
    value and the rule."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k, self.seed)
        object.__setattr__(self, "logit_bias", check_extras(self.min_p, self.presence_penalty, self.frequency_penalty,
                                                            self.repetition_penalty, self.logit_bias, self.logprobs))

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax (temperature 0)."""
        return self.temperature == 0

    @property
    def processed(self) -> bool:
        """Whether the request needs more than temperature / top-k / top-p / seed: penalties, a bias, min-p or
        logprobs (hwrun's engine steps it with its processed step)."""
        return bool(self.min_p or self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.logprobs is not None)


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


def _real(name: str, value: Any, low: float, high: float, rule: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value <= high:
        raise GenerateError(f"{name}={value!r} must be {rule}.")
    return float(value)


def check_extras(min_p: Any, presence_penalty: Any, frequency_penalty: Any, repetition_penalty: Any,
                 logit_bias: Any, logprobs: Any) -> tuple[tuple[int, float], ...]:
    """Raise `GenerateError` for a penalty, bias, min-p or logprobs value no decoder can use; return `logit_bias`
    as sorted (token id, bias) pairs (a mapping is taken too)."""
    _real("min_p", min_p, 0.0, 1.0, "in [0, 1] (0 turns min-p filtering off; 0.05 is a common value)")
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        _real(name, value, -2.0, 2.0, "in [-2, 2] as OpenAI defines it (0 is off)")
    if (isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, numbers.Real)
            or not 0 < repetition_penalty < float("inf")):
        raise GenerateError(f"repetition_penalty={repetition_penalty!r} must be a finite number > 0 (1.0 is off; "
                            "above 1 discourages repeats, as in Transformers and vLLM).")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, numbers.Integral)
                                 or not 0 <= logprobs <= MAX_LOGPROBS):
        raise GenerateError(f"logprobs={logprobs!r} must be None (off) or an integer from 0 (the chosen token's "
                            f"log-probability) to {MAX_LOGPROBS} (and that many most likely tokens).")
    pairs = logit_bias.items() if isinstance(logit_bias, dict) else logit_bias
    try:
        pairs = list(pairs)
    except TypeError:
        raise GenerateError(f"logit_bias={logit_bias!r} must be (token id, bias) pairs or a dict of them.") from None
    seen: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise GenerateError(f"logit_bias entry {pair!r} must be a (token id, bias) pair.")
        token, bias = pair
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise GenerateError(f"logit_bias token id {token!r} must be an integer >= 0.")
        if int(token) in seen:
            raise GenerateError(f"logit_bias names token id {token} twice; give each id one bias.")
        seen[int(token)] = _real(f"logit_bias[{token}]", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS,
                                 f"a number in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] (OpenAI's range)")
    return tuple(sorted(seen.items()))


def choice_seed(params: SamplingParams, index: int) -> SamplingParams:
    """`params` for choice `index` of a request with several (`n`): choice 0 keeps the seed, choice i > 0 gets a
    seed derived from it and `i` (different, deterministic); an unseeded request's choices each draw their own."""
    import dataclasses

    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=int(mix32_int((int(params.seed) & _MASK32) ^ (index * 0x9E3779B9))))


def mix32_int(x: int) -> int:
    """`mix32` of one Python integer (the same hash, on the host)."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


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
    # 23 random bits: (bits + 0.5) / 2**23 is exact in float32 and lies in [2**-24, 1 - 2**-24]. With 24 bits the
    # largest value, 16777215.5, rounds to 2**24 in float32, so u was 1.0 once in 2**24 draws: Gumbel noise +inf,
    # that token chosen whatever its probability (and NaN, also chosen by argmax, where a filter or a grammar mask
    # had set it to -inf): a 128k-token vocabulary hit it about once every 128 steps
    bits = mix32(key[:, None] ^ index[None, :]) >> 9
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 23))


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


def filter_logits(logits: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any = None) -> Any:
    """float32 logits / temperature with everything outside top-k, then top-p, then min-p (when `min_p`, one per
    row, is given) set to -inf (per row; `top_k` 0, `top_p` 1 and `min_p` 0 are off; a row with temperature 0 is
    divided by 1). Fixed shapes."""
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
    filtered = scaled.masked_fill(scaled < threshold, float("-inf"))
    if min_p is None:
        return filtered
    # Transformers' MinPLogitsWarper: drop tokens below min_p x the most likely one's probability (it stays)
    kept = torch.softmax(filtered, dim=-1)
    return filtered.masked_fill(kept < min_p[:, None] * kept.amax(dim=-1, keepdim=True), float("-inf"))


def next_tokens(logits: Any, temperature: Any, top_p: Any, top_k: Any, seed: Any, counter: Any, *,
                filter: Any = None, min_p: Any = None) -> Any:
    """(rows,) long: greedy argmax for rows with temperature 0, else a Gumbel-max draw from the filtered
    softmax with the row's counter-based noise. `counter` is each row's index of the token being chosen;
    `filter` replaces `filter_logits` (a compiled step passes an eager one where Inductor cannot compile it);
    `min_p` (one per row) adds the min-p filter."""
    import torch

    greedy = logits.argmax(dim=-1)
    if min_p is None:
        filtered = (filter or filter_logits)(logits, temperature, top_k, top_p)
    else:
        filtered = (filter or filter_logits)(logits, temperature, top_k, top_p, min_p)
    gumbel = -torch.log(-torch.log(uniform_noise(seed, counter, logits.shape[-1])))
    drawn = (filtered + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, greedy)
