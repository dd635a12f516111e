"""Load the plan's model once, choose the engine (and say why), build and warm its backend.

Runs in the engine's worker thread, so the server answers `/health` (503) while the model loads.
`decide_engine` asks the decision (`hwrun.inference.decision.decide_serving`, the one place that decides how hwrun
decodes, with the context served and the `--max-concurrency` slots): for `--engine auto`, hwrun's slot engine where
the platform has graphs (CUDA, XPU or Gaudi's HPU graphs: on Gaudi the start-up captures one graph set per bucket,
with progress; a bridge in eager mode records none, so its steps run eagerly, logged) and one of its steps runs the
model at that context (the fused Llama-family step where it applies, else the model's own forward over a per-row
slot cache: any family with sdpa or eager attention through Transformers' attention interface); Transformers'
continuous batching where it runs and the slot engine does not, or the platform has no graphs (CPU); the slot engine
eagerly where only it runs (MPS); otherwise an `EngineStartError` with every reason. A slot engine that still
refuses to build (e.g. `--kv-cache-memory` too small) is an `EngineStartError`, not a silent switch of engine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import EngineStartError, FastDecodeError
from .engine import Backend, EngineChoice, EngineEvent, EngineRequest
from .protocol import Sampling

if TYPE_CHECKING:
    from ..inference.decision import DecodeDecision
    from ..model.plan import RunPlan
    from .config import ServeConfig

logger = logging.getLogger(__name__)

#: Seconds the warm-up request may take before the start is called failed.
WARMUP_TIMEOUT = 600.0
#: New tokens of the warm-up request (it runs the prefill, the decode step and the sampling path once).
WARMUP_TOKENS = 4


@dataclass(frozen=True)
class Loaded:
    """What the server needs from the load: the tokenizer, the engine choice, the context and the backend."""

    tokenizer: Any
    choice: EngineChoice
    max_model_len: int
    max_model_len_reason: str
    eos_ids: tuple[int, ...]
    backend: Backend
    load_seconds: float
    warm_seconds: float
    threads: int | None = None  # torch intra-op threads set for serving (None: left as they were)
    threads_reason: str = ""
    previous_threads: int | None = None  # what to restore when the server stops
    kv: dict | None = None  # the slot engine's KV blocks (`KVReport.as_dict`); None for Transformers' engine


def decide_engine(plan: RunPlan, config: ServeConfig, model: Any, max_len: int) -> DecodeDecision:
    """The serving decision for `config` (engine, adapters, `max_concurrency` slots) over `model` at `max_len`:
    `decide_serving`'s, which also says what the slot engine is built with (step, graphs, compile, row buckets)."""
    from ..inference.decision import decide_serving

    return decide_serving(plan, model, config.engine, adapters=len(config.adapters), max_cache_len=max_len,
                          slots=config.max_concurrency)


def model_context(model: Any) -> int | None:
    """The model's context length (`max_position_embeddings`), or None when its config has none."""
    config = model.config.get_text_config()
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def load_backend(plan: RunPlan, config: ServeConfig) -> Loaded:
    """Load the model, choose the engine, build its backend and warm it with one short request (torch's thread
    count set for serving first, as `torch_threads_for` decides, and given back if the start fails)."""
    start = time.perf_counter()
    threads, threads_reason, previous = apply_torch_threads(plan, config)
    try:
        return _load(plan, config, start, threads, threads_reason, previous)
    except BaseException:
        if threads is not None:
            import torch

            torch.set_num_threads(previous)
        raise


def _build(plan: RunPlan, config: ServeConfig) -> tuple[Any, EngineChoice, int, str, tuple[int, ...], Backend]:
    """Load the model and build its (unwarmed) backend: (tokenizer, choice, context, its reason, EOS ids, backend).
    Every tensor-parallel rank runs this, in the same order (each holds its shards; a slot engine each)."""
    from ..model.load import load
    from .config import context_limit

    model, tokenizer = load(plan)
    max_len, len_reason = context_limit(config.max_model_len, model_context(model))
    eos = tuple(sorted(_eos_ids(model, tokenizer)))
    decision = decide_engine(plan, config, model, max_len)
    choice = EngineChoice(decision.engine, decision.reason)
    backend: Backend | None = None
    if choice.name == "slots":  # decide_serving asked the engine's steps already: a refusal now is this server's
        try:
            backend = _slots_backend(plan, model, config, decision, max_len, eos, tokenizer)
        except FastDecodeError as exc:
            raise EngineStartError(f"hwrun's slot engine cannot start: {exc}") from exc
    if backend is None:
        from ..inference.batching import continuous_warmup
        from .backend_transformers import TransformersBackend

        backend = TransformersBackend(model, kind=plan.accelerator.kind, eos_ids=list(eos),
                                      max_concurrency=config.max_concurrency, max_model_len=max_len,
                                      pad_token_id=tokenizer.pad_token_id,
                                      warmup=continuous_warmup(plan.accelerator.kind))
    return tokenizer, choice, max_len, len_reason, eos, backend


def _load(plan: RunPlan, config: ServeConfig, start: float, threads: int | None, threads_reason: str,
          previous: int) -> Loaded:
    tokenizer, choice, max_len, len_reason, eos, backend = _build(plan, config)
    if getattr(plan, "tp", 1) > 1:  # rank 0: every engine call goes to the other ranks first
        from ..parallel.lockstep import LeaderBackend, control_group

        backend = LeaderBackend(backend, control_group(), end_group=True)
    loaded_at = time.perf_counter()
    warm(backend, tokenizer)
    return Loaded(tokenizer=tokenizer, choice=choice, max_model_len=max_len, max_model_len_reason=len_reason,
                  eos_ids=eos, backend=backend, load_seconds=loaded_at - start,
                  warm_seconds=time.perf_counter() - loaded_at, threads=threads, threads_reason=threads_reason,
                  previous_threads=previous, kv=kv_of(backend))


def kv_of(backend: Any) -> dict | None:
    """What the backend's KV blocks hold (`KVReport.as_dict`), where it has them (the slot engine)."""
    inner = getattr(backend, "backend", backend)  # a tensor-parallel leader wraps rank 0's backend
    report = getattr(getattr(inner, "decoder", None), "kv_report", None)
    return None if report is None else report.as_dict()


def apply_torch_threads(plan: RunPlan, config: ServeConfig) -> tuple[int | None, str, int]:
    """Set torch's intra-op threads as `torch_threads_for` decides; (set value or None, reason, previous value)."""
    import os

    import torch

    from .config import torch_threads_for

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads, reason = torch_threads_for(plan.accelerator.platform.is_accelerator, cores, given=config.torch_threads)
    previous = torch.get_num_threads()
    if threads is not None and threads != previous:
        torch.set_num_threads(threads)
    return threads, reason, previous


def restore_torch_threads(loaded: Loaded | None) -> None:
    """Give torch back the thread count it had before the server started (the server is stopping)."""
    if loaded is None or loaded.threads is None or loaded.previous_threads is None:
        return
    import torch

    torch.set_num_threads(loaded.previous_threads)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    from ..inference.generate import _eos_ids as eos_of

    return eos_of(model, tokenizer)


def _slots_backend(plan: RunPlan, model: Any, config: ServeConfig, decision: DecodeDecision, max_len: int,
                   eos: tuple[int, ...] = (), tokenizer: Any = None) -> Backend:
    """hwrun's slot engine as `decision` says to build it (`engine_options`: slots, step, graphs, compile, row
    buckets), with the config's adapters and KV memory, started behind a `SlotsBackend`."""
    from ..inference.decision import compile_cache
    from ..inference.decode import SamplingParams
    from ..inference.engine import EngineCore
    from .backend_slots import SlotsBackend

    compile_cache(decision)  # a compiled step reads and writes hwcompile's persistent cache (HWSTACK_COMPILE_CACHE=0: off)
    adapters = tuple(config.adapters) or None  # per request: the model step, eager (decide_serving said why)
    decoder = EngineCore(model, max_cache_len=max_len, platform=plan.accelerator.platform, adapters=adapters,
                         kv_cache_memory=config.kv_cache_memory, **decision.engine_options())
    if decoder.kv_report is not None:
        logger.info("slot engine: %s", decoder.kv_report.line())
    logger.info("slot engine: step %s (%s); %s; %s", decision.step, decision.step_reason, decision.graphs_reason,
                decision.buckets_reason)
    # the stop ids the transformers engine uses too: the model's, else the tokenizer's EOS
    backend = SlotsBackend(decoder, sampling_class=SamplingParams, eos_token_id=list(eos) or None, tokenizer=tokenizer)
    backend.start()
    return backend


def warm(backend: Backend, tokenizer: Any, timeout: float = WARMUP_TIMEOUT) -> list[int]:
    """Run one short greedy request through `backend` (prefill, decode steps, output path) and return its tokens;
    `EngineStartError` when it fails or does not finish within `timeout` seconds."""
    ids = tokenizer("Hello", add_special_tokens=True)["input_ids"] or [0]
    backend.add(EngineRequest("hwrun-warmup", tuple(ids), WARMUP_TOKENS, Sampling(temperature=0.0)))
    tokens: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events: list[EngineEvent] = backend.step()
        for event in events:
            tokens += event.token_ids
            if event.finished:
                if event.finish_reason == "error":
                    raise EngineStartError(f"the {backend.name} engine failed its warm-up request: {event.error}")
                return tokens
    backend.cancel("hwrun-warmup")
    raise EngineStartError(f"the {backend.name} engine's warm-up request did not finish within {timeout:.0f} s.")


def serve_follower(plan: RunPlan, config: ServeConfig) -> int:
    """A tensor-parallel rank other than 0 under `hwrun serve --tp N`: load its shards, build the same slot engine,
    then repeat rank 0's engine calls until rank 0 closes (`hwrun.parallel.lockstep.follow`); returns 0."""
    import signal

    from ..parallel.lockstep import control_group, follow
    from ..parallel.ranks import finish

    # the ranks stop when rank 0 closes its engine: SIGTERM/SIGINT from torchrun or the terminal would leave rank 0
    # waiting on a rank that is gone (rank 0's front drains first, then its engine core tells this rank to stop)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads, _reason, _previous = apply_torch_threads(plan, config)
    try:
        *_, backend = _build(plan, config)
        steps = follow(backend, control_group())
        logger.info("tensor-parallel rank: rank 0 closed the engine after %d steps", steps)
        return 0
    finally:
        finish()


def check_tp_options(plan: RunPlan, config: ServeConfig) -> None:
    """Refuse serve options that tensor-parallel ranks do not run, before anything starts (TensorParallelError)."""
    from ..errors import TensorParallelError

    if config.engine == "transformers":
        raise TensorParallelError(f"--tp {plan.tp} with --engine transformers: tensor-parallel ranks run hwrun's slot "
                                  "engine in lockstep (rank 0 schedules); leave --engine out or pass --engine slots.")
    if getattr(config, "adapters", None):
        raise TensorParallelError(f"--tp {plan.tp} with --lora: PEFT's adapter layers are not in Transformers' "
                                  "tensor-parallel plan; serve the adapters without --tp, or merge them first.")


def serve_rank(plan: RunPlan, config: ServeConfig, argv: list[str]) -> int | None:
    """`hwrun serve --tp N` (`argv`: the command's arguments): None where this process is rank 0 (it serves as usual,
    its engine core joining the group as rank 0); else the exit status of what it did instead: started the N ranks
    through torchrun (`hwrun.parallel.launch`), or, as another rank, followed rank 0's engine (`serve_follower`)."""
    from ..parallel.launch import exit_with_launcher, rank_launch, run_ranks
    from ..parallel.ranks import is_leader, launched_ranks

    check_tp_options(plan, config)
    if not launched_ranks(plan.tp):
        return run_ranks(rank_launch(plan, argv), "hwrun serve", drain_leader=True)
    exit_with_launcher()
    if is_leader():
        return None
    return serve_follower(plan, config)
