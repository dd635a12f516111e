"""Which batching a `generate()` call uses, and why; the `ContinuousBatchingConfig` for continuous batching.

Continuous batching is Transformers' own (`model.generate_batch`, generation/continuous_batching/):
a paged KV cache where finished requests free their pages for waiting ones (X11). Static batching
is `model.generate` over one left-padded batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import devices
from ..errors import GenerateError

if TYPE_CHECKING:
    from ..model.plan import RunPlan

BATCHING = ("auto", "static", "continuous")


@dataclass(frozen=True)
class ContinuousSupport:
    """One kind's row for Transformers' continuous batching (X11).

    `supported`: whether `generate_batch` runs there. `paging`: "accelerator" (Transformers' page
    size, large prefill chunks) or "host" (small pages, graphs and async batching off). `tuning`:
    "hwrun" turns CUDA graphs and async batching on (measured), "transformers" leaves both unset
    so Transformers decides, "off" turns both off. `warmup`: pass `generate_batch(warmup=True)`
    (Transformers captures its graphs before the first batch; cuda and xpu).
    """

    supported: bool
    paging: str = "host"
    tuning: str = "off"
    reason: str = ""
    warmup: bool = False


#: Per kind: does Transformers' continuous batching run there, and how hwrun sizes and tunes it.
#: Its graph support covers cuda and xpu; on CPU it runs eagerly; Gaudi and MPS are not among
#: its supported device types.
CONTINUOUS_BATCHING: dict[str, ContinuousSupport] = {
    "hpu": ContinuousSupport(False, reason="not among Transformers' continuous-batching devices"),
    "xpu": ContinuousSupport(True, "accelerator", "transformers", "Transformers decides graphs on XPU (X11)",
                             warmup=True),
    "rocm": ContinuousSupport(True, "accelerator", "transformers",
                              "torch's cuda device on ROCm; hwrun's CUDA tuning is measured on NVIDIA only",
                              warmup=True),
    "cuda": ContinuousSupport(True, "accelerator", "hwrun",
                              "measured on an H200: 2,461 vs 685 tokens/s at 64 prompts (docs/benchmarks/decode.md)",
                              warmup=True),
    "mps": ContinuousSupport(False, reason="not among Transformers' continuous-batching devices"),
    "cpu": ContinuousSupport(True, "host", "off", "eager on the host"),
}
_NO_ROW = ContinuousSupport(False, reason="hwrun has no continuous-batching row for this kind")
#: Device kinds where Transformers' continuous batching runs.
CONTINUOUS_DEVICES = tuple(kind for kind, row in CONTINUOUS_BATCHING.items() if row.supported)
#: Page size (tokens) hwrun uses for the paged cache off CUDA/XPU, where Transformers' memory-based
#: sizing would reserve most of host RAM.
HOST_PAGE_SIZE = 16
#: Page size on CUDA/XPU (Transformers' default) and the cap on tokens per forward (prefill chunk).
ACCELERATOR_PAGE_SIZE = 256
ACCELERATOR_MAX_BATCH_TOKENS = 8192
HOST_MAX_BATCH_TOKENS = 4096


@dataclass(frozen=True)
class BatchingChoice:
    """`mode` ("static" | "continuous") and the `reason` for it."""

    mode: str
    reason: str


def continuous_plan_blockers(plan: RunPlan) -> list[str]:
    """Why Transformers' continuous batching cannot run on `plan` (device kind, split model, bitsandbytes
    weights), before any model is loaded; empty when it can. The model's class is `continuous_model_blocker`."""
    kind = plan.accelerator.kind
    blockers = []
    if not devices.row(CONTINUOUS_BATCHING, kind, _NO_ROW).supported:
        blockers.append(f"Transformers' continuous batching does not support {kind}")
    if plan.device_map == "auto":
        blockers.append("the model is split across devices (device_map='auto'); the paged cache needs one device")
    if plan.quantization:
        from ..model.quantization_table import METHODS, method_name

        method = METHODS.get(method_name(plan.quantization))
        library = method.library if method else "quantized"
        blockers.append(f"{plan.quantization} {library} weights are not supported by the paged-cache runner")
    return blockers


def engine_plan_blockers(plan: RunPlan) -> list[str]:
    """Why hwrun's engine (continuous batching over its own cache slots) cannot batch on `plan`, before load: only a
    model split across devices. Transformers' limits (`continuous_plan_blockers`: device kinds, quantized weights)
    are its paged-cache runner's, not the engine's; the engine's own (the model's step) are checked after load."""
    if plan.device_map == "auto":
        return ["the model is split across devices (device_map='auto'); hwrun's engine needs one device"]
    return []


def choose_batching(plan: RunPlan, n_prompts: int, requested: str = "auto", *, stream: bool = False,
                    engine: bool = False) -> BatchingChoice:
    """Pick static or continuous batching for `n_prompts` prompts on `plan` (validating `requested`). `engine`: the
    continuous batching would be hwrun's engine (graph decode), not Transformers' `generate_batch`, so only the
    engine's limits apply."""
    if requested not in BATCHING:
        raise GenerateError(f"batching={requested!r} is not a batching mode; use one of {', '.join(BATCHING)}.")
    blockers = engine_plan_blockers(plan) if engine else continuous_plan_blockers(plan)
    runner = "hwrun's engine (continuous batching over cache slots)" if engine else \
        "Transformers' continuous batching (generate_batch, X11)"
    if stream:
        blockers.append("streaming output needs model.generate (generate_batch has no streamer)")
    if requested == "continuous":
        if blockers:
            raise GenerateError(f"batching='continuous' cannot run here: {'; '.join(blockers)}. Use batching='static'.")
        return BatchingChoice("continuous", f"given: {runner}")
    if requested == "static":
        return BatchingChoice("static", "given: one left-padded batch through model.generate")
    if n_prompts == 1:
        return BatchingChoice("static", "one prompt: nothing to schedule, model.generate is the shortest path")
    if blockers:
        return BatchingChoice("static", f"{n_prompts} prompts, but {'; '.join(blockers)}: one left-padded batch")
    freed = "slot" if engine else "KV pages"
    return BatchingChoice(
        "continuous",
        f"{n_prompts} prompts: continuous batching (X11) frees a finished prompt's {freed} for the next one "
        "instead of padding every prompt to the longest",
    )


def continuous_model_blocker(model: Any) -> str | None:
    """Why Transformers' continuous batching cannot run `model`'s class, or None. Its paged cache
    reaches attention only through Transformers' attention interface, which a class declares with
    `is_backend_compatible()` (`_supports_attention_backend`); Falcon, StableLM and Bloom call
    torch's SDPA themselves and fail on the paged cache's mask."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    check = getattr(type(base), "is_backend_compatible", None)
    if check is None or check():
        return None
    return (f"{type(base).__name__} does not route attention through Transformers' attention interface "
            "(is_backend_compatible() is False), which continuous batching's paged cache needs")


def model_batching(choice: BatchingChoice, requested: str, model: Any) -> BatchingChoice:
    """`choice` checked against the loaded model's class: continuous falls back to static on `auto`
    and is a GenerateError when asked for explicitly."""
    if choice.mode != "continuous":
        return choice
    blocker = continuous_model_blocker(model)
    if blocker is None:
        return choice
    if requested == "continuous":
        raise GenerateError(f"batching='continuous' cannot run this model: {blocker}. Use batching='static'.")
    return BatchingChoice("static", f"{choice.reason.split(':')[0]}, but {blocker}: one left-padded batch")


def cb_config(cls: Any, **settings: Any) -> Any:
    """`cls(**settings)` keeping only the fields this Transformers release has (logged when one is dropped).

    `auto_switch_to_flash` is newer than 5.17, for example; older releases never switch anyway.
    """
    import dataclasses
    import inspect
    import logging

    names = ({f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls)
             else set(inspect.signature(cls).parameters))
    dropped = sorted(set(settings) - names)
    if dropped:
        logging.getLogger(__name__).info("ContinuousBatchingConfig here has no %s; left out", ", ".join(dropped))
    return cls(**{k: v for k, v in settings.items() if k in names})


def continuous_warmup(kind: str) -> bool:
    """Whether `generate_batch(warmup=True)` is passed on `kind` (its row's `warmup`)."""
    return devices.row(CONTINUOUS_BATCHING, kind, _NO_ROW).warmup


def continuous_config(plan: RunPlan, prompt_lengths: list[int], max_new_tokens: int) -> Any:
    """A `ContinuousBatchingConfig` for this workload on `plan`'s device (see `workload_cb_config`)."""
    return workload_cb_config(plan.accelerator.kind, prompt_lengths, max_new_tokens)


def workload_cb_config(kind: str, prompt_lengths: list[int], max_new_tokens: int) -> Any:
    """A `ContinuousBatchingConfig` for a platform `kind`, sized from the workload instead of from free memory.

    Transformers' defaults size the paged cache from 90% of free device memory and, for attention
    that needs a mask (sdpa, eager), turn CUDA graphs off. hwrun instead gives the cache pages for
    every prompt plus its new tokens (a few hundred MiB instead of ~100 GiB to allocate), and on
    CUDA turns graphs and asynchronous batching on: with a small cache the padded key length a
    graph needs is small too. On XPU it leaves both to Transformers (X11: it decides there); on the
    host it turns both off.
    `auto_switch_to_flash=False` keeps the attention the plan chose (and never fetches a Hub kernel
    behind the user's back).
    """
    from transformers import ContinuousBatchingConfig

    row = devices.row(CONTINUOUS_BATCHING, kind, _NO_ROW)
    accelerator = row.paging == "accelerator"
    page = ACCELERATOR_PAGE_SIZE if accelerator else HOST_PAGE_SIZE
    longest = max(prompt_lengths) + max_new_tokens
    pages_per_request = math.ceil(longest / page)
    cap = ACCELERATOR_MAX_BATCH_TOKENS if accelerator else HOST_MAX_BATCH_TOKENS
    settings: dict[str, Any] = dict(page_size=page, num_blocks=pages_per_request * len(prompt_lengths) + 4,
                                    max_batch_tokens=min(cap, sum(prompt_lengths) + len(prompt_lengths)),
                                    auto_switch_to_flash=False)
    if row.tuning == "hwrun":  # CUDA: measured (the row's reason)
        settings.update(use_cuda_graph=True, use_async_batching=True)
    elif row.tuning == "off":
        settings.update(max_memory_percent=None, use_cuda_graph=False, use_async_batching=False)
    # "transformers" (XPU, ROCm): Transformers decides about graphs and async batching itself (X11)
    return cb_config(ContinuousBatchingConfig, **settings)
