"""Quantized weights in hwrun's engine. torchao's weights are tensor subclasses that any step runs as they are (the
fused step runs them unfused, the model step through the model's own Linears; neither keeps dequantized copies). bitsandbytes' layers are modules with
their own kernels: 4-bit `Linear4bit` runs the model's own forward, eagerly (bitsandbytes' kernels have not been
captured in hwrun's graphs or compiled steps); 8-bit `Linear8bitLt` (LLM.int8) is refused, because its outlier
split is decided per batch from the activations of every row in it, so a request's tokens would change with the
requests beside it. An engine over 4-bit weights therefore refuses `step="fused"`, `use_graphs=True` and a
`compile_backend`, and picks the model step and eager steps itself under "auto" / None (logged)."""

from __future__ import annotations

import logging
from typing import Any

from ...errors import FastDecodeError

logger = logging.getLogger(__name__)

#: Why an engine over bitsandbytes 4-bit weights steps eagerly over the model's own forward.
BNB_EAGER_REASON = ("bitsandbytes 4-bit weights (Linear4bit) run the model's own forward, eagerly: bitsandbytes' "
                    "kernels have not been captured in hwrun's graphs or compiled steps")
#: Why hwrun's engine refuses bitsandbytes 8-bit weights.
BNB_8BIT_REASON = ("bitsandbytes 8-bit weights (LLM.int8, Linear8bitLt) split outlier columns per batch from every "
                   "row's activations, so a request's tokens would change with the requests beside it")


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


def plan_quantized(model: Any, step: str, use_graphs: bool | None, compile_backend: Any) -> tuple[str, bool | None]:
    """(step, use_graphs) an engine over `model`'s weights runs: unchanged unless they are bitsandbytes' (4-bit: the
    model step, eagerly; `FastDecodeError` for what cannot run them, and for 8-bit)."""
    bits = bnb_bits(model)
    if bits is None:
        return step, use_graphs
    if bits == 8:
        raise FastDecodeError(f"hwrun's engine cannot run this model: {BNB_8BIT_REASON}. Use 4-bit weights "
                              "(--quantization 4bit) or Transformers' loop (decode='generate').")
    asked = [what for what, bad in (("step='fused'", step == "fused"), ("use_graphs=True", use_graphs is True),
                                    (f"compile_backend={compile_backend!r}", compile_backend is not None)) if bad]
    if asked:
        raise FastDecodeError(f"{', '.join(asked)} cannot run this model: {BNB_EAGER_REASON}. Leave them at their "
                              "defaults (the model step, eager).")
    logger.info("engine over bitsandbytes 4-bit weights: model step, eager steps (%s)", BNB_EAGER_REASON)
    return "model", False
