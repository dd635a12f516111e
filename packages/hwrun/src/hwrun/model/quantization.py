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
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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

#: Device types where bitsandbytes 0.50 repacks 4-bit weights for AVX512-BF16 at the first eval forward.
BNB_REPACK_DEVICE_TYPES = frozenset({"cpu"})
#: torchao 0.18's int4 weight layout per torch device type: None is the CPU's own prototype config; others not
#: listed (CUDA, ROCm) take the tile-packed layout.
INT4_LAYOUTS = {"cpu": None, "xpu": "PLAIN_INT32"}


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
        if state is None or weight.device.type not in BNB_REPACK_DEVICE_TYPES or getattr(state, "packing_format_for_cpu",
                                                                                      False):
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
    """What a quantized model needs once loaded, before its first forward (called by `load()` for every path):
    bitsandbytes' CPU 4-bit layers its repacking cannot take, a warning when the quantization library loaded the model
    in another dtype than the plan's, a warning that compressed-tensors will decompress its
    weights at the first forward (its own hook: `quantization_table.CT_DECOMPRESSES`), INC's FP8 conversion of an fp8-inc
    plan (`convert_with_inc`), and the LM head of a torchao weight-only plan
    (`quantize_lm_head`; a plan with `quantize_lm_head=False` keeps it in the planned dtype)."""
    if getattr(model, "is_quantized", False) or plan.quantization:
        keep_cpu_4bit_layers_unpacked(model)
    loaded = str(getattr(model, "dtype", "")).removeprefix("torch.")
    if plan.quantization and loaded and getattr(plan, "dtype", loaded) != loaded:
        logger.warning("%s: the quantization library loaded the model in %s, not the planned %s (auto-round 0.16 "
                       "forces float16, for one); its non-quantized layers and activations run in %s", plan.quantization,
                       loaded, plan.dtype, loaded)
    if plan.quantization == "compressed-tensors" and hasattr(model, "ct_decompress_hook"):
        from .quantization_table import CT_DECOMPRESSES

        logger.warning("compressed-tensors checkpoint: %s", CT_DECOMPRESSES)
    if plan.quantization == "fp8-inc":
        convert_with_inc(model, plan)
    method = lm_head_method(plan)
    if method is not None and getattr(plan, "quantize_lm_head", True):
        done = quantize_lm_head(model, method)
        logger.info("%s", done)


# ---- every method of the table (issue 43): plan, pre-quantized checkpoints, the config passed to from_pretrained ----

#: int4 group sizes hwrun picks from, largest first (torchao's CPU int4 layout takes 32/64/128; its tinygemm
#: layout 32..256). torchao skips, with only an info log, a weight whose in_features the group size does not divide
#: (`quant_api._int4_weight_only_quantize_tensor`), so hwrun picks one that divides every linear layer's.
INT4_GROUP_SIZES = (128, 64, 32)


@dataclass(frozen=True)
class QuantizationChoice:
    """What the plan holds for quantization: `value` (the plan's `quantization`: "4bit"/"8bit" for bitsandbytes, else
    the method's name; None for none), the table's `method`, whether the checkpoint is `pre_quantized` (its
    config.json has a `quantization_config`: Transformers reads it, hwrun passes none), the `reason`, `bits`
    for the size estimate (None: the weights keep the planned dtype or the checkpoint's own packing), and whether
    the LM head is quantized too (`quantize_lm_head`)."""

    value: str | None
    method: str | None
    pre_quantized: bool
    reason: str
    bits: int | None
    #: the LM head is quantized too (an untied copy where it is tied to the input embedding; `LM_HEAD_METHODS`)
    quantize_lm_head: bool = False
    #: fp8-inc: the checked INC FP8 config (QUANTIZE mode, measurements present) `load()` converts with
    inc_config: str | None = None

    @property
    def size_key(self) -> str | None:
        """The key of `source.QUANT_BYTES` for the weight-size estimate ("4bit"/"8bit"), None for none."""
        if self.bits is None or self.pre_quantized:  # a pre-quantized checkpoint's headers already count its packing
            return None
        return "4bit" if self.bits == 4 else "8bit"


def checkpoint_quantization(config: dict | None) -> tuple[str, str] | None:
    """(table method, what the checkpoint says) for a config.json with a `quantization_config`, else None.
    Raises QuantizationError for a `quant_method` hwrun has no row for (naming it and the ones it has)."""
    from .quantization_table import METHODS

    qc = (config or {}).get("quantization_config")
    if not isinstance(qc, dict):
        return None
    quant_method = str(qc.get("quant_method", "")).lower()
    said = f"quantization_config.quant_method={quant_method!r}"
    if quant_method == "bitsandbytes":
        return ("bnb-8bit" if qc.get("load_in_8bit") else "bnb-4bit"), said
    if quant_method == "torchao":
        return _torchao_method(qc, said), said
    for name, method in METHODS.items():  # torchao and bitsandbytes, several methods each, are read above
        if quant_method in method.quant_methods:
            return name, said
    known = sorted({q for m in METHODS.values() for q in m.quant_methods})
    raise QuantizationError(
        f"the checkpoint's config.json says {said}; hwrun has no row for it in its quantization table "
        f"(it plans {', '.join(known)}). Load a checkpoint quantized with one of those, or an unquantized one.")


#: torchao config class -> table method (a checkpoint's `quant_type.default._type`).
TORCHAO_TYPES = {
    "Int4WeightOnlyConfig": "int4-weight-only", "PrototypeInt4WeightOnlyConfig": "int4-weight-only",
    "Int8WeightOnlyConfig": "int8-weight-only", "Int8DynamicActivationInt8WeightConfig": "int8-dynamic",
    "Float8DynamicActivationFloat8WeightConfig": "float8",
}

#: torchao int4 layouts are device-specific: a checkpoint saved in one loads on that device only (torchao 0.18:
#: Int4OpaqueTensor CPU, tile_packed_to_4d CUDA tinygemm, plain_int32 XPU; `plain` needs mslk on CUDA).
INT4_LAYOUT_DEVICE = {"PrototypeInt4WeightOnlyConfig": "cpu", "tile_packed_to_4d": "cuda", "plain_int32": "xpu",
                      "plain": "cuda", "preshuffled": "cuda"}


def _torchao_type(qc: dict) -> tuple[str, dict]:
    quant_type = qc.get("quant_type")
    entry = quant_type.get("default", quant_type) if isinstance(quant_type, dict) else {}
    entry = entry if isinstance(entry, dict) else {}
    return str(entry.get("_type", quant_type if isinstance(quant_type, str) else "")), entry.get("_data") or {}


def _torchao_method(qc: dict, said: str) -> str:
    type_name, _ = _torchao_type(qc)
    if type_name not in TORCHAO_TYPES:
        raise QuantizationError(
            f"the checkpoint's config.json says {said} with quant_type {type_name or '(none)'!r}; hwrun plans torchao "
            f"{', '.join(TORCHAO_TYPES)}. Load a checkpoint quantized with one of those, or an unquantized one.")
    return TORCHAO_TYPES[type_name]


def _int4_layout_device(qc: dict) -> str | None:
    type_name, data = _torchao_type(qc)
    if type_name == "PrototypeInt4WeightOnlyConfig":
        return "cpu"
    layout = data.get("int4_packing_format")
    if isinstance(layout, dict):  # an enum serialised by torchao's config_to_dict
        layout = layout.get("_data", layout.get("value"))
    return INT4_LAYOUT_DEVICE.get(str(layout or "plain").lower())


def int4_group_size(config: dict | None) -> tuple[int, str]:
    """(group size, why) for int4 weight-only: the largest of INT4_GROUP_SIZES dividing every linear layer's
    in_features (hidden size, attention width, intermediate size) read from config.json. Raises QuantizationError
    when none divides them (torchao would leave those layers unquantized, logging only at info)."""
    text = (config or {}).get("text_config") or config or {}
    hidden = text.get("hidden_size")
    if not hidden:
        return INT4_GROUP_SIZES[0], f"group size {INT4_GROUP_SIZES[0]} (config.json not read: layer widths unchecked)"
    heads = text.get("num_attention_heads") or 1
    widths = {int(hidden), int(text.get("head_dim") or hidden // heads) * int(heads)}
    if text.get("intermediate_size"):
        widths.add(int(text["intermediate_size"]))
    for size in INT4_GROUP_SIZES:
        if all(w % size == 0 for w in widths):
            return size, f"group size {size} (divides every linear layer's in_features: {sorted(widths)})"
    raise QuantizationError(
        f"int4-weight-only: no group size of {INT4_GROUP_SIZES} divides this model's layer widths {sorted(widths)}; "
        "torchao would leave those layers unquantized. Use int8-weight-only, or bnb-4bit.")


def quantize_methods() -> tuple[str, ...]:
    """Every `--quantize` spelling: the table's methods plus the bitsandbytes plan values "4bit"/"8bit"."""
    from .quantization_table import ALIASES, METHODS

    return (*METHODS, *ALIASES)


def on_load_methods(kind: str) -> tuple[str, ...]:
    """The `--quantize` methods that quantize an unquantized checkpoint on load on devices of `kind`: the table's
    on-load methods whose cell for `kind` runs (so never hqq, which Transformers 5.25 cannot quantize with, nor float8
    on the CPU)."""
    from .quantization_table import METHODS, cell

    return tuple(name for name, method in METHODS.items() if method.on_load and cell(kind, name).runs)


def plan_quantization(quantization: str | None, accel: hwenv.Accelerator, dtype: str,
                      config: dict | None = None, *, quantize_lm_head: bool = True,
                      inc_config: str | os.PathLike | None = None) -> QuantizationChoice:
    """Decide quantization for the plan, before anything loads: the requested method (`--quantize`, or "4bit"/"8bit")
    and/or the checkpoint's own `quantization_config`, checked against the table row of the accelerator's kind, the
    cell's finer rule (compute capability, Gaudi generation, dtype) and the library being installed. Raises
    QuantizationError naming the value, the rule and the fix. `quantize_lm_head`: for the torchao weight-only methods
    quantizing on load (`LM_HEAD_METHODS`), quantize the LM head too (the default; False keeps it in `dtype`).
    `inc_config`: fp8-inc's INC FP8 config path (else $QUANT_CONFIG, INC's convention; `check_inc_config`)."""
    from .quantization_table import (
        METHODS,
        QUANTIZATION_TABLE,
        cell,
        method_name,
        plan_value,
    )

    if quantization is not None and method_name(quantization) not in METHODS:
        raise QuantizationError(
            f"quantization={quantization!r} is not a method hwrun plans; use one of {', '.join(quantize_methods())} "
            "('4bit'/'8bit' are bitsandbytes), or None for none.")
    found = checkpoint_quantization(config)
    requested = method_name(quantization) if quantization is not None else None
    if inc_config is not None and requested != "fp8-inc":
        raise QuantizationError(f"inc_config={os.fspath(inc_config)!r} is Intel Neural Compressor's FP8 config, "
                                f"read with quantization='fp8-inc' only (asked: {quantization!r}); drop it or pass "
                                "quantization='fp8-inc' (--quantize fp8-inc).")
    if found is None and requested is None:
        return QuantizationChoice(None, None, False, "none requested (weights keep the planned dtype)", None)
    if found is not None and requested is not None and found[0] != requested:
        raise QuantizationError(
            f"quantization={quantization!r}: the checkpoint is already quantized ({found[1]}, which hwrun plans as "
            f"{found[0]!r}); drop the option to load it as it is, or pass an unquantized checkpoint.")
    name = requested or found[0]
    method = METHODS[name]
    value = plan_value(name)
    here = cell(accel.kind, name)
    where = [k for k, row in QUANTIZATION_TABLE.items() if row[name].runs]
    cited = f"sources: {', '.join(here.sources) or 'none'} (hwrun's README lists them)"
    if not here.runs and name not in PLAN_VALUE_BNB:  # bitsandbytes: BITSANDBYTES' own messages, below
        raise QuantizationError(
            f"quantization={value!r} ({method.library}) on {accel.name} ({accel.kind}): {here.reason} [{cited}]. "
            f"hwrun runs it on: {', '.join(where) or 'no device'}; pick another method for {accel.kind} "
            f"(`hwrun plan --quantize METHOD` says which) or load without quantization.")
    if found is None and not method.on_load:
        here_on_load = on_load_methods(accel.kind)
        raise QuantizationError(
            f"quantization={quantization!r} loads {method.summary} only (run by {method.library}) and this model's "
            f"config.json has no quantization_config; quantize it first, or pick a method that quantizes on load "
            + (f"on {accel.kind} ({', '.join(here_on_load)})." if here_on_load
               else f"(none runs on {accel.kind}): load without quantization."))
    if name in PLAN_VALUE_BNB:  # bitsandbytes: the generation table on Gaudi, its own messages (kept)
        reason = check_quantization(value, accel)
    else:
        refusal = here.check(accel, dtype) if here.check else None
        if refusal:
            raise QuantizationError(f"quantization={value!r} ({method.library}) on {accel.name}: {refusal}. "
                                    f"Pick another method or device (`hwrun plan --quantize METHOD`).")
        reason = f"{name} via {method.library} ({method.summary}): {accel.kind} runs it, {here.reason}"
    if found is not None:
        reason += f"; pre-quantized checkpoint ({found[1]}): Transformers reads its config, hwrun passes none"
        if name == "int4-weight-only":
            layout_device = _int4_layout_device(config["quantization_config"])
            if layout_device and layout_device != accel.device_type:
                raise QuantizationError(
                    f"the checkpoint's torchao int4 layout is {layout_device}-only (torchao 0.18 packs int4 per "
                    f"device) and this plan runs on {accel.device_type}; load it on {layout_device}, or quantize the "
                    f"unquantized model on load here (--quantize int4-weight-only).")
    elif name == "int4-weight-only":
        reason += f"; {int4_group_size(config)[1]}"
    head_too = found is None and name in LM_HEAD_METHODS  # quantized on load by a weight-only method
    if head_too:
        reason += f"; {lm_head_reason(config, dtype, quantize_lm_head)}"
    _require_library(value, method)
    inc = None
    if name == "fp8-inc":  # the device and the library are checked above; now the measured config
        inc = check_inc_config(inc_config)
        measured = (f"measurements {inc.measure_file!r}" if inc.measure_file
                    else "no measurement file (dynamic or fixed-scale config)")
        reason += (f"; INC config {inc.path!r} ({inc.source}): mode QUANTIZE, observer {inc.observer!r}, {measured}; "
                   "after load hwrun calls convert(model, FP8Config.from_json_file(path)) and runs the model's own "
                   "forward, eagerly")
    # fp8-inc loads in the planned dtype and INC converts after load, so the load needs the unquantized size
    bits = None if found or inc else method.bits
    return QuantizationChoice(value, name, found is not None, reason, bits, head_too and quantize_lm_head,
                              inc.path if inc else None)


PLAN_VALUE_BNB = ("bnb-4bit", "bnb-8bit")


def _require_library(value: str, method: Any) -> None:
    if method.package in ("transformers",) or method.name in PLAN_VALUE_BNB:  # bitsandbytes checked above
        return
    if importlib.util.find_spec(method.package) is None:
        install = (f"`pip install 'hwrun[{method.extra}]'`" if method.extra
                   else f"`pip install {method.library}`")
        raise QuantizationError(f"quantization={value!r} needs {method.library}, which is not installed; install it "
                                f"with {install}.")


def quantization_config(plan: Any, config: dict | None) -> Any:
    """The `quantization_config` `from_pretrained` gets for `plan` (None for none, and for a pre-quantized checkpoint:
    Transformers reads the checkpoint's own). Device-specific layouts follow the table (torchao int4: the CPU opaque
    layout, CUDA's tinygemm tile_packed_to_4d, XPU's plain_int32)."""
    from .quantization_table import method_name

    if not plan.quantization or checkpoint_quantization(config) is not None:
        return None
    name = method_name(plan.quantization)
    if name in PLAN_VALUE_BNB:
        return bnb_config(plan.quantization, plan.dtype)
    if name == "fp8-inc":  # loaded unquantized; `after_load` converts it with INC
        return None
    if name == "hqq":
        from transformers import HqqConfig

        return HqqConfig(nbits=4, group_size=64)
    from transformers import TorchAoConfig

    return TorchAoConfig(torchao_config(name, plan.accelerator.device_type, config))


def torchao_config(name: str, device_type: str, config: dict | None = None) -> Any:
    """The torchao `AOBaseConfig` for a torchao method on `device_type` (imports torchao)."""
    if name == "int8-weight-only":
        from torchao.quantization import Int8WeightOnlyConfig

        return Int8WeightOnlyConfig()
    if name == "int8-dynamic":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig

        return Int8DynamicActivationInt8WeightConfig()
    if name == "float8":
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

        return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    if name != "int4-weight-only":
        raise QuantizationError(f"quantization={name!r} is not a torchao method ({', '.join(TORCHAO_TYPES.values())})")
    group_size, _ = int4_group_size(config)
    layout_name = INT4_LAYOUTS.get(device_type, "TILE_PACKED_TO_4D")
    if layout_name is None:  # the CPU: torchao's own prototype config
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=group_size)
    from torchao.quantization import Int4WeightOnlyConfig
    from torchao.quantization.quantize_.workflows import Int4PackingFormat

    return Int4WeightOnlyConfig(group_size=group_size, int4_packing_format=getattr(Int4PackingFormat, layout_name))


# ---- the LM head (issue 43.3): quantized too for the weight-only methods, untied from the input embedding ----

#: The torchao methods whose quantize-on-load also quantizes the LM head (`quantize_lm_head`). Transformers'
#: TorchAoConfig leaves the output embedding unquantized (`quantizers/base.py get_keys_to_not_convert`), and its
#: `include_input_output_embeddings` / `untie_embedding_weights` options (transformers 5.22.2 to 5.25, the same code)
#: quantize the *input* embedding and tie nothing to a quantized head: on a tied Llama the head stayed the bf16
#: embedding with every combination of them and `modules_to_not_convert=[]` (checked on the CPU). So hwrun quantizes
#: the head itself after load with torchao's `quantize_`, with the method's own config. A batch-1 decode step reads
#: the whole head every token: the 1.24B Llama's 128,256 x 2,048 head (tied, bf16) was 0.49 GiB of the ~1.03 GiB an
#: int4 token read on an H100, and int4 decoded at 0.84x bf16 (docs/benchmarks/quantization.md). The dynamic and
#: float8 methods keep it: their activation rounding at the head would add to the logits' error, untested here.
LM_HEAD_METHODS = ("int8-weight-only", "int4-weight-only")


def lm_head_reason(config: dict | None, dtype: str, quantized: bool = True) -> str:
    """The plan's words on the LM head of a weight-only torchao plan (`quantized`: the head is quantized too)."""
    text = (config or {}).get("text_config") or config or {}
    vocab, hidden, tied = text.get("vocab_size"), text.get("hidden_size"), text.get("tie_word_embeddings")
    shape = f" ({int(vocab):,} x {int(hidden):,})" if vocab and hidden else ""
    if not quantized:
        return f"LM head{shape} kept in {dtype} (quantize_lm_head=False){'; tied to the input embedding' * bool(tied)}"
    if tied:
        how = (f"untied: the input embedding stays {dtype} for the lookup and the head becomes its own quantized "
               "copy, the only added weight")
    else:
        how = "not tied to the input embedding" if tied is False else "untied first if tied to the input embedding"
    return (f"LM head{shape} quantized too ({how}): a batch-1 decode step reads the whole head every token (a 1.24B "
            "Llama's bf16 head was half of what an int4 token read, docs/benchmarks/quantization.md); training mode "
            "(LoRA) gets the plain head back; quantize_lm_head=False keeps it")


def lm_head_method(plan: Any) -> str | None:
    """The method `after_load` quantizes the LM head of `plan`'s model with, or None: a torchao weight-only plan
    quantizing an unquantized checkpoint on load (a pre-quantized checkpoint keeps its own head)."""
    from .quantization_table import method_name

    if not plan.quantization or method_name(plan.quantization) not in LM_HEAD_METHODS:
        return None
    source = plan.model_source() if hasattr(plan, "model_source") else None
    if source is not None and checkpoint_quantization(source.config) is not None:
        return None
    return method_name(plan.quantization)


def is_torchao_tensor(weight: Any) -> bool:
    """Whether `weight` is one of torchao's quantized tensor subclasses (by class, without importing torchao: the
    fused decode step asks this of every weight, quantized or not)."""
    return any(c.__module__.startswith("torchao.") for c in type(weight).__mro__)


def quantize_lm_head(model: Any, method: str) -> str:
    """Quantize `model`'s LM head with the torchao weight-only `method` in place, after a load that quantized the
    rest of it; returns what was done (for the log). A head tied to the input embedding is untied without a copy:
    torchao builds the quantized weight from the shared one and sets it on the head alone, the embedding keeps the
    original for its lookup, and the config says `tie_word_embeddings=False` (and the model's tied-weights map loses
    the head) so a later `tie_weights()` does not tie them again. A head torchao cannot take keeps its weight (and its
    tie), with a warning saying why.

    The quantized head is for inference: putting the model in training mode (`model.train()`, as Trainer does) gives
    the head a plain weight back (`_HeadForTraining`): a tied head the input embedding's own parameter (tied again, as
    before the load), an untied one its quantized weight dequantized (no second copy was kept), so LoRA training on a
    quantized base runs as before (training's fused loss reads the head's weight as a plain matrix, and an untied
    quantized copy of a tied head would only add memory there)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if not isinstance(head, torch.nn.Linear) or weight is None:
        return f"LM head not quantized: the output embedding is a {type(head).__name__}, not a Linear layer"
    if is_torchao_tensor(weight):
        return f"LM head already quantized ({type(weight).__name__})"
    if not any(is_torchao_tensor(getattr(m, "weight", None)) for m in model.modules()):
        return "LM head not quantized: the model's other layers are not torchao-quantized (an unquantized load)"
    if weight.device.type == "meta" or getattr(head, "_hf_hook", None) is not None:
        return "LM head not quantized: it is offloaded by the device map (accelerate moves it per forward)"
    if head.training:
        return "LM head not quantized: the model is in training mode (the quantized head is for inference)"
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = getattr(embedding, "weight", None) is weight
    from torchao.quantization import quantize_

    config = model.config.to_dict() if hasattr(model.config, "to_dict") else None
    dtype = str(weight.dtype).removeprefix("torch.")
    try:
        quantize_(head, torchao_config(method, weight.device.type, config))
    except Exception as exc:  # noqa: BLE001 - torchao's refusals (assertions on shapes) keep the head as it was
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        logger.warning("LM head kept in %s: torchao %s could not quantize it (%s)", dtype, method, why)
        return f"LM head kept in {dtype}: torchao {method} could not quantize it ({why})"
    _HeadForTraining(head, weight if tied else None, _untie(model, head) if tied else [])
    return (f"LM head {tuple(weight.shape)} quantized with {method} ({type(head.weight).__name__})"
            + (f"; untied from the input embedding, which stays {dtype} for the lookup" if tied else ""))


def _untie(model: Any, head: Any) -> list[tuple[Any, dict, str, str]]:
    """Record that `head` is no longer tied to the input embedding: every config saying `tie_word_embeddings` says
    False, and Transformers' tied-weights maps (`all_tied_weights_keys`) lose the head's weight. Returns what was
    changed, as (object, map or None, key, old value) for `_HeadForTraining` to put back."""
    changed: list[tuple[Any, dict, str, str]] = []
    configs = [model.config]
    if hasattr(model.config, "get_text_config"):
        configs.append(model.config.get_text_config(decoder=True))
    for module in model.modules():
        tied = getattr(module, "all_tied_weights_keys", None)
        if isinstance(tied, dict):
            for name, sub in module.named_modules():
                if sub is head and f"{name}.weight" in tied:
                    changed.append((module, tied, f"{name}.weight", tied.pop(f"{name}.weight")))
            if getattr(module, "config", None) is not None:
                configs.append(module.config)
    for config in {id(c): c for c in configs}.values():  # configs are not hashable
        if getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
            changed.append((config, None, "tie_word_embeddings", True))
    return changed


class _HeadForTraining:
    """Installed on a quantized LM head as its `train` method; the first `train(True)` gives the head a plain weight
    before switching the mode: `tied` (the input embedding's parameter the head shared before it was quantized) with
    the tie recorded again (`untied`), else the quantized weight dequantized. `train(False)` only switches the mode."""

    def __init__(self, head: Any, tied: Any, untied: list) -> None:
        self.head, self.tied, self.untied = head, tied, untied
        self.train = type(head).train.__get__(head)
        head.train = self

    def __call__(self, mode: bool = True) -> Any:
        if mode and self.head.__dict__.get("train") is self:
            del self.head.train  # the module's own train() from now on
            self._plain_weight()
        return self.train(mode)

    def _plain_weight(self) -> None:
        import torch

        quantized = self.head.weight
        name = type(quantized).__name__
        if self.tied is not None:
            self.head.weight = self.tied
            for target, mapping, key, old in self.untied:
                if mapping is None:
                    setattr(target, key, old)
                else:
                    mapping[key] = old
            logger.info("training mode: the LM head is the input embedding's weight again (tied), not its %s copy",
                        name)
            return
        try:
            plain = quantized.dequantize()
        except Exception as exc:  # noqa: BLE001 - a layout without dequantize keeps its quantized head
            logger.warning("training mode: the LM head stays %s (torchao could not dequantize it: %s)", name, exc)
            return
        self.head.weight = torch.nn.Parameter(plain, requires_grad=False)
        logger.info("training mode: the LM head's %s weight is dequantized to %s (its values keep the rounding)",
                    name, str(plain.dtype).removeprefix("torch."))




def decode_blocker(value: str) -> str | None:
    """Why hwrun's graph decode loops (and its serving engine) do not run a plan quantized with `value`, or None when
    they do: named by method and library, for `inference.decision`. torchao's weights are tensor subclasses that the
    model's own forward runs as they are (torchao builds them for `torch.compile` and graphs), so both loops run them:
    through the fused Llama step, unfused (`decode/fused_step.py`'s `torchao_weights`: separate products, no
    dequantized copies), or the model's own forward for other families. The pre-quantized checkpoints of
    quantization table's `EAGER_METHODS` (AWQ/GPTQ through gptqmodel, AutoRound, compressed-tensors, Transformers'
    fine-grained FP8) run the model's own forward: the engine picks its model step, eagerly, and logs why
    (`inference/engine/quantized.py`, `plan_quantized`), as it does for bitsandbytes 4-bit. bitsandbytes stays
    blocked here: its 4-bit layers reach the engine through `decide_serving`'s own path (`hwrun serve`), its 8-bit
    layers (LLM.int8) through none."""
    from .quantization_table import EAGER_METHODS, METHODS, method_name

    name = method_name(value)
    method = METHODS.get(name)
    library = method.library if method else "an unknown library"
    if library == "torchao" or name in EAGER_METHODS:
        return None
    kind = "Linear4bit/Linear8bitLt layers" if library == "bitsandbytes" else "quantized layers"
    return (f"{library} weights ({value}: {kind}): hwrun's graph loops run plain Linear weights and torchao's "
            "tensor-subclass weights, and have not been run on these layers' kernels (its fused step would need "
            "dequantized copies); Transformers' loop runs them as they are")


# ---- fp8-inc: FP8 on Gaudi through Intel Neural Compressor, from an already-measured config (issue 43) ----
#
# INC 3.x (neural-compressor-pt 3.10, read from its wheel): Intel's FP8 flow on Gaudi is two runs of the same script
# (docs.habana.ai, "Run Inference Using FP8"; INC docs/source/3x/PT_FP8Quant.md). A measurement run loads the model
# with a config whose `mode` is MEASURE, calls `prepare(model, FP8Config.from_json_file(path))`, runs calibration
# prompts and calls `finalize_calibration(model)`, which writes the statistics under `dump_stats_path`. The quantized
# run loads the model with a config whose `mode` is QUANTIZE (the same `dump_stats_path` and `observer`) and calls
# `convert(model, FP8Config.from_json_file(path))` (`neural_compressor/torch/quantization/quantize.py`), which
# patches the supported modules (Linear, Matmul, KVCache, ... per `allowlist`/`blocklist`) with FP8 ones. hwrun runs
# the second step only: the measurement is the user's.
#
# Which file the QUANTIZE step reads (`algorithms/fp8_quant/_quant_common/quant_config.py`, `Fp8cfg.parse`, and
# `_core/quantize.py` -> `_core/measure.py` `load_measurements`): `{dump_stats_path}_hooks_{observer}{worker}.npz`,
# where `worker` is "" in one process and `_{local_rank}_{world_size}` when a rank is known (torch.distributed, else
# the LOCAL_RANK / WORLD_SIZE variables; `prepare_quant/prepare_model.py` `get_local_rank`) and `seperate_measure_files`
# is not false. `dump_stats_path` is used as written, so a relative one is relative to the working directory. INC
# reads no file when `dynamic_quantization` is on or `scale_method` is one of the fixed-value methods (unit_scale,
# hw_aligned_single_scale: `_core/scale_methods/scale_method_config.py`); then hwrun asks for none either.
#
# The config path: hwrun follows INC's own convention (`prepare_quant/prepare_model.py` `prep_model`): the path given
# explicitly (`inc_config=` / `--inc-config`, INC's "recommended"), else the QUANT_CONFIG environment variable (INC's
# "legacy behavior", and what optimum-habana and vLLM's Gaudi plugin read).

#: The environment variable INC (and optimum-habana, vLLM on Gaudi) reads the FP8 config path from.
INC_CONFIG_ENV = "QUANT_CONFIG"
#: INC's defaults for the keys hwrun reads (FP8Config.__init__ in neural-compressor-pt 3.10).
INC_DEFAULT_DUMP_STATS_PATH = "./hqt_output/measure"
INC_DEFAULT_OBSERVER = "maxabs"
#: `scale_method` values whose scales are fixed (no measurement read in QUANTIZE mode).
INC_FIXED_SCALE_METHODS = frozenset({"unit_scale", "hw_aligned_single_scale"})
#: The attribute hwrun sets on a model it converted with INC (`quant_method` of `inference/engine/quantized.py` reads
#: it: INC's patched model has no Transformers quantizer).
INC_MARK = "_hwrun_quant_method"

INC_MEASURE_HOW = ("run INC's measurement first: the same model, a copy of the config with \"mode\": \"MEASURE\" "
                   "(same dump_stats_path and observer), `model = prepare(model, FP8Config.from_json_file(PATH))`, "
                   "a few calibration prompts through the model, then `finalize_calibration(model)` (from "
                   "neural_compressor.torch.quantization; docs.habana.ai 'Run Inference Using FP8')")


@dataclass(frozen=True)
class IncConfig:
    """An INC FP8 config hwrun checked before load: its `path`, where the path came from (`source`), its `mode`,
    `observer`, `dump_stats_path` and the measurement file the QUANTIZE step reads (`measure_file`; None when INC
    reads none: dynamic quantization or a fixed-scale method)."""

    path: str
    source: str
    mode: str
    observer: str
    dump_stats_path: str
    measure_file: str | None


def inc_config_path(inc_config: str | os.PathLike | None) -> tuple[str | None, str]:
    """(the INC config path, where it came from): the given one, else `$QUANT_CONFIG` (INC's convention), else None."""
    if inc_config is not None:
        return os.fspath(inc_config), "given (inc_config / --inc-config)"
    env = os.environ.get(INC_CONFIG_ENV)
    if env:
        return env, f"from ${INC_CONFIG_ENV}"
    return None, "none given"


def inc_measure_file(config: dict, env: dict | None = None) -> str | None:
    """The measurement file INC's QUANTIZE step reads for `config` (a parsed INC JSON), or None when it reads none.
    Mirrors `Fp8cfg.parse` of neural-compressor-pt 3.10 (see the comment above)."""
    env = os.environ if env is None else env
    scale_method = config.get("scale_method", "maxabs_hw")
    if config.get("dynamic_quantization") or (isinstance(scale_method, str)
                                              and scale_method.lower() in INC_FIXED_SCALE_METHODS):
        return None
    rank, world = env.get("LOCAL_RANK"), env.get("WORLD_SIZE")
    worker = ""
    if rank is not None and int(rank) >= 0 and config.get("seperate_measure_files", True):
        worker = f"_{int(rank)}_{int(world) if world is not None and int(world) >= 0 else None}"  # INC's str(None)
    dump = str(config.get("dump_stats_path", INC_DEFAULT_DUMP_STATS_PATH))
    return f"{dump}_hooks_{config.get('observer', INC_DEFAULT_OBSERVER)}{worker}.npz"


def check_inc_config(inc_config: str | os.PathLike | None) -> IncConfig:
    """Check the INC FP8 config before load: found (given, or $QUANT_CONFIG), readable JSON, `mode` QUANTIZE, and the
    measurement file its QUANTIZE step reads present. Raises QuantizationError naming the value and what to do."""
    import json

    path, source = inc_config_path(inc_config)
    if path is None:
        raise QuantizationError(
            f"quantization='fp8-inc' needs Intel Neural Compressor's FP8 config (a QUANTIZE-mode JSON whose "
            f"measurements exist): pass inc_config=PATH (--inc-config PATH) or set {INC_CONFIG_ENV}=PATH, as INC "
            f"does. No measurement yet: {INC_MEASURE_HOW}.")
    where = f"the INC config {path!r} ({source})"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise QuantizationError(f"quantization='fp8-inc': {where} cannot be read ({type(exc).__name__}: "
                                f"{exc.strerror or exc}); pass the path of the QUANTIZE-mode JSON of your INC "
                                "measurement.") from exc
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise QuantizationError(f"quantization='fp8-inc': {where} is not JSON ({exc}); pass INC's FP8 config "
                                "file (keys mode, observer, dump_stats_path, scale_method, ...).") from exc
    if not isinstance(config, dict):
        raise QuantizationError(f"quantization='fp8-inc': {where} holds a JSON {type(config).__name__}, not the "
                                "object of INC's FP8 config keys.")
    mode = str(config.get("mode", "AUTO"))
    if mode.upper() != "QUANTIZE":
        raise QuantizationError(
            f"quantization='fp8-inc': {where} has \"mode\": {mode!r}; hwrun loads an already-measured model, which "
            f"takes \"mode\": \"QUANTIZE\" (MEASURE writes measurements, AUTO leaves the choice to INC). If this is "
            f"your measurement config, {INC_MEASURE_HOW}; then pass the QUANTIZE config.")
    measure_file = inc_measure_file(config)
    if measure_file is not None and not Path(measure_file).is_file():
        raise QuantizationError(
            f"quantization='fp8-inc': {where} reads its measurements from {measure_file!r} "
            f"(dump_stats_path {config.get('dump_stats_path', INC_DEFAULT_DUMP_STATS_PATH)!r} + '_hooks_' + observer "
            f"+ '.npz', relative to the working directory {os.getcwd()!r}), which does not exist: {INC_MEASURE_HOW}.")
    return IncConfig(path, source, "QUANTIZE", str(config.get("observer", INC_DEFAULT_OBSERVER)),
                     str(config.get("dump_stats_path", INC_DEFAULT_DUMP_STATS_PATH)), measure_file)


def convert_with_inc(model: Any, plan: Any) -> Any:
    """After load: `convert(model, FP8Config.from_json_file(path))`, as INC documents for Gaudi (in place: INC's
    `convert` defaults to inplace=True and returns the model it patched), then marks the model (`INC_MARK`) so hwrun's
    engine runs it through its own forward, eagerly. Logged."""
    from neural_compressor.torch.quantization import FP8Config, convert

    path = plan.inc_config
    converted = convert(model, FP8Config.from_json_file(path))
    if converted is not None and converted is not model:  # pragma: no cover - INC 3.10 converts in place
        raise QuantizationError("Intel Neural Compressor's convert() returned a new model instead of converting in "
                                "place; hwrun cannot use it (its load returns the model it loaded).")
    setattr(model, INC_MARK, "fp8-inc")
    logger.info("fp8-inc: converted the model to FP8 with Intel Neural Compressor (convert(model, "
                "FP8Config.from_json_file(%r))); hwrun's loops run its patched layers through the model's own "
                "forward, eagerly", path)
    return model
