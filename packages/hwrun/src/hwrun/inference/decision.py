"""How a run decodes, decided once: the one place that picks the loop, for `generate()` and `hwrun serve` alike.

Three loops can decode a prompt: Transformers' own (`model.generate` for a static batch, `model.generate_batch`
for continuous batching, X10/X11), hwrun's static-cache graph decoder (`inference/decode/static.py`, a batch of
prompts of one length) and hwrun's engine (continuous batching over cache slots, one graph replay per step:
`inference/engine/`). `decide()` picks one after the model is loaded, from the plan (device, its graph API,
compile, quantization, device_map), the model (its attention, its family's step), the workload (prompts,
streaming, the cache length it needs) and what the caller asked (`decode`, `batching`, serve's `--engine`),
and returns a `DecodeDecision` holding the choice and every reason. `planned()` is the same rule before load,
for `hwrun plan` (`planned_serving()` for `hwrun serve`). Nothing else in hwrun chooses a loop: the runners only run
what they are handed. The decision also says what hwrun's loops are built with (`_engine_setup`: the step, graph
capture, slots and row buckets; `engine_options()`), and whether the step is compiled: the plan's compile, or for
`compile="auto"` without one, `compile_pays` over the measured costs in `compile_costs.COMPILE_COSTS` (break-even: tokens x
(eager step - compiled step) against the compile's cost).

The rule, per caller:
- `generate()`, `decode="auto"`: hwrun's graph loops where the platform has CUDA or XPU graphs
  (`AUTO_GRAPH_APIS`; Gaudi's HPU graphs record in lazy mode only, where compile is refused, so they are used on
  `decode="graphs"` only) and the model runs there (plain or torchao weights, one device, attention the loops
  reproduce), compiled or not: without compile the eager step is captured as one graph, which needs no compile
  before the first token (fast by default: Transformers' eager loop decoded 19.1 tok/s on an H100 on 2026-12-06,
  where the compiled graph loop did 813); Transformers' loop otherwise, with the reason.
- `hwrun serve`, `--engine auto`: hwrun's engine wherever the platform has graphs, Gaudi's HPU graphs included (a
  server runs long enough for the capture to pay, compile or not; on Gaudi the start-up warms one graph set per
  bucket, with progress); Transformers' continuous batching where it runs and hwrun's engine does not (or the
  platform has no graphs); hwrun's engine eagerly where only it runs (MPS).
- tensor parallel (`plan.tp` > 1), both callers: hwrun's engine on every rank, the model's own forward (the fused
  step reads whole weights), graph replay where the platform has graphs (`_tp_planned`, `decide_serving`); for
  `generate()`, Transformers' `model.generate` on one static batch where `decode="generate"` or `batching="static"`
  is asked for, or where the engine cannot run the model (logged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import EngineStartError, GenerateError
from .batching import (
    BATCHING,
    BatchingChoice,
    choose_batching,
    continuous_model_blocker,
    continuous_plan_blockers,
    engine_plan_blockers,
    model_batching,
)
from .compile_costs import compile_pays

if TYPE_CHECKING:
    from ..model.plan import RunPlan

logger = logging.getLogger(__name__)

#: `generate(decode=...)`: "generate" is Transformers' loop, "graphs" hwrun's graph loops, "auto" decides.
DECODE = ("auto", "generate", "graphs")
#: `hwrun serve --engine`: "slots" is hwrun's engine, "transformers" Transformers' continuous batching.
ENGINES = ("auto", "slots", "transformers")
#: The platform graph APIs hwrun's loops capture with (`hwenv.platforms.runtime.graph_tools`), and how reasons name them.
GRAPH_DECODE_APIS = {"cuda_graphs": ("CUDA", "CUDA graph"), "xpu_graphs": ("XPU", "XPU graph"),
                     "hpu_graphs": ("Gaudi", "HPU graph")}
#: The graph APIs `generate(decode="auto")` picks. Not Gaudi's: the bridge records HPU graphs in lazy mode only,
#: where torch.compile is refused (G2), and a short run does not pay their capture. (`hwrun serve --engine auto`
#: asks `graph_api_of` instead and does capture HPU graphs: a server runs long enough.)
AUTO_GRAPH_APIS = frozenset({"cuda_graphs", "xpu_graphs"})
#: Cache lengths are rounded up to a multiple of this, so nearby workloads share one captured decoder.
CACHE_BUCKET = 256

#: `DecodeDecision.runner` values: which loop runs.
RUNNERS = ("engine", "static_graphs", "generate", "generate_batch")
#: Most slots (concurrent prompts) `generate()`'s engine runs; more prompts wait for a free slot.
MAX_SLOTS = 64
#: `generate(compile=...)`: "auto" (the plan's compile where it has one, else `compile_pays`), True, False.
COMPILE = ("auto", True, False)
#: `generate()`'s and `hwrun generate`'s default new tokens per prompt (`hwrun plan`'s rows assume it).
DEFAULT_NEW_TOKENS = 50


@dataclass(frozen=True)
class DecodeDecision:
    """How a run decodes and why: `batching` ("static" | "continuous"), `decode` ("generate": Transformers' loop,
    "graphs": hwrun's), `runner` (one of `RUNNERS`), `compile_backend` for hwrun's step (None: not compiled), and
    what hwrun's loops are built with (`engine_options`): `step` ("auto": the fused Llama-family step where it
    applies, else the model's own forward; "model": the model's own forward), `use_graphs` (None: captured where this
    torch's graph tools capture; False: eager steps), `slots` and the engine's row `buckets` (None: every power of
    two up to `slots`), each with its reason."""

    batching: str
    batching_reason: str
    decode: str
    reason: str
    compile_backend: Any = None
    step: str = "auto"
    step_reason: str = ""
    use_graphs: bool | None = None
    graphs_reason: str = ""
    slots: int | None = None
    buckets: tuple[int, ...] | None = None
    buckets_reason: str = ""
    compile_reason: str = ""

    def engine_options(self) -> dict[str, Any]:
        """The keywords hwrun's engine (`EngineCore`) is built with for this decision, by `generate()` and serve."""
        return {"slots": self.slots, "step": self.step, "use_graphs": self.use_graphs,
                "compile_backend": self.compile_backend, "buckets": self.buckets}

    @property
    def runner(self) -> str:
        """The loop that runs: "engine" (hwrun's slot engine), "static_graphs" (hwrun's static-cache decoder),
        "generate" (`model.generate`) or "generate_batch" (Transformers' continuous batching)."""
        if self.decode == "graphs":
            return "engine" if self.batching == "continuous" else "static_graphs"
        return "generate_batch" if self.batching == "continuous" else "generate"

    @property
    def engine(self) -> str:
        """The serving engine's name for this decision: "slots" (hwrun's engine) or "transformers"."""
        return "slots" if self.decode == "graphs" else "transformers"


def graph_api_of(plan: RunPlan) -> tuple[str, str] | None:
    """(label, graph name) of the plan's platform graph API when hwrun's loops capture with it, else None."""
    return GRAPH_DECODE_APIS.get(plan.accelerator.platform.graph_api)


def _plan_blockers(plan: RunPlan) -> list[str]:
    """What keeps hwrun's loops from running the plan at all (before load)."""
    blockers = []
    if plan.quantization:  # which method, and why (hwrun.model.quantization.decode_blocker)
        from ..model.quantization import decode_blocker

        blocker = decode_blocker(plan.quantization)
        if blocker is not None:
            blockers.append(blocker)
    if plan.device_map == "auto":
        blockers.append("the model is split across devices")
    return blockers


def _loop_name(batching: str, graph: str) -> str:
    if batching == "continuous":
        return (f"hwrun.inference.engine: continuous batching over cache slots, one {graph} replay per step "
                "(the fused Llama-family step where it applies, else the model's own forward)")
    return f"static cache + {graph} replay per token (hwrun.inference.decode.static)"


#: `_decode_case` answers: which branch of the rule applies (the mode each gives is in `_GRAPH_CASES`).
_GRAPH_CASES = frozenset({"given_graphs", "given_graphs_eager", "given_graphs_lazy", "auto_graphs"})


def _decode_case(plan: RunPlan, requested: str) -> str:
    """Which branch of the module docstring's rule `requested` takes on `plan`, without logging or raising: the one
    rule behind `_decode_mode` (which words it) and `_runs_hwrun_loops` (which only needs the loop)."""
    graphs = graph_api_of(plan)
    api = plan.accelerator.platform.graph_api
    if requested == "generate":
        return "given_generate"
    if requested == "graphs":
        if _plan_blockers(plan):
            return "given_graphs_blocked"
        if graphs is None:
            return "given_graphs_eager"
        return "given_graphs" if api in AUTO_GRAPH_APIS else "given_graphs_lazy"
    if graphs is not None and api not in AUTO_GRAPH_APIS:
        return "auto_lazy_graphs"
    if graphs is not None:
        return "auto_blocked" if _plan_blockers(plan) or _auto_eager(plan) else "auto_graphs"
    return "auto_no_graphs"


def _auto_eager(plan: RunPlan) -> str | None:
    """Why `decode="auto"` leaves a plan to Transformers' loop on a platform with graphs although hwrun's loops run
    it: they would step eagerly over its weights (another library's pre-quantized layers), so no graph is gained."""
    eager = _eager_only(plan, None, 0)
    return (f"hwrun's loops would run eager steps over these weights ({eager}), so graphs gain nothing; "
            "decode='graphs' runs them anyway") if eager else None


def _auto_blockers(plan: RunPlan) -> list[str]:
    """What keeps `decode="auto"` off hwrun's loops on a platform with graphs: `_plan_blockers`, else `_auto_eager`."""
    return _plan_blockers(plan) or [why for why in (_auto_eager(plan),) if why]


def _runs_hwrun_loops(plan: RunPlan, requested: str) -> bool:
    """Whether `_decode_mode` picks hwrun's loops for `requested`, so the batching choice can weigh the limits of
    the runner that will batch (hwrun's engine, or Transformers') before the mode is worded."""
    return requested in DECODE and _decode_case(plan, requested) in _GRAPH_CASES


def _decode_mode(plan: RunPlan, requested: str, batching: str,
                 compiled: tuple[Any, str, str] | None = None) -> tuple[str, str]:
    """("generate" | "graphs", reason) for `generate()` before load: the rule of the module docstring, worded;
    `compiled`: the step's compile choice (`_step_compile`), which the reason for `decode="auto"` names."""
    if requested not in DECODE:
        raise GenerateError(f"decode={requested!r} is not a decode mode; use one of {', '.join(DECODE)}.")
    graphs = graph_api_of(plan)
    label, graph = graphs if graphs is not None else ("", "graph")
    loop = _loop_name(batching, graph)
    theirs = "model.generate_batch" if batching == "continuous" else "model.generate"
    api = plan.accelerator.platform.graph_api
    case = _decode_case(plan, requested)
    if case == "given_generate":
        return "generate", f"given: {theirs}"
    if case == "given_graphs_blocked":
        raise GenerateError(f"decode='graphs' cannot run: {'; '.join(_plan_blockers(plan))}. "
                            "Use decode='generate'.")
    if case == "given_graphs_eager":
        kind = plan.accelerator.kind
        name = "hwrun's engine (inference/engine/)" if batching == "continuous" else "the static-cache step loop"
        logger.warning("decode='graphs' on %s: no CUDA, XPU or HPU graphs there (graph API: %s), %s runs eagerly",
                       kind, api, name)
        return "graphs", f"given; {kind} has no CUDA, XPU or HPU graphs (graph API: {api}), so {name} runs eagerly"
    if case == "given_graphs_lazy":
        compiled = ", compiled with the plan's backend" if plan.compile is not None else ""
        return "graphs", (f"given: {loop} where the bridge runs lazy (hpu_graphs); in eager mode it records no "
                          f"HPU graphs and the step runs eagerly{compiled}")
    if case == "given_graphs":
        return "graphs", f"given: {loop}"
    if case == "auto_lazy_graphs":
        return "generate", (f"{theirs} (graph decode needs CUDA or XPU graphs and compile=True for decode='auto'; "
                            f"{label}'s HPU graphs record in lazy mode only, where compile is off: pass decode='graphs')")
    if case == "auto_graphs":
        backend, why = (plan.compile, "") if compiled is None else compiled[:2]
        if backend is not None:
            how = "compile on" if plan.compile is not None else f"compile on: {why}"
        else:
            how = ("compile off: the eager step captured as one graph, nothing to compile first; compile=True fuses "
                   "its small kernels with torch.compile for a faster step after a longer start"
                   f"{f'; {why}' if why else ''}")
        return "graphs", f"{label} ({how}): {loop}, no host work per token"
    if case == "auto_blocked":
        blockers = "; ".join(_auto_blockers(plan))
        logger.info("graph decode not used: %s; falling back to %s", blockers, theirs)
        return "generate", f"{theirs} ({blockers})"
    return "generate", (f"{theirs} ({plan.accelerator.kind} has no CUDA or XPU graphs for hwrun's loops: graph API "
                        f"{api})")


#: Why `generate()` on a tensor-parallel plan runs hwrun's engine on every rank.
TP_GENERATE_REASON = ("tensor parallel (tp={tp}): every rank runs hwrun's engine (EngineCore.generate) on the same "
                      "prompts, {how}, the model's own forward over the slot cache (the fused step reads whole "
                      "weights); its scheduler is deterministic, so every rank admits, prefills and steps the same rows "
                      "in the same order (hwrun.parallel.generate: the arguments and the sampling seed agreed first, "
                      "the tokens compared at the end)")


def _tp_planned(plan: RunPlan, n_prompts: int, decode: str, batching: str, stream: bool,
                compile: Any = "auto") -> DecodeDecision:
    """`planned()` on a tensor-parallel plan: hwrun's engine on every rank (as `hwrun serve --tp` runs it), or
    Transformers' `model.generate` on one static batch where `decode="generate"` or `batching="static"` is asked.
    `stream` never changes the choice (rank 0 alone streams), it is refused where the engine runs."""
    tp = plan.tp
    if decode not in DECODE:
        raise GenerateError(f"decode={decode!r} is not a decode mode; use one of {', '.join(DECODE)}.")
    if batching not in BATCHING:
        raise GenerateError(f"batching={batching!r} is not a batching mode; use one of {', '.join(BATCHING)}.")
    if decode == "graphs" and batching == "static":
        raise GenerateError(f"decode='graphs' with batching='static' on tp={tp}: hwrun's static graph decoder has not "
                            "run on tensor-parallel shards. Leave batching out (hwrun's engine runs every rank) or "
                            "use decode='generate'.")
    if decode == "generate" and batching == "continuous":
        raise GenerateError(f"batching='continuous' with decode='generate' on tp={tp}: Transformers' generate_batch "
                            "schedules in a thread of its own on each rank, so the ranks' steps would not pair up. "
                            "Leave decode out (hwrun's engine batches continuously on every rank) or use "
                            "batching='static'.")
    if decode == "generate" or batching == "static":
        given = "decode='generate'" if decode == "generate" else "batching='static'"
        return DecodeDecision("static", f"given ({given}): one left-padded batch, the same on every rank", "generate",
                              f"given: model.generate on every rank (tensor parallel, tp={tp})")
    if stream:
        raise GenerateError(f"stream=True (or a streamer) on tp={tp}: hwrun's engine, which every rank runs, returns "
                            "the tokens at the end. Leave stream out, or pass decode='generate' (Transformers' loop, "
                            "which streams).")
    graphs = graph_api_of(plan)
    how = (f"one {graphs[1]} replay per step, captured per rank" if graphs is not None else
           f"eager steps ({plan.accelerator.kind} has no CUDA, XPU or HPU graphs)")
    return DecodeDecision("continuous", f"tensor parallel (tp={tp}): {n_prompts} prompt(s) through hwrun's engine over "
                          "cache slots on every rank", "graphs", TP_GENERATE_REASON.format(tp=tp, how=how),
                          _tp_compile(plan, compile))


def _tp_decide(plan: RunPlan, model: Any, before: DecodeDecision, decode: str, needed: int) -> DecodeDecision:
    """`decide()` on a tensor-parallel plan: `before` (from `_tp_planned`) checked against the model's own step
    (`slot_step_support`, as `decide_serving` asks it); where the engine cannot run the model, Transformers' loop on
    `decode="auto"` (logged) and a `GenerateError` on `decode="graphs"`."""
    if before.runner != "engine":
        return before
    from .engine.steps import slot_step_support

    step, why = slot_step_support(model, "model", -(-needed // CACHE_BUCKET) * CACHE_BUCKET)
    if step is not None:
        return replace(before, reason=f"{before.reason}; step: {why}")
    name = type(model).__name__
    if decode == "graphs":
        raise GenerateError(f"decode='graphs' on tp={plan.tp}: hwrun's engine cannot run {name}: {why}. Use "
                            "decode='generate'.")
    logger.info("tensor parallel: hwrun's engine cannot run %s (%s); every rank runs model.generate", name, why)
    return DecodeDecision("static", f"tensor parallel (tp={plan.tp}), but hwrun's engine cannot run {name}: one "
                          "left-padded batch, the same on every rank", "generate",
                          f"model.generate on every rank (hwrun's engine cannot run {name}: {why})")


def planned(plan: RunPlan, n_prompts: int, *, decode: str = "auto", batching: str = "auto",
            stream: bool = False, compile: Any = "auto",
            max_new_tokens: int = DEFAULT_NEW_TOKENS) -> DecodeDecision:
    """The decision `generate()` will take for `n_prompts` prompts of `max_new_tokens` each, as far as it is known
    before load (`hwrun plan` shows it; `decide()` then checks it against the loaded model)."""
    _check_compile(compile)
    if getattr(plan, "tp", 1) > 1:
        decision = _tp_planned(plan, n_prompts, decode, batching, stream, compile)
    elif (engine := _eager_engine_instead(plan, decode, batching, stream)) is not None:
        decision = engine
    else:
        choice = choose_batching(plan, n_prompts, batching, stream=stream, engine=_runs_hwrun_loops(plan, decode))
        compiled = _compile_for(plan, decode, choice.mode, n_prompts, max_new_tokens, compile)
        mode, reason = _decode_mode(plan, decode, choice.mode, compiled)
        backend, compile_reason = compiled[:2] if mode == "graphs" and compiled else (None, "")
        decision = DecodeDecision(choice.mode, choice.reason, mode, reason, backend, compile_reason=compile_reason)
    decision = _engine_setup(plan, decision, min(n_prompts, MAX_SLOTS))
    if compile is True and decision.decode != "graphs":
        logger.info("compile=True not used: %s decodes (hwrun compiles only its own loops' step)", decision.reason)
    if decision.compile_backend is not None:
        from hwcompile.cache import cache_switch

        cache_switch()  # a bad HWSTACK_COMPILE_CACHE is refused here, before load, not at the first compile
    return decision


def _eager_engine_instead(plan: RunPlan, decode: str, batching: str, stream: bool) -> DecodeDecision | None:
    """`batching="continuous"` asked with `decode="auto"` on a platform without graphs (CPU, MPS), or with graphs
    where hwrun's loops would step eagerly over the plan's weights (pre-quantized layers), where Transformers'
    `generate_batch` cannot run the plan (quantized weights) but hwrun's engine can: the engine with eager steps, as
    `hwrun serve --engine auto` picks there. None where the usual rule applies."""
    if batching != "continuous" or decode != "auto" or stream:
        return None
    case = _decode_case(plan, decode)
    if case not in ("auto_no_graphs", "auto_blocked"):
        return None
    theirs = continuous_plan_blockers(plan)
    if not theirs or _plan_blockers(plan) or engine_plan_blockers(plan):
        return None
    eager = _eager_only(plan, None, 0)
    why = f"eager over these weights: {eager}" if case == "auto_blocked" else \
        f"{plan.accelerator.kind} has no CUDA, XPU or HPU graphs"
    logger.info("batching='continuous': Transformers' generate_batch cannot run here (%s); hwrun's engine runs it "
                "with eager steps", "; ".join(theirs))
    return DecodeDecision("continuous", "given: hwrun's engine (continuous batching over cache slots)", "graphs",
                          f"hwrun's engine, eager steps ({why}): Transformers' generate_batch cannot run here "
                          f"({'; '.join(theirs)})")


def _compile_for(plan: RunPlan, decode: str, batching: str, n_prompts: int, max_new_tokens: int,
                 compile: Any) -> tuple[Any, str, str] | None:
    """`_step_compile` for a run whose `decode` reaches hwrun's loops (None otherwise): the expected tokens are every
    prompt's `max_new_tokens`, the batch the engine's rows (continuous) or the prompts (one static batch)."""
    if not _runs_hwrun_loops(plan, decode):
        return None
    batch = min(n_prompts, MAX_SLOTS) if batching == "continuous" else n_prompts
    return _step_compile(plan, compile, n_prompts * max_new_tokens, batch)


def decide(plan: RunPlan, model: Any, *, n_prompts: int, needed: int, decode: str = "auto",
           batching: str = "auto", stream: bool = False, before: DecodeDecision | None = None,
           compile: Any = "auto", max_new_tokens: int = DEFAULT_NEW_TOKENS) -> DecodeDecision:
    """How `generate()` decodes `n_prompts` prompts whose longest needs `needed` cache positions (prompt + new
    tokens) with the loaded `model`: the plan's decision (`before`, from `planned()` with the same arguments before
    load; computed here when None) checked against the model's class, its attention and its family's step.
    Raises `GenerateError` where an explicit `decode`/`batching` cannot run."""
    if before is None:
        before = planned(plan, n_prompts, decode=decode, batching=batching, stream=stream, compile=compile,
                         max_new_tokens=max_new_tokens)
    slots = min(n_prompts, MAX_SLOTS)
    if getattr(plan, "tp", 1) > 1:
        decision = _engine_setup(plan, _tp_decide(plan, model, before, decode, needed), slots, model)
        logger.info("batching: %s (%s); decode: %s (%s)", decision.batching, decision.batching_reason,
                    decision.decode, decision.reason)
        return decision
    choice = BatchingChoice(before.batching, before.batching_reason)
    # the model class may not run Transformers' continuous batching (hwrun's engine is checked in _fit_graph_decode)
    checked = choice if before.decode == "graphs" else model_batching(choice, batching, model)
    mode, reason = ((before.decode, before.reason) if checked.mode == choice.mode else _decode_mode(
        plan, decode, checked.mode, _compile_for(plan, decode, checked.mode, n_prompts, max_new_tokens, compile)))
    if mode == "graphs":
        checked, mode, reason = _fit_graph_decode(plan, model, checked, decode, batching, reason, needed, n_prompts)
    backend, compile_reason = None, ""
    if mode == "graphs":  # the batch the compile choice weighs is the one that runs (checked may be static now)
        compiled = _compile_for(plan, decode, checked.mode, n_prompts, max_new_tokens, compile)
        backend, compile_reason, note = compiled or _step_compile(plan, compile, n_prompts * max_new_tokens, 1)
        if note:
            logger.info("graph decode: %s", note)
            reason = f"{reason}; {note}"
    decision = _engine_setup(plan, DecodeDecision(checked.mode, checked.reason, mode, reason, backend,
                                                  compile_reason=compile_reason), slots, model)
    logger.info("batching: %s (%s); decode: %s (%s)%s", decision.batching, decision.batching_reason, decision.decode,
                decision.reason, f"; compile: {decision.compile_reason}" if decision.compile_reason else "")
    return decision


def static_instead(plan: RunPlan, decision: DecodeDecision, why: str, decode: str = "auto") -> DecodeDecision:
    """`decision` turned into one static batch after Transformers' continuous batching failed at run time (`why`:
    the model's own code, not the request, so a static batch still runs it); logged."""
    logger.warning("%s; running one static batch instead", why)
    head = decision.batching_reason.split(":")[0]
    mode, reason = _decode_mode(plan, decode, "static")
    static = replace(decision, batching="static", batching_reason=f"{head}, but Transformers' {why}: one "
                     "left-padded batch", decode=mode, reason=reason)
    return _engine_setup(plan, static, None)


def _fit_graph_decode(plan: RunPlan, model: Any, choice: BatchingChoice, decode: str, batching: str, reason: str,
                      needed: int, n_prompts: int) -> tuple[BatchingChoice, str, str]:
    """(batching, decode mode, reason) for graph decode, checked against the loaded model.

    Both graph loops run any family the model's own forward can decode for them: the fused Llama-family step
    where it applies (an optimisation, not a gate), else the model's own forward. A model hwrun's engine cannot
    run (its attention is not sdpa or eager, a class that computes attention itself, an encoder-decoder) gets the
    static graph decoder on `decode="graphs"` with `batching="auto"`, otherwise Transformers' `generate_batch`.
    Attention the loops cannot reproduce (a sliding window shorter than the cache) falls back to Transformers'
    loop on `decode="auto"` and raises on `decode="graphs"`."""
    from .decode.fused_step import fused_step_support
    from .engine.steps import attention_blocker, slot_step_support

    blocker = attention_blocker(model, -(-needed // CACHE_BUCKET) * CACHE_BUCKET)
    if blocker is not None:
        if decode == "graphs":
            raise GenerateError(f"decode='graphs' cannot run {type(model).__name__}: it {blocker}. "
                                "Use decode='generate'.")
        return _transformers_loop(plan, model, choice, batching, n_prompts, f"{type(model).__name__} {blocker}")
    unsupported = fused_step_support(model)
    if unsupported is None:
        return choice, "graphs", f"{reason}; step: the fused Llama-family step (q/k/v and gate/up as one matrix each)"
    own = f"step: the model's own forward over a StaticCache (the fused step does not apply: {unsupported})"
    if choice.mode != "continuous":
        return choice, "graphs", f"{reason}; {own}"
    step, why = slot_step_support(model, max_cache_len=needed)
    if step is not None:
        return choice, "graphs", f"{reason}; step: {why}"
    engine_cannot = f"hwrun's engine cannot run it: {why}"
    if decode == "graphs" and batching == "auto":
        logger.info("%s; the static graph decoder runs the %d prompts", engine_cannot, n_prompts)
        static = BatchingChoice("static", f"{n_prompts} prompts and decode='graphs', but {engine_cannot}: the static "
                                "graph decoder, prompts of one length batched together, others one by one")
        return static, "graphs", f"given: static cache + graph replay per token (hwrun.inference.decode.static); {own}"
    return _transformers_loop(plan, model, choice, batching, n_prompts, engine_cannot)


def _transformers_loop(plan: RunPlan, model: Any, choice: BatchingChoice, batching: str, n_prompts: int,
                       why: str) -> tuple[BatchingChoice, str, str]:
    """(batching, "generate", reason) when hwrun's loops cannot run `model` (`why`): Transformers' loop for the
    same batching where it runs the model; a continuous batch Transformers' `generate_batch` cannot run either
    (its device, quantized weights, the model's class) becomes one static batch, or an error when it was asked for."""
    if choice.mode != "continuous":
        logger.info("graph decode not used: %s; falling back to model.generate", why)
        return choice, "generate", f"model.generate ({why})"
    theirs_cannot = transformers_blockers(plan, model)
    if not theirs_cannot:
        logger.info("continuous graph decode not used: %s; falling back to model.generate_batch", why)
        return choice, "generate", f"model.generate_batch ({why})"
    if batching == "continuous":
        raise GenerateError(f"batching='continuous' cannot run {type(model).__name__}: {why}, and Transformers' "
                            f"generate_batch neither ({'; '.join(theirs_cannot)}). Use batching='static'.")
    logger.info("%s, and generate_batch neither (%s); one static batch", why, "; ".join(theirs_cannot))
    static = BatchingChoice("static", f"{n_prompts} prompts, but {why}, and Transformers' generate_batch neither "
                            f"({'; '.join(theirs_cannot)}): one left-padded batch")
    return static, "generate", f"model.generate ({why})"


def graph_compile_backend(plan: RunPlan) -> tuple[Any, str]:
    """(backend, note): what hwrun's loops compile their step with. The plan's backend, except where the platform
    runs a lazy mode that refuses torch.compile (Gaudi lazy, G2: hwcompile decides), where the step is not compiled
    (HPU graphs capture it) and the note says why."""
    if plan.compile is None:
        return None, ""
    note = _lazy_mode_note(plan)
    return (None, note) if note else (plan.compile.backend, "")


def _lazy_mode_note(plan: RunPlan) -> str:
    """Why the step cannot be compiled on the plan's platform right now (a lazy mode that refuses torch.compile:
    Gaudi lazy, G2, hwcompile decides), or "" where it can."""
    platform = plan.accelerator.platform
    if platform.lazy_mode_variable is None:
        return ""
    import hwcompile

    try:
        hwcompile.check_compile_mode(platform)
    except hwcompile.LazyModeError:
        return (f"the step is not compiled: {platform.display_name} runs in lazy mode, where torch.compile "
                f"is refused (G2; {platform.lazy_mode_variable}=0 for eager mode)")
    return ""


# ---- whether compiling the step pays (compile="auto"): inference/compile_costs.py --------------------------


def _check_compile(compile: Any) -> None:
    """Refuse a `compile` that is not "auto", True or False (0.0 compares equal to False and must not pass as one)."""
    if not (isinstance(compile, bool) or (isinstance(compile, str) and compile == "auto")):
        raise GenerateError(f"compile={compile!r} is not a compile choice; use 'auto' (compile where the measured "
                            "costs say it pays), True or False.")


def _tp_compile(plan: RunPlan, compile: Any) -> Any:
    """The step's backend on tensor-parallel ranks: none on compile=False, the platform's default on compile=True
    without a plan compile (lazy mode checked), else the plan's (no measured costs weigh "auto" across ranks)."""
    if compile is False:
        return None
    if compile is True and plan.compile is None:
        backend, _, note = _step_compile(plan, True, 0, 1)
        if note:
            logger.info("tensor parallel: %s", note)
        return backend
    return graph_compile_backend(plan)[0]


def _step_compile(plan: RunPlan, compile: Any, tokens: int, batch: int) -> tuple[Any, str, str]:
    """(backend or None, reason, lazy-mode note) for hwrun's graph step: `compile` (one of `COMPILE`) against the
    plan's compile and, for "auto" without one, `compile_pays` (logged)."""
    _check_compile(compile)
    if compile is False:
        if plan.compile is not None:
            logger.info("compile=False: the plan's %s backend is not used for the decode step", plan.compile.backend)
        return None, "given: compile=False" + (" (the plan's backend not used)" if plan.compile is not None else ""), ""
    if plan.compile is not None:
        backend, note = graph_compile_backend(plan)
        return backend, f"{'given' if compile is True else 'the plan compiles'} ({backend or 'not compiled'})", note
    import hwcompile

    default = hwcompile.route_backend(plan.accelerator, None).backend
    lazy = _lazy_mode_note(plan)
    if lazy:  # compile=True or "auto" alike: torch.compile is refused in this mode (the note is logged)
        return None, f"{'given: compile=True' if compile is True else 'compile=auto'}, but not compiled (lazy mode)", lazy
    if compile is True:
        return default, f"given: compile=True ({default})", ""
    pays, why = compile_pays(plan, tokens, batch)
    logger.debug("compile='auto': %s", why)  # planned() and decide() both weigh it; decide() logs the outcome once
    return (default if pays else None), why, ""


# ---- what hwrun's loops are built with -------------------------------------------------------------------


def compile_cache(decision: DecodeDecision) -> Any:
    """Where `decision` compiles hwrun's step, point torch's compile caches at hwcompile's persistent folder first
    (idempotent; `HWSTACK_COMPILE_CACHE=0` opts out) and log which; the `PersistentCache`, or None (no compile).
    `generate()` and `hwrun serve` call it before they build the decoder the decision names."""
    if decision.compile_backend is None or decision.decode != "graphs":
        return None
    from hwcompile.cache import enable_persistent_cache

    cache = enable_persistent_cache()
    logger.info("compile cache: %s", cache.reason)
    return cache


def _eager_only(plan: RunPlan, model: Any, adapters: int) -> str | None:
    """Why hwrun's loops must run the model's own forward eagerly (per-request LoRA adapters, bitsandbytes 4-bit
    weights, another library's pre-quantized layers: of the loaded model, else of the plan's quantization), or None."""
    if adapters:
        from .engine.adapters import EAGER_REASON

        return f"{adapters} LoRA adapter(s) per request: {EAGER_REASON}"
    from .engine.quantized import BNB_EAGER_REASON, eager_reason

    if _bnb_bits(plan, model) == 4:
        return BNB_EAGER_REASON
    return eager_reason(model) if model is not None else eager_reason(quantization=plan.quantization or None)


def _bnb_bits(plan: RunPlan, model: Any) -> int | None:
    """4 or 8 for bitsandbytes weights: the loaded model's layers, or before load the plan's quantization method."""
    if model is not None:
        from .engine.quantized import bnb_bits

        return bnb_bits(model)
    if not plan.quantization:
        return None
    from ..model.quantization_table import METHODS, method_name

    name = method_name(plan.quantization)
    method = METHODS.get(name)
    if method is None or method.library != "bitsandbytes":
        return None
    return 8 if "8" in name else 4


def _engine_setup(plan: RunPlan, decision: DecodeDecision, slots: int | None, model: Any = None,
                  adapters: int = 0) -> DecodeDecision:
    """`decision` with the step, graph capture and row buckets hwrun's loops are built with, and why: the one rule
    `generate()` and `hwrun serve` both read (`DecodeDecision.engine_options`), never worked out again by a caller."""
    if decision.decode != "graphs":
        return replace(decision, step="model", step_reason="Transformers' loop runs the model's own forward",
                       use_graphs=False, graphs_reason="Transformers' loop: hwrun captures no graph", slots=None,
                       buckets=None, buckets_reason="")
    tp = getattr(plan, "tp", 1)
    eager = _eager_only(plan, model, adapters)
    if eager is not None:
        step, step_reason = "model", eager
    elif tp > 1:
        step, step_reason = "model", (f"tensor parallel (tp={tp}): the model's own forward over its shards (the fused "
                                      "step reads whole weights)")
    else:
        step, step_reason = "auto", "the fused Llama-family step where it applies, else the model's own forward"
    graphs = graph_api_of(plan)
    if eager is not None:
        use_graphs, graphs_reason = False, f"eager steps: {eager}"
        if "replay" in decision.reason:  # the rule worded the platform's graphs; these weights step eagerly
            decision = replace(decision, reason=f"{decision.reason}; but no graph is captured: eager steps ({eager})")
        if decision.compile_backend is not None:  # the engine refuses a compile over these weights (plan_quantized)
            logger.info("the step is not compiled: %s", eager)
            decision = replace(decision, compile_backend=None, compile_reason=f"not compiled: {eager}")
    elif graphs is None:
        use_graphs, graphs_reason = False, (f"eager steps: {plan.accelerator.kind} has no CUDA, XPU or HPU graphs "
                                            f"(graph API: {plan.accelerator.platform.graph_api})")
    else:
        use_graphs, graphs_reason = None, (f"each step captured as one {graphs[1]} where this torch's graph tools "
                                           "capture (no tools there, e.g. Gaudi in eager mode: eager steps, logged)")
    buckets, buckets_reason = None, ""
    if decision.runner == "engine" and slots is not None:
        from .engine.buckets import bucket_sizes, compiled_buckets

        buckets = compiled_buckets(slots, decision.compile_backend is not None)
        rows = ", ".join(map(str, bucket_sizes(slots, buckets)))
        buckets_reason = (f"steps over {rows} of {slots} rows: each bucket is compiled once at start, so only one "
                          "stream, light load and full load (a draining batch would compile mid-run otherwise)"
                          if buckets is not None else
                          f"steps over {rows} of {slots} rows: every power of two, one graph each (not compiled)")
    return replace(decision, step=step, step_reason=step_reason, use_graphs=use_graphs, graphs_reason=graphs_reason,
                   slots=slots if decision.runner == "engine" else None, buckets=buckets,
                   buckets_reason=buckets_reason)


# ---- serving --------------------------------------------------------------------------------------------


def engine_blockers(plan: RunPlan, model: Any) -> list[str]:
    """Why hwrun's engine cannot serve `model` on the plan (empty when it can)."""
    from .engine.steps import slot_step_support

    return _engine_blockers(plan, slot_step_support(model))


def _engine_blockers(plan: RunPlan, support: tuple[str | None, str]) -> list[str]:
    """`engine_blockers` for the model's `slot_step_support` answer (step, why), asked once by the caller."""
    blockers = _plan_blockers(plan)
    step, why = support
    if step is None:
        blockers.append(f"neither of its steps runs it: {why}")
    return blockers


def transformers_blockers(plan: RunPlan, model: Any) -> list[str]:
    """Why Transformers' continuous batching cannot serve `model` on the plan's device (empty when it can)."""
    blockers = continuous_plan_blockers(plan)
    blocker = continuous_model_blocker(model)
    if blocker is not None:
        blockers.append(blocker)
    return blockers


#: Why a tensor-parallel server runs hwrun's engine.
TP_ENGINE_REASON = ("tensor parallel (tp={tp}): rank 0 schedules and every rank runs hwrun's slot engine step by step "
                    "in lockstep (hwrun.parallel.lockstep), the model's own forward over the slot cache (the fused "
                    "step reads whole weights); Transformers' batching manager schedules in a thread of its own on "
                    "each rank")


#: What a support callable answers before load, where the model's steps are not known yet.
AFTER_LOAD = "checked against the model after load"


def _bnb_serving(plan: RunPlan, engine: str, bits: int, batching: str, support: Any,
                 theirs: list[str]) -> DecodeDecision:
    """The serving rule for bitsandbytes weights: 4-bit on hwrun's engine, eager model steps; 8-bit refused."""
    from .engine.quantized import BNB_8BIT_REASON, BNB_EAGER_REASON

    theirs_text = "; ".join(theirs)
    if bits == 8:
        raise EngineStartError(f"no engine can serve this model: hwrun's engine: {BNB_8BIT_REASON}; Transformers' "
                               f"continuous batching: {theirs_text}. Serve 4-bit weights (--quantization 4bit), or use "
                               "`hwrun generate`.")
    if engine == "transformers":
        raise EngineStartError(f"--engine transformers cannot serve this model here: {theirs_text}. Use --engine "
                               "slots or auto.")
    if plan.compile is not None:
        raise EngineStartError(f"--compile with bitsandbytes 4-bit weights: {BNB_EAGER_REASON}; leave --compile out.")
    step, why = support("model")
    if step is None:
        raise EngineStartError(f"hwrun's engine cannot serve this model: {why}.")
    return DecodeDecision("continuous", batching, "graphs", f"hwrun's engine: {BNB_EAGER_REASON} (Transformers' "
                          f"continuous batching: {theirs_text})", None)


def _serving_rule(plan: RunPlan, engine: str, *, bits: int | None, adapters: int, support: Any,
                  theirs: list[str]) -> DecodeDecision:
    """The rule behind `decide_serving` (the loaded model) and `planned_serving` (before load): `support(step)` is
    the model's `slot_step_support` answer (step or None, why) for step "auto" or "model", `theirs` why
    Transformers' continuous batching cannot run, `bits` the bitsandbytes width of the weights (None: not theirs)."""
    if engine not in ENGINES:
        raise EngineStartError(f"--engine {engine!r} is not an engine; use one of {', '.join(ENGINES)}.")
    batching = "live requests join and leave between steps"
    if bits == 8 or (bits == 4 and not adapters):
        return _bnb_serving(plan, engine, bits, batching, support, theirs)
    if adapters:  # PEFT's mixed-batch forward picks each row's adapter on the host: no graph or compile holds it
        if engine == "transformers":
            raise EngineStartError("--engine transformers with --lora: Transformers' continuous batching runs one "
                                   "model; adapters per request run on hwrun's engine (leave --engine out).")
        if plan.compile is not None:
            raise EngineStartError("--compile with --lora: adapters per request run eager model steps (PEFT groups "
                                   "rows by adapter on the host, which no graph or compiled step holds); leave "
                                   "--compile out, or merge the adapter into the model and serve that.")
        step, why = support("model")
        if step is None:
            raise EngineStartError(f"--lora: hwrun's engine cannot serve this model: {why}.")
        return DecodeDecision("continuous", batching, "graphs", f"{adapters} LoRA adapter(s) per request: hwrun's "
                              "engine, the model's own forward with PEFT's mixed-batch adapter_names, eager steps "
                              "(PEFT groups rows by adapter on the host: no graph can hold that)", None)
    tp = getattr(plan, "tp", 1)
    if tp > 1:  # every rank runs hwrun's engine in lockstep (hwrun.parallel.lockstep), the model's own forward
        if engine == "transformers":
            raise EngineStartError(f"--engine transformers with --tp {tp}: tensor-parallel ranks run hwrun's slot "
                                   "engine in lockstep; leave --engine out or pass --engine slots.")
        step, why = support("model")
        if step is None:
            raise EngineStartError(f"--tp {tp}: hwrun's engine cannot serve this model: {why}.")
        return DecodeDecision("continuous", batching, "graphs", TP_ENGINE_REASON.format(tp=tp),
                              graph_compile_backend(plan)[0])
    step, why = support_answer = support("auto")
    step_note = f"; step: {why}" if step is not None else ""
    ours = _engine_blockers(plan, support_answer)
    graphs = graph_api_of(plan)
    kind = plan.accelerator.kind
    backend = graph_compile_backend(plan)[0]

    def slots(reason: str) -> DecodeDecision:
        return DecodeDecision("continuous", batching, "graphs", reason, backend)

    def transformers(reason: str) -> DecodeDecision:
        return DecodeDecision("continuous", batching, "generate", reason)

    if engine == "slots":
        if ours:
            raise EngineStartError(f"--engine slots cannot serve this model here: {'; '.join(ours)}. "
                                   "Use --engine transformers or auto.")
        how = f"one {graphs[1]} replay per step" if graphs else f"eager steps ({kind} has no CUDA or XPU graphs)"
        return slots(f"given: hwrun's engine over cache slots, {how}{step_note}")
    if engine == "transformers":
        if theirs:
            raise EngineStartError(f"--engine transformers cannot serve this model here: {'; '.join(theirs)}. "
                                   "Use --engine slots or auto.")
        return transformers("given: Transformers' continuous batching (init_continuous_batching)")
    if graphs is not None and not ours:
        return slots(f"{graphs[0]}: hwrun's engine, one {graphs[1]} replay per step over cache slots "
                     f"(requests join and leave between steps){step_note}")
    if not theirs:
        why = (f"hwrun's engine cannot: {'; '.join(ours)}" if ours else
               f"{kind} has no CUDA or XPU graphs for hwrun's engine (graph API "
               f"{plan.accelerator.platform.graph_api})")
        return transformers(f"Transformers' continuous batching (paged cache); {why}")
    if not ours:
        return slots(f"hwrun's engine, eager steps: Transformers' continuous batching cannot run here "
                     f"({'; '.join(theirs)}){step_note}")
    raise EngineStartError(f"no engine can serve this model on {kind}: hwrun's engine: {'; '.join(ours)}; "
                           f"Transformers' continuous batching: {'; '.join(theirs)}. Use `hwrun generate` instead.")


def decide_serving(plan: RunPlan, model: Any, engine: str = "auto", *, adapters: int = 0,
                   max_cache_len: int | None = None, slots: int | None = None) -> DecodeDecision:
    """How `hwrun serve` decodes live requests with `model`: hwrun's engine or Transformers' continuous batching
    (`engine`: one of `ENGINES`), and why; `EngineStartError` when the one asked for (or every one) cannot run.
    `adapters`: how many LoRA adapters `--lora` serves per request (hwrun's engine only, eager model steps);
    `max_cache_len`: the context served (its RoPE and sliding window are asked of the engine's steps now, not
    found when the engine is built); `slots`: the engine's rows (`--max-concurrency`), for its row buckets."""
    from .engine.steps import slot_step_support

    def support(step: str) -> tuple[str | None, str]:
        return slot_step_support(model, step, max_cache_len)

    decision = _serving_rule(plan, engine, bits=_bnb_bits(plan, model), adapters=adapters, support=support,
                             theirs=transformers_blockers(plan, model))
    return _engine_setup(plan, _serving_compile(plan, decision), slots, model, adapters)


def _serving_compile(plan: RunPlan, decision: DecodeDecision) -> DecodeDecision:
    """`decision` with why a server's step is compiled or not: only where --compile is given (compile='auto''s
    break-even weighs a run's tokens, which a server does not know before it runs)."""
    if decision.decode != "graphs":
        return decision
    if decision.compile_backend is not None:
        why = f"given: --compile ({decision.compile_backend})"
    elif plan.compile is not None:
        why = f"--compile given, but the step is not compiled: {graph_compile_backend(plan)[1] or decision.reason}"
    else:
        why = ("off: a server compiles its step where --compile is given (compile='auto' weighs a run's tokens "
               "against the compile's cost; a server's tokens are not known before it runs)")
    return replace(decision, compile_reason=why)


def planned_serving(plan: RunPlan, engine: str = "auto", *, adapters: int = 0,
                    slots: int | None = None) -> DecodeDecision:
    """The decision `hwrun serve` takes on `plan`, as far as it is known before load (`decide_serving`'s rule with
    the model's steps assumed to run it: `hwrun plan` shows it; the loaded model is checked at start)."""
    decision = _serving_rule(plan, engine, bits=_bnb_bits(plan, None), adapters=adapters,
                             support=lambda step: (step, AFTER_LOAD), theirs=continuous_plan_blockers(plan))
    return _engine_setup(plan, _serving_compile(plan, decision), slots, None, adapters)
