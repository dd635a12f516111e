"""4-bit / 8-bit loading through bitsandbytes (X14, X15, G10): which devices it runs on, and the config.

bitsandbytes 0.50 declares `supported_torch_devices = {"cpu", "cuda", "xpu", "hpu", "npu", "mps"}`
(bitsandbytes/__init__.py) and registers kernels per backend (backends/cpu, cuda, xpu, hpu,
mps). On Gaudi, Intel documents 4/8-bit for Gaudi 2 and Gaudi 3 only (G10), so a first-generation
Gaudi is refused. MPS is left out: hwrun does not plan for it beyond CPU-like use.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from .errors import QuantizationError

if TYPE_CHECKING:
    import hwenv

QUANTIZATIONS = ("4bit", "8bit")
#: Device kinds where hwrun lets bitsandbytes quantize (mirrors bitsandbytes 0.50 backends).
BNB_DEVICES = ("cuda", "xpu", "hpu", "cpu")


def check_quantization(quantization: str | None, accel: hwenv.Accelerator) -> str:
    """Validate `quantization` for this accelerator and return the reason for the plan (raises QuantizationError)."""
    if quantization is None:
        return "none requested (weights keep the planned dtype)"
    if quantization not in QUANTIZATIONS:
        raise QuantizationError(
            f"quantization={quantization!r} is not supported; hwrun quantizes with bitsandbytes to "
            f"{' or '.join(repr(q) for q in QUANTIZATIONS)}, or pass None for none."
        )
    if accel.kind not in BNB_DEVICES:
        raise QuantizationError(
            f"quantization={quantization!r} on {accel.name} ({accel.kind}): bitsandbytes has no backend hwrun "
            f"supports there (supported: {', '.join(BNB_DEVICES)}); load without quantization."
        )
    if accel.kind == "hpu" and any(_first_gen_gaudi(name) for name in accel.names):
        raise QuantizationError(
            f"quantization={quantization!r} on {', '.join(dict.fromkeys(accel.names))}: bitsandbytes 4/8-bit runs on Gaudi 2 "
            "and Gaudi 3 only (G10); use a Gaudi 2/3 or load in bfloat16."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise QuantizationError(
            f"quantization={quantization!r} needs bitsandbytes, which is not installed; "
            "install it with `pip install 'hwrun[quant]'` (bitsandbytes>=0.45)."
        )
    note = " (CPU kernels are slow; for a smoke test)" if accel.kind == "cpu" else ""
    gaudi = " (G10: Gaudi 2/3)" if accel.kind == "hpu" else ""
    return f"{quantization} via bitsandbytes, which has a {accel.kind} backend{gaudi}{note} (X14)"


def _first_gen_gaudi(name: str) -> bool:
    upper = name.upper().replace(" ", "")
    return "GAUDI" in upper and not any(tag in upper for tag in ("GAUDI2", "GAUDI3", "HL-225", "HL-325"))


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
