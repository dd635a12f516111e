"""Quantized weights in hwrun's engine. torchao's weights are tensor subclasses that any step runs as they are (the
fused step runs them unfused, the model step through the model's own Linears; neither keeps dequantized copies).
Other libraries' layers are modules with their own kernels, run by the model's own forward, eagerly (none has been
captured in hwrun's graphs or compiled steps):

- bitsandbytes 4-bit `Linear4bit`; 8-bit `Linear8bitLt` (LLM.int8) is refused, because its outlier split is decided
  per batch from the activations of every row in it, so a request's tokens would change with the requests beside it.
- pre-quantized checkpoints Transformers loads through another quantizer (`quant_method` awq, gptq, auto-round,
  compressed-tensors, fp8), and a model Intel Neural Compressor converted to FP8 on Gaudi after load (fp8-inc: its
  patched modules, marked by hwrun): the same eager model step. compressed-tensors keeps its weights compressed until the first
  forward, where its own hook (`ModelCompressor.add_decompress_hook`, compressed-tensors 0.20) decompresses them in
  place to the model's dtype; a warning says so when the engine is built (hwrun makes no copy of its own).

An engine over such weights therefore refuses `step="fused"`, `use_graphs=True` and a `compile_backend`, and picks
the model step and eager steps itself under "auto" / None (logged with the reason)."""

from __future__ import annotations

import logging
from typing import Any

from ...errors import FastDecodeError
from ...model import quantization_table as _table

logger = logging.getLogger(__name__)

#: Why an engine over bitsandbytes 4-bit weights steps eagerly over the model's own forward.
BNB_EAGER_REASON = ("bitsandbytes 4-bit weights (Linear4bit) run the model's own forward, eagerly: bitsandbytes' "
                    "kernels have not been captured in hwrun's graphs or compiled steps")
#: Why hwrun's engine refuses bitsandbytes 8-bit weights.
BNB_8BIT_REASON = ("bitsandbytes 8-bit weights (LLM.int8, Linear8bitLt) split outlier columns per batch from every "
                   "row's activations, so a request's tokens would change with the requests beside it")
#: Why an engine over another library's pre-quantized layers steps eagerly ({method}: the checkpoint's quant_method).
EAGER_REASON = ("{method} weights run the model's own forward, eagerly: their layers' kernels have not been captured "
                "in hwrun's graphs or compiled steps, and the fused step reads plain or torchao weights only")
#: Why compressed-tensors weights are dense after the first forward (said once per engine, as a warning).
CT_DECOMPRESS_REASON = ("compressed-tensors decompresses the checkpoint's weights in place to the model's dtype at the "
                        "first forward (its own forward pre-hook, ModelCompressor.add_decompress_hook; Transformers "
                        "5.25 has no compressed int kernels), so decoding runs dense weights and memory grows to the "
                        "unquantized size; Transformers' own loop does the same")
#: `quant_method` values whose layers run the engine's eager model step (bitsandbytes and torchao are handled apart):
#: the quantization table's one list.
EAGER_METHODS = _table.EAGER_METHODS


def bnb_bits(model: Any) -> int | None:
    """4 or 8 when `model`'s linear layers are bitsandbytes' (found by class, without importing bitsandbytes)."""
    for module in model.modules():
        kind = type(module)
        if kind.__module__.startswith("bitsandbytes"):
            if kind.__name__ == "Linear4bit":
                return 4
            if kind.__name__ == "Linear8bitLt":
                return 8
    return None


def quant_method(model: Any) -> str | None:
    """The `quant_method` of the quantizer Transformers loaded `model` with ("compressed-tensors", "gptq", ...),
    "fp8-inc" for a model hwrun converted with Intel Neural Compressor (`model.quantization.INC_MARK`), or None for an
    unquantized model (a PEFT model is asked through its base)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    from ...model.quantization import INC_MARK

    if getattr(base, INC_MARK, None):  # converted by Intel Neural Compressor after load (fp8-inc): no HF quantizer
        return str(getattr(base, INC_MARK))
    config = getattr(getattr(base, "hf_quantizer", None), "quantization_config", None)
    method = getattr(config, "quant_method", None)
    return None if method is None else str(getattr(method, "value", method)).lower()


def eager_method(model: Any) -> str | None:
    """The `quant_method` of `model`'s pre-quantized layers when the engine runs them through the model's own forward,
    eagerly (`EAGER_METHODS`), else None (unquantized, torchao, bitsandbytes: `bnb_bits`)."""
    method = quant_method(model)
    return method if method in EAGER_METHODS else None


def eager_reason(model: Any = None, quantization: str | None = None) -> str | None:
    """Why hwrun's loops must step eagerly over the model's own forward for another library's pre-quantized layers
    (`EAGER_REASON`), or None: asked of the loaded `model` (`eager_method`), else before load of the plan's
    `quantization` value ("compressed-tensors", "gptq", ...). For `inference.decision`, which builds the engine
    and the static decoder from its own reasons (bitsandbytes 4-bit: `BNB_EAGER_REASON`, asked apart)."""
    method = eager_method(model) if model is not None else (quantization if quantization in EAGER_METHODS else None)
    return None if method is None else EAGER_REASON.format(method=method)


def _refuse_asked(step: str, use_graphs: bool | None, compile_backend: Any, reason: str) -> None:
    asked = [what for what, bad in (("step='fused'", step == "fused"), ("use_graphs=True", use_graphs is True),
                                    (f"compile_backend={compile_backend!r}", compile_backend is not None)) if bad]
    if asked:
        raise FastDecodeError(f"{', '.join(asked)} cannot run this model: {reason}. Leave them at their defaults "
                              "(the model step, eager).")


def plan_quantized(model: Any, step: str, use_graphs: bool | None, compile_backend: Any) -> tuple[str, bool | None]:
    """(step, use_graphs) an engine over `model`'s weights runs: unchanged unless they are bitsandbytes' or another
    library's pre-quantized layers (`eager_method`): then the model step, eagerly, logged with the reason;
    `FastDecodeError` for what was asked that cannot run them (the fused step, graphs, compile), and for 8-bit."""
    bits = bnb_bits(model)
    method = eager_method(model) if bits is None else None
    if bits is None and method is None:
        return step, use_graphs
    if bits == 8:
        raise FastDecodeError(f"hwrun's engine cannot run this model: {BNB_8BIT_REASON}. Use 4-bit weights "
                              "(--quantization 4bit) or Transformers' loop (decode='generate').")
    reason = BNB_EAGER_REASON if bits == 4 else EAGER_REASON.format(method=method)
    _refuse_asked(step, use_graphs, compile_backend, reason)
    what = "bitsandbytes 4-bit" if bits == 4 else method
    logger.info("engine over %s weights: model step, eager steps (%s)", what, reason)
    if method == "compressed-tensors":
        logger.warning("engine over compressed-tensors weights: %s", CT_DECOMPRESS_REASON)
    return "model", False
