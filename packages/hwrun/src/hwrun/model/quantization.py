"""4-bit / 8-bit loading through bitsandbytes (X14, X15, G10): which devices it runs on, and the config.

bitsandbytes 0.50 declares `supported_torch_devices = {"cpu", "cuda", "xpu", "hpu", "npu", "mps"}`
(bitsandbytes/__init__.py) and registers kernels per backend (backends/cpu, cuda, xpu, hpu,
mps); its 0.50 installation guide lists NVIDIA, AMD (ROCm wheels on PyPI), Intel XPU, Apple and
Gaudi. On Gaudi, Intel documents 4/8-bit for Gaudi 2 and Gaudi 3 only (G10): which generation a
card is, and what it supports, comes from hwenv's generation table (`hwenv.generation_of`), so a
first-generation Gaudi is refused and a name hwenv does not know yet (a future Gaudi) gets the
newest known generation's rules, said in the plan. MPS is left out: hwrun does not plan for it
beyond CPU-like use.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import devices
from ..errors import QuantizationError

if TYPE_CHECKING:
    import hwenv

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("4bit", "8bit")

#: bitsandbytes 0.50's CPU layout for 4-bit weights (`functional._convert_weight_packed_for_cpu`, block_n=32):
#: the output features are tiled by 32.
BNB_CPU_PACK_BLOCK_N = 32


@dataclass(frozen=True)
class BnbSupport:
    """One kind's bitsandbytes row: whether hwrun quantizes there, what the reason adds, and an
    optional per-device check `check(device_name, quantization) -> (why refused or None, note)`."""

    supported: bool
    note: str = ""
    check: Callable[[str, str], tuple[str | None, str]] | None = None


def gaudi_check(name: str, quantization: str) -> tuple[str | None, str]:
    """(why bitsandbytes `quantization` is refused on the Gaudi called `name`, or None; a note for the
    plan). The generation's facts come from `hwenv.generation_of`; an unknown name gets the newest
    known generation's rules, and the note says so."""
    import hwenv

    generation = hwenv.generation_of(name)
    runs = generation.bnb_4bit if quantization == "4bit" else generation.bnb_8bit
    note = "" if generation.known else f"; {generation.reason()}"
    if runs:
        return None, note
    return (f"{generation.reason()}, and bitsandbytes 4/8-bit runs on Gaudi 2 and Gaudi 3 only (G10)", note)


#: Per kind: does hwrun let bitsandbytes quantize there (mirrors bitsandbytes 0.50 backends), and why.
BITSANDBYTES: dict[str, BnbSupport] = {
    "hpu": BnbSupport(True, " (G10: Gaudi 2/3)", gaudi_check),
    "xpu": BnbSupport(True),
    "rocm": BnbSupport(True, " (bitsandbytes' ROCm wheels, 0.50 installation guide)"),
    "cuda": BnbSupport(True),
    "mps": BnbSupport(False, "hwrun does not plan bitsandbytes on Apple GPUs"),
    "cpu": BnbSupport(True, " (CPU kernels are slow; for a smoke test)"),
}
_NO_ROW = BnbSupport(False, "hwrun has no bitsandbytes row for this kind")


def bnb_devices() -> tuple[str, ...]:
    """The kinds where hwrun lets bitsandbytes quantize."""
    return tuple(kind for kind, support in BITSANDBYTES.items() if support.supported)


def check_quantization(quantization: str | None, accel: hwenv.Accelerator) -> str:
    """Validate `quantization` for this accelerator and return the reason for the plan (raises QuantizationError)."""
    if quantization is None:
        return "none requested (weights keep the planned dtype)"
    if quantization not in QUANTIZATIONS:
        raise QuantizationError(
            f"quantization={quantization!r} is not supported; hwrun quantizes with bitsandbytes to "
            f"{' or '.join(repr(q) for q in QUANTIZATIONS)}, or pass None for none."
        )
    support = devices.row(BITSANDBYTES, accel.kind, _NO_ROW)
    if not support.supported:
        raise QuantizationError(
            f"quantization={quantization!r} on {accel.name} ({accel.kind}): bitsandbytes has no backend hwrun "
            f"supports there ({support.note}; supported: {', '.join(bnb_devices())}); load without quantization."
        )
    checks = [support.check(name, quantization) for name in dict.fromkeys(accel.names)] if support.check else []
    refusals = [why for why, _ in checks if why]
    if refusals:
        raise QuantizationError(
            f"quantization={quantization!r} on {', '.join(dict.fromkeys(accel.names))}: {refusals[0]}; "
            f"use a supported {accel.name} or load in {'bfloat16' if accel.bf16 else 'float32'}."
        )
    notes = "".join(dict.fromkeys(note for _, note in checks))
    if importlib.util.find_spec("bitsandbytes") is None:
        raise QuantizationError(
            f"quantization={quantization!r} needs bitsandbytes, which is not installed; "
            "install it with `pip install 'hwrun[quant]'` (bitsandbytes>=0.45)."
        )
    return f"{quantization} via bitsandbytes, which has a {accel.kind} backend{support.note} (X14){notes}"


def bnb_config(quantization: str, dtype: str) -> Any:
    """The `transformers.BitsAndBytesConfig` for `quantization`; 4-bit uses NF4 with compute in `dtype`."""
    import torch
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=getattr(torch, dtype),
        bnb_4bit_use_double_quant=True,
    )


def bnb_cpu_unpackable(in_features: int, out_features: int, blocksize: int) -> str | None:
    """Why bitsandbytes' CPU repacking cannot take a 4-bit weight of this shape, or None when it can.

    bitsandbytes 0.50 `Linear4bit.forward` (nn/modules.py), on a CPU with AVX512-BF16 in inference (eval, no grad),
    repacks the weight once with `functional._convert_weight_packed_for_cpu`, which reshapes the per-block absmax
    to `[out_features, in_features // blocksize]` and asserts `out_features % 32 == 0` and an even `in_features`.
    The quantization itself is blockwise over the flattened weight, so a layer whose `in_features` is not a
    multiple of the blocksize quantizes fine and then fails there: the shipped tiny model's `down_proj`
    (in 352, blocksize 64) gave `shape '[128, 5]' is invalid for input of size 704`."""
    if in_features % blocksize:
        return f"in_features {in_features} is not a multiple of the 4-bit blocksize {blocksize}"
    if out_features % BNB_CPU_PACK_BLOCK_N:
        return f"out_features {out_features} is not a multiple of {BNB_CPU_PACK_BLOCK_N}"
    if in_features % 2:
        return f"in_features {in_features} is odd"
    return None


def keep_cpu_4bit_layers_unpacked(model: Any) -> dict[str, str]:
    """Keep bitsandbytes' 4-bit layers that its CPU repacking cannot take (`bnb_cpu_unpackable`) on its generic
    4-bit path (dequantize + matmul, the path training and non-AVX512 CPUs use), so they run instead of raising
    at the first forward. Other layers keep the fast packed path. Returns {layer name: why}; logs a warning
    naming them (a slower path for those layers, never a silent one). Does nothing where bitsandbytes does
    not repack (no AVX512-BF16, a GPU, another bitsandbytes without `support_avx512bf16_for_cpu`)."""
    kept: dict[str, str] = {}
    for name, module in model.named_modules():
        if not getattr(module, "support_avx512bf16_for_cpu", False):
            continue
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is None or weight.device.type != "cpu" or getattr(state, "packing_format_for_cpu", False):
            continue
        out_features, in_features = (int(d) for d in state.shape)
        why = bnb_cpu_unpackable(in_features, out_features, int(state.blocksize))
        if why:
            module.support_avx512bf16_for_cpu = False
            kept[name] = why
    if kept:
        first = next(iter(kept.values()))
        logger.warning(
            "bitsandbytes 4-bit on this CPU: %d layer(s) stay on bitsandbytes' generic 4-bit path (dequantize + "
            "matmul, slower) because its AVX512-BF16 repacking needs in_features to be a multiple of the blocksize "
            "and out_features of %d (e.g. %s: %s): %s", len(kept), BNB_CPU_PACK_BLOCK_N, next(iter(kept)), first,
            ", ".join(kept))
    return kept


def after_load(model: Any, plan: Any) -> None:
    """What a quantized model needs once loaded, before its first forward (called by `load()` for every path)."""
    if getattr(model, "is_quantized", False) or plan.quantization:
        keep_cpu_4bit_layers_unpacked(model)
