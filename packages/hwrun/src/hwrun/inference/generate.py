"""`generate()`: text for one prompt or many, with static or continuous batching, tokens/s and why.

Static batching left-pads the prompts and calls `model.generate` (X10); continuous batching hands
token ids to Transformers' `model.generate_batch` (X11). Greedy decoding gives the same tokens
both ways (tested). Which loop runs is decided once, by `hwrun.inference.decision.decide` (the same module
decides for `hwrun serve`): Transformers' loop, or hwrun's own graph loops (`hwrun.inference.decode.static` for a
static batch, `hwrun.inference.engine` for continuous batching). This module checks the input, asks for the
decision, and runs the loop it names.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ContinuousBatchingError, GenerateError
from .batching import continuous_config, continuous_warmup
from .decision import CACHE_BUCKET, DecodeDecision, compile_cache, decide, planned, static_instead
from .limits import check_context, check_new_tokens, context_length, new_tokens_limit

if TYPE_CHECKING:
    from ..model.plan import RunPlan

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class GenerationResult:
    """What `generate()` returns: texts, token ids and counts, timing, and the decisions taken."""

    texts: list[str]
    token_ids: list[list[int]]
    prompt_tokens: list[int]
    new_tokens: list[int]
    seconds: float
    batching: str
    batching_reason: str
    decode: str = "generate"
    decode_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    compile_reason: str = ""  # whether hwrun's step was compiled, and why ("" where Transformers' loop ran)
    warmup_seconds: float = 0.0  # of `seconds`: capturing (and compiling) hwrun's step graphs in this call

    @property
    def total_new_tokens(self) -> int:
        """Generated tokens summed over all prompts."""
        return sum(self.new_tokens)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time (all prompts together)."""
        return self.total_new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def text(self) -> str:
        """The first (or only) prompt's text."""
        return self.texts[0]


def _check_inputs(prompts: Any, max_new_tokens: Any, max_new_tokens_limit: Any = None) -> list[str]:
    """The prompts as a list, after checking them, `max_new_tokens` and its ceiling (`limits.new_tokens_limit`)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, (bytes, bytearray)):
        raise GenerateError(f"prompts={prompts!r} must be a string or a list of strings.")
    prompts = list(prompts)
    if not prompts:
        raise GenerateError("prompts=[] is empty: pass at least one prompt string.")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise GenerateError(f"prompts[{index}]={prompt!r} is not a string; every prompt must be text.")
        if not prompt.strip():
            raise GenerateError(f"prompts[{index}]={prompt!r} is empty: every prompt needs at least one token of text.")
        surrogate = next((c for c in prompt if "\ud800" <= c <= "\udfff"), None)
        if surrogate is not None:
            raise GenerateError(f"prompts[{index}] holds a lone surrogate (U+{ord(surrogate):04X} at position "
                                f"{prompt.index(surrogate)}): it is not text any tokenizer can encode (often bytes "
                                "decoded with the wrong codec). Fix: decode the input as UTF-8, or drop the character.")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise GenerateError(f"max_new_tokens={max_new_tokens!r} must be a positive integer (e.g. 50).")
    check_new_tokens(max_new_tokens, new_tokens_limit(max_new_tokens_limit))
    return prompts


def _sampling_kwargs(do_sample: bool, temperature: float, top_p: float, top_k: int | None,
                     seed: int | None = None) -> dict[str, Any]:
    """`model.generate`'s sampling keywords; invalid values raise `GenerateError` whether or not `do_sample`."""
    from .decode.sampling import check_sampling

    if not isinstance(do_sample, bool):
        raise GenerateError(f"do_sample={do_sample!r} must be True or False.")
    temperature = 1.0 if temperature is None else temperature  # None: Transformers' default
    top_p = 1.0 if top_p is None else top_p
    check_sampling(temperature, top_p, 0 if top_k is None else top_k, seed)
    if do_sample:
        if temperature <= 0:
            raise GenerateError(f"temperature={temperature!r} must be > 0 when sampling; use do_sample=False for greedy.")
        if not 0 < top_p <= 1:
            raise GenerateError(f"top_p={top_p!r} must be in (0, 1].")
        kwargs: dict[str, Any] = {"do_sample": True, "temperature": temperature, "top_p": top_p}
        if top_k is not None:
            kwargs["top_k"] = top_k
        return kwargs
    return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}


def _graph_sampling(sampling: dict[str, Any], seed: int | None, model: Any) -> Any:
    """The `SamplingParams` the graph decoders use for `generate()`'s sampling keywords: greedy without
    `do_sample`; a `top_k` left out is the model's `generation_config.top_k`, as `model.generate` reads it.
    Every prompt gets the same seed, so each gets the tokens it would get alone."""
    from .decode.sampling import SamplingParams

    if not sampling["do_sample"]:
        return SamplingParams()
    top_k = sampling["top_k"] if "top_k" in sampling else getattr(model.generation_config, "top_k", None)
    return SamplingParams(temperature=float(sampling["temperature"]), top_p=float(sampling["top_p"]),
                          top_k=int(top_k or 0), seed=seed)


def _truncate(tokens: list[int], eos: set[int]) -> list[int]:
    """Tokens up to and including the first EOS."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


def _eos_token_id(model: Any, tokenizer: Any) -> Any:
    """The model's EOS id(s), else the tokenizer's (None when neither has one)."""
    eos = model.generation_config.eos_token_id
    return tokenizer.eos_token_id if eos is None else eos


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    from .engine.requests import eos_ids

    return set(eos_ids(model, _eos_token_id(model, tokenizer)))


def generate(
    plan: RunPlan | None,
    prompts: str | Sequence[str],
    max_new_tokens: int = 50,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    max_new_tokens_limit: int | None = None,
    batching: str = "auto",
    decode: str = "auto",
    stream: bool = False,
    streamer: Any = None,
    progress: bool = False,
    model: Any = None,
    tokenizer: Any = None,
    compile: bool | str = "auto",
) -> GenerationResult:
    """Generate up to `max_new_tokens` for each prompt; `plan=None` plans the shipped model here.

    Pass `model`/`tokenizer` from `load(plan)` to reuse them across calls. Bad input (no prompts,
    an empty prompt, max_new_tokens <= 0) raises `GenerateError` before anything loads.
    `max_new_tokens` above `max_new_tokens_limit` (default: `HWRUN_MAX_NEW_TOKENS_LIMIT`, else 32768), a
    prompt longer than the model's context (`max_position_embeddings`) or prompt + `max_new_tokens` beyond
    it, and invalid sampling values (temperature < 0, top_p outside (0, 1], top_k < 0, a seed that is
    not an integer) raise `GenerateError` before any generation.
    `stream=True` prints the text as it is produced (a `TextStreamer`); `streamer` takes any object
    with Transformers' streamer protocol (`put(tensor)`, `end()`: `TextIteratorStreamer`, ...) instead.
    Both stream one prompt, through `model.generate` or the static graph decoder.
    On a tensor-parallel plan (`plan.tp` > 1, in each torchrun rank) every rank makes the same call: hwrun's engine
    runs on every rank (`hwrun.parallel.generate`: arguments and seed agreed, tokens compared at the end).
    `compile` (hwrun's graph loops): "auto" compiles the step where the plan does (`plan(compile=True)`), else only
    where the measured costs say it pays for this run's tokens (`compile_costs.compile_pays`; the reason says which and
    why); True compiles with the device's default backend, False never.
    """
    prompts = _check_inputs(prompts, max_new_tokens, max_new_tokens_limit)
    sampling = _sampling_kwargs(do_sample, temperature, top_p, top_k, seed)
    if plan is None:
        from ..model.plan import plan as make_plan

        plan = make_plan()
    if streamer is not None and not all(callable(getattr(streamer, name, None)) for name in ("put", "end")):
        raise GenerateError(f"streamer={streamer!r} has no put()/end(); pass a Transformers streamer "
                            "(TextStreamer, TextIteratorStreamer) or an object with both methods.")
    stream = stream or streamer is not None
    before = planned(plan, len(prompts), decode=decode, batching=batching, stream=stream, compile=compile,
                     max_new_tokens=max_new_tokens)  # refused before load
    if stream and len(prompts) > 1:
        raise GenerateError(f"stream=True (or a streamer) streams one prompt; got {len(prompts)} prompts. "
                            "Stream them one at a time.")
    if (model is None) != (tokenizer is None):
        raise GenerateError("pass both model= and tokenizer= (from hwrun.load(plan)), or neither.")
    if model is None:
        from ..model.load import load

        check_context(max_new_tokens, context_length(plan.model_source().config))  # before loading
        model, tokenizer = load(plan)
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    check_context(max_new_tokens, context_length(model.config), lengths)
    tp, torch_seed = getattr(plan, "tp", 1), seed
    if tp > 1:  # every rank runs this call: its arguments checked against rank 0's, one seed for torch's generator
        from ..parallel.generate import agree_inputs

        torch_seed = agree_inputs(prompts, max_new_tokens, sampling, seed, decode=decode, batching=batching)
    decision = decide(plan, model, n_prompts=len(prompts), needed=max(lengths) + max_new_tokens, decode=decode,
                      batching=batching, stream=stream, before=before, compile=compile, max_new_tokens=max_new_tokens)
    compile_cache(decision)  # a compiled step reads and writes hwcompile's persistent cache (HWSTACK_COMPILE_CACHE=0: off)
    import torch

    if torch_seed is not None:
        torch.manual_seed(torch_seed)
    eos = _eos_ids(model, tokenizer)
    if stream and streamer is None:
        from transformers import TextStreamer

        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    # Transformers' continuous batching runs its loop in a thread of its own, which is not in inference mode:
    # tensors its warm-up creates here under inference_mode() are then updated in place there, and CUDA raises
    # "Inplace update to inference tensor outside InferenceMode" (issue 26). no_grad() is enough for it.
    runner = decision.runner
    captured = capture_seconds_of(model)
    with torch.no_grad() if runner == "generate_batch" else torch.inference_mode():
        if runner == "engine":
            ids, prompt_lens, seconds = _engine(plan, decision, model, tokenizer, prompts, max_new_tokens,
                                                _graph_sampling(sampling, seed, model))
        elif runner == "generate_batch":
            try:
                ids, prompt_lens, seconds = _continuous(plan, model, tokenizer, prompts, max_new_tokens, sampling,
                                                        progress)
            except ContinuousBatchingError as exc:
                if batching == "continuous":
                    raise
                # e.g. transformers 5.25's GPT-NeoX attention calls the paged cache's update() without
                # its kwargs: the model's own code, not the request, so static batching still runs it
                decision = static_instead(plan, decision, str(exc).removesuffix("; use batching='static'."), decode)
                ids, prompt_lens, seconds = _static(model, tokenizer, prompts, max_new_tokens, sampling, streamer,
                                                    progress)
        elif runner == "static_graphs":
            ids, prompt_lens, seconds = _graphs(plan, decision, model, tokenizer, prompts, max_new_tokens, streamer,
                                                _graph_sampling(sampling, seed, model))
        else:
            ids, prompt_lens, seconds = _static(model, tokenizer, prompts, max_new_tokens, sampling, streamer,
                                                progress)
    ids = [_truncate(row, eos) for row in ids]
    if tp > 1:
        from ..parallel.ranks import check_same_tokens

        check_same_tokens(ids)  # every rank decoded the same tokens (RankDivergenceError naming where not)
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    return GenerationResult(
        texts=texts, token_ids=ids, prompt_tokens=prompt_lens, new_tokens=[len(r) for r in ids], seconds=seconds,
        batching=decision.batching, batching_reason=decision.batching_reason, decode=decision.decode,
        decode_reason=decision.reason, compile_reason=decision.compile_reason,
        warmup_seconds=max(0.0, capture_seconds_of(model) - captured),
    )


def _static(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, sampling: dict,
            streamer: Any, progress: bool) -> tuple[list[list[int]], list[int], float]:
    """One left-padded batch through `model.generate` (X10)."""
    tokenizer.padding_side = "left"
    inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    start = time.perf_counter()
    out = model.generate(
        **inputs, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, streamer=streamer, **sampling
    )
    rows = out[:, inputs["input_ids"].shape[1]:].tolist()
    seconds = time.perf_counter() - start
    prompt_lens = inputs["attention_mask"].sum(dim=1).tolist()
    return rows, [int(n) for n in prompt_lens], seconds


def _continuous(plan: RunPlan, model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int,
                sampling: dict, progress: bool) -> tuple[list[list[int]], list[int], float]:
    """Transformers' continuous batching: `model.generate_batch` over token-id lists (X11)."""
    from transformers import GenerationConfig

    encoded = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    eos = _eos_token_id(model, tokenizer)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, eos_token_id=eos if eos is not None else -1,
        pad_token_id=tokenizer.pad_token_id, **{k: v for k, v in sampling.items() if v is not None},
    )
    cb_config = continuous_config(plan, [len(e) for e in encoded], max_new_tokens)
    warmup = continuous_warmup(plan.accelerator.kind)
    start = time.perf_counter()
    extra = {"warmup": warmup} if "warmup" in inspect.signature(model.generate_batch).parameters else {}
    outputs = model.generate_batch(encoded, generation_config=config, continuous_batching_config=cb_config,
                                   progress_bar=progress, **extra)
    seconds = time.perf_counter() - start
    results = list(outputs.values())
    if len(results) != len(encoded):
        raise ContinuousBatchingError(f"continuous batching returned {len(results)} results for {len(encoded)} prompts; "
                            "see the transformers log above, or use batching='static'.")
    failed = [r for r in results if r.error is not None]
    if failed:
        raise ContinuousBatchingError(f"continuous batching failed for {len(failed)} prompt(s): {failed[0].error}; "
                            "use batching='static'.")
    return [list(r.generated_tokens) for r in results], [len(e) for e in encoded], seconds


#: The model attribute holding its graph decoders, keyed by (batch, cache length bucket, graphs, backend), so
#: repeated calls replay an already captured graph instead of capturing (and compiling) again. On the model, not
#: in a module-level WeakKeyDictionary: a decoder holds its model, so such a dictionary's keys never died and every
#: model given to generate() stayed in device memory for the life of the process (found on an H100, 2026-12-06:
#: peak memory grew by each earlier model in tools/bench/quantization.py). The model -> decoders -> model cycle is
#: freed with the model by the garbage collector.
DECODERS_ATTRIBUTE = "_hwrun_decoders"


def decoders_of(model: Any) -> dict:
    """The graph decoders `generate()` keeps for `model` (empty until one is built); freed with the model."""
    return model.__dict__.setdefault(DECODERS_ATTRIBUTE, {})


def capture_seconds_of(model: Any) -> float:
    """Seconds the model's graph decoders have spent capturing (and compiling) their steps so far."""
    return sum(decoder.capture_seconds or 0.0 for decoder in decoders_of(model).values())


def _decoder(model: Any, needed: int, decision: DecodeDecision, platform: Any, batch: int | None = None) -> Any:
    """The graph decoder `decision` names for a cache of `needed` positions (rounded up to `CACHE_BUCKET`), built
    with what the decision says (`engine_options`: step, graphs, compile, row buckets) or reused from the model:
    hwrun's engine over `decision.slots` rows, or the static decoder over a batch of `batch` prompts."""
    from .decode.static import GraphDecoder
    from .engine import EngineCore

    length = -(-needed // CACHE_BUCKET) * CACHE_BUCKET
    per_model = decoders_of(model)
    engine = decision.runner == "engine"
    backend = decision.compile_backend
    key = (engine, decision.slots if engine else batch, length, decision.use_graphs,
           backend if isinstance(backend, str) or backend is None else id(backend),
           platform.kind if platform is not None else None, decision.step, decision.buckets)
    if key not in per_model:
        if engine:
            per_model[key] = EngineCore(model, max_cache_len=length, platform=platform, **decision.engine_options())
        else:
            per_model[key] = GraphDecoder(model, batch_size=batch, max_cache_len=length,
                                          use_graphs=decision.use_graphs, compile_backend=backend, platform=platform)
    return per_model[key]


def _engine(plan: RunPlan, decision: DecodeDecision, model: Any, tokenizer: Any, prompts: list[str],
            max_new_tokens: int, sampling: Any = None) -> tuple[list[list[int]], list[int], float]:
    """Continuous batching through hwrun's engine (`hwrun.inference.engine`; EOS and budgets checked on the host)."""
    encoded = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    decoder = _decoder(model, max(map(len, encoded)) + max_new_tokens, decision, plan.accelerator.platform)
    start = time.perf_counter()
    rows = decoder.generate(encoded, max_new_tokens, eos_token_id=sorted(_eos_ids(model, tokenizer)) or None,
                            sampling=sampling)
    return rows, [len(e) for e in encoded], time.perf_counter() - start


def _graphs(plan: RunPlan, decision: DecodeDecision, model: Any, tokenizer: Any, prompts: list[str],
            max_new_tokens: int, streamer: Any = None, sampling: Any = None) -> tuple[list[list[int]], list[int], float]:
    """Decode through `hwrun.inference.decode.static` (one prompt at a time unless all have the same length);
    a `streamer` gets the one prompt's tokens as the decoder reads them (each `check_every` chunk)."""
    import torch

    encoded = [tokenizer(p, return_tensors="pt")["input_ids"] for p in prompts]
    lengths = {e.shape[1] for e in encoded}
    batches = [torch.cat(encoded)] if len(lengths) == 1 else encoded
    eos = sorted(_eos_ids(model, tokenizer)) or None
    rows: list[list[int]] = []
    start = time.perf_counter()
    for batch in batches:
        decoder = _decoder(model, batch.shape[1] + max_new_tokens, decision, plan.accelerator.platform,
                           batch=batch.shape[0])
        out = decoder.generate(batch.to(model.device), max_new_tokens, eos_token_id=eos, sampling=sampling,
                               streamer=streamer)
        rows.extend(out.tolist())
    seconds = time.perf_counter() - start
    return rows, [e.shape[1] for e in encoded], seconds
