"""Which of the engine's two steps runs a model (hwrun.inference.engine.step_kinds holds them), and what neither runs.

`slot_step_support` picks the step ("auto": the fused Llama-family step where it applies, an optimisation, else the
model's own forward); `check_decoder_args` and `attention_blocker` refuse what no step of hwrun's runners can run;
`prefill_attention` and `cache_keyword` are what both steps' forwards need.
"""

from __future__ import annotations

from typing import Any

from ...errors import FastDecodeError

#: "fused": the fused Llama-family step (llama/mistral/qwen2); "model": the model's own forward; "auto": fused
#: where it applies, else the model's forward (logged).
STEPS = ("auto", "fused", "model")

FUSED_REASON = "the fused Llama-family step (q/k/v and gate/up as one matrix each, per-row K/V writes)"


def slot_step_support(model: Any, step: str = "auto", max_cache_len: int | None = None) -> tuple[str | None, str]:
    """(step, reason): which step the engine runs `model` with for `step` ("auto", "fused" or "model"):
    "fused" where `fused_step_support` says it applies (an optimisation), else "model", the model's own
    forward over a `SlotCache` with per-row positions and masks; (None, why neither can) otherwise, e.g. a
    RoPE whose frequencies depend on the batch's longest row (`slot_cache.rope_blocker`, for `max_cache_len`)."""
    from ..decode.fused_step import fused_step_support
    from ..decode.slot_cache import model_step_support, rope_blocker

    if step not in STEPS:
        raise FastDecodeError(f"step={step!r} is not a decode step; use one of {', '.join(STEPS)}.")
    rope = rope_blocker(model.config, max_cache_len)
    if rope is not None:
        return None, f"neither slot step runs {type(model).__name__}: {rope}"
    window = None if max_cache_len is None else attention_blocker(model, max_cache_len)
    if window is not None:  # the question check_decoder_args asks at build, asked before it
        return None, f"neither slot step runs {type(model).__name__}: it {window} (the steps attend over every position)"
    unfused = fused_step_support(model) if step != "model" else None
    if step != "model" and unfused is None:
        return "fused", FUSED_REASON
    if step == "fused":
        return None, f"step='fused' cannot run {type(model).__name__}: {unfused}. Use step='model' or 'auto'"
    own = model_step_support(model)
    why = "step='model' given" if step == "model" else f"the fused step does not apply: {unfused}"
    if own is not None:
        return None, f"the model's own forward cannot run here ({own}; {why})"
    return "model", f"the model's own forward over a per-row slot cache ({why})"


def check_decoder_args(model: Any, batch_size: int, max_cache_len: int, use_graphs: bool | None,
                       tools: Any = None, platform: Any = None) -> None:
    """Reject (FastDecodeError) what a static-cache graph decoder cannot run, before anything is built.
    `use_graphs=True` needs graph `tools` (from `decoder_graph_tools`) for a model on `platform`'s device."""
    if max_cache_len <= 1:
        raise FastDecodeError(f"max_cache_len={max_cache_len} must exceed 1 (prompt length + new tokens).")
    if batch_size <= 0:
        raise FastDecodeError(f"batch_size={batch_size} must be positive.")
    if use_graphs and (tools is None or platform is None or platform.device_type != model.device.type):
        api = "none" if platform is None else f"{platform.kind}: {platform.graph_api}"
        raise FastDecodeError(f"use_graphs=True needs a model on a device with CUDA or XPU graphs (or Gaudi's HPU "
                              f"graphs in lazy mode); this one is on "
                              f"{model.device} (graph API {api}). Pass use_graphs=None or False.")
    reason = attention_blocker(model, max_cache_len)
    if reason is not None:
        raise FastDecodeError(f"{type(model).__name__} {reason}; the graph decoder attends over the whole cache. "
                              "Use decode='generate'.")


def attention_blocker(model: Any, max_cache_len: int) -> str | None:
    """Why the decoders' full attention over `max_cache_len` positions would differ from the model's, or None.
    Sliding-window layers are fine when the window covers the whole cache (every cached key is inside it)."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    kinds = set(getattr(config, "layer_types", None) or ())
    other = sorted(kinds - {"full_attention", "sliding_attention"})
    if other:
        return f"has {', '.join(other)} layers"
    if (window or "sliding_attention" in kinds) and not (window and window >= max_cache_len):
        return (f"uses sliding-window attention (window {window}) shorter than max_cache_len={max_cache_len}")
    return None


def prefill_attention() -> Any:
    """A context in which a prefill forward's attention may use every SDPA backend but cuDNN's. cuDNN attention builds
    a plan per shape, and prefill shapes change with every prompt width and chunk: on an H100 (torch 2.11, bf16) each
    new shape cost ~39 ms, against ~0.05 ms (flash, causal) and ~0.4 ms (memory-efficient, masked) once the kernels
    were loaded. Decode steps keep cuDNN where it is chosen: their shapes are fixed (one plan per bucket, at capture)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "OVERRIDEABLE", "MATH")  # OVERRIDEABLE: XPU's and others'
    return sdpa_kernel([getattr(SDPBackend, name) for name in names if hasattr(SDPBackend, name)])


def cache_keyword(model: Any) -> str:
    """The KV-cache keyword of `model.forward`: `cache` from Transformers 5.25 (`past_key_values` still
    works there, with a deprecation warning, until 5.40), `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
