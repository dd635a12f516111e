"""Which quantization method runs on which device, as data: one row per hwenv platform kind, one cell per method,
each with yes/no, the reason and the sources it was read from (issue 43.1).

The columns are the methods of Transformers' quantization overview that hwrun plans, read against the libraries'
own code at the versions the registry serves (transformers 5.25, torchao 0.18, bitsandbytes 0.50, compressed-tensors
0.20, gptqmodel 7.7, auto-round 0.16, hqq 0.2.8, neural-compressor-pt 3.10) and Intel's documents for Gaudi. "yes" means hwrun lets the method
run on that device and says so in the plan; "no" is refused before anything loads, with the reason. A cell that
the overview marks green but hwrun has not run there says so in its reason (only CPU rows are run by hwrun's
tests; GPU rows are the sources' word). Rules finer than the kind (a CUDA compute capability, a Gaudi
generation, the dtype) are the cell's `check`.

`LORA_TRAINING` is the training column: whether `hwrun train` trains LoRA on a base quantized with the method (PEFT's
LoRA layers and torch's autograd decide, on every device alike); `hwrun.training.kbit` refuses a "no" before load.

`hwrun.model.quantization` decides with this table; the README's table is generated from it (`markdown()`), and a
test checks that they agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import hwenv

#: Where each claim was read. Keys are cited by the cells.
SOURCES: dict[str, str] = {
    "overview": "Transformers, docs/source/en/quantization/overview.md (the table with the 'Intel GPU' column, "
                "v5.8+; https://huggingface.co/docs/transformers/quantization/overview)",
    "tf": "transformers 5.25 `quantizers/quantizer_*.py` (`validate_environment`, `update_dtype`) and "
          "`utils/quantization_config.py`",
    "torchao": "torchao 0.18: `quantization/quantize_/workflows/int4/` (Int4TilePackedTo4dTensor: tinygemm "
               "`_weight_int4pack_mm`, CUDA compute capability >= 8.0, bfloat16; Int4PlainInt32Tensor: XPU oneDNN "
               "and NPU only), `prototype/quantization/int4/int4_opaque_tensor.py` (CPU: "
               "`_weight_int4pack_mm_for_cpu`, group size 32/64/128), `quantization/quant_api.py` (Int8Tensor: "
               "plain torch ops), `float8/inference.py` `_check_hardware_support` (CUDA >= 8.9, MI300/MI350 or XPU)",
    "bnb": "bitsandbytes 0.50: `supported_torch_devices = {cpu, cuda, xpu, hpu, npu, mps}`, `backends/` per "
           "device, installation guide (ROCm wheels, Intel XPU, Gaudi)",
    "bnb-cpu": "bitsandbytes 0.50 `nn/modules.py` `Linear4bit.forward` and `functional._convert_weight_packed_for_cpu` "
               "(AVX512-BF16 repacking; issue 43.4), `backends/cpu/ops.py` (`get_kernel` of the Hub kernel at import)",
    "G10": "FACTS.md G10 (Transformers' Gaudi guide): bitsandbytes 4/8-bit on Gaudi 2 and Gaudi 3",
    "X14": "FACTS.md X14: the Intel GPU column of Transformers' quantization overview",
    "gptqmodel": "overview notes 3/4: GPTQModel on CPU via torch (all bits) / IPEX (4-bit), on Intel GPU via IPEX "
                 "4-bit only; transformers 5.25 loads AWQ through gptqmodel (`quantizer_awq.py`)",
    "inc-fp8": "Intel Neural Compressor `docs/source/3x/PT_FP8Quant.md` (github.com/intel/neural-compressor; keys "
               "fp8_config, hp_dtype, observer, allowlist, blocklist, mode MEASURE/QUANTIZE/AUTO, dump_stats_path, "
               "scale_method, measure_exclude) and its published page (https://intel.github.io/neural-compressor/"
               "latest/docs/source/3x/PT_FP8Quant.html: support matrix HPU FP8 mode, CPU FP8 QDQ mode only); "
               "docs.habana.ai 'Run Inference Using FP8' (https://docs.habana.ai/en/latest/PyTorch/"
               "Inference_on_PyTorch/Inference_Using_FP8.html: Gaudi 2/3, INC run in measurement mode, then in "
               "quantization mode); vLLM's INC page (https://docs.vllm.ai/en/v0.10.0/features/quantization/inc.html: "
               "QUANT_CONFIG names the config; measurements are needed before a quantized run)",
    "inc-api": "neural-compressor-pt 3.10 (read from its wheel): `neural_compressor/torch/quantization/quantize.py` "
               "(`prepare(model, quant_config, inplace=True, example_inputs=None)`, `convert(model, quant_config=None, "
               "inplace=True, **kwargs)`, `finalize_calibration(model)`), `common/base_config.py` "
               "(`FP8Config.from_json_file(filename)`), `algorithms/fp8_quant/prepare_quant/prepare_model.py` (an "
               "explicit config path, else $QUANT_CONFIG); https://intel.github.io/neural-compressor/latest/autoapi/"
               "neural_compressor/torch/quantization/quantize/index.html",
    "inc-files": "neural-compressor-pt 3.10 `algorithms/fp8_quant/_quant_common/quant_config.py` (`Fp8cfg.parse`: mode "
                 "MEASURE/QUANTIZE, measure_file = dump_stats_path + '_hooks_' + observer [+ '_rank_worldsize']) and "
                 "`_core/measure.py` (`load_measurements` reads measure_file + '.npz'; none for dynamic_quantization "
                 "or the fixed-value scale methods unit_scale / hw_aligned_single_scale)",
    "hwenv-gen": "hwenv's Gaudi generation table (`hwenv.generation_of`: bnb_4bit, bnb_8bit, fp8)",
    "peft-torchao": "peft 0.21.2 `tuners/lora/torchao.py`: `dispatch_torchao` wraps every layer whose weight is a "
                    "torchao `TorchAOBaseTensor` in `TorchaoLoraLinear`, whose `_check_dtype_supported` refuses "
                    "torchao's `Int4Tensor` only ('only supports int8 weights for now'; its TODO: 'Not required once "
                    "int4_weight_only is properly supported by torchao')",
    "torch-autograd": "torch 2.15: `aten::_weight_int4pack_mm`, `_weight_int4pack_mm_for_cpu`, "
                      "`_weight_int4pack_mm_with_scales_and_zeros` and `_scaled_mm` have no derivative (backward "
                      "raises 'derivative for aten::... is not implemented'); torchao 0.18's Int8Tensor with "
                      "`act_quant_kwargs` rounds the input to int8 inside the matmul, so its output does not require "
                      "grad (all checked by hwrun's tests on the CPU, the GPU ops on meta/fake tensors)",
    "peft-layers": "peft 0.21.2 `tuners/lora/`: LoRA layers for bitsandbytes (bnb.py), GPTQ (gptq.py), AWQ (awq.py), "
                   "HQQ (hqq.py), Intel Neural Compressor (inc.py) and torchao (torchao.py); none for AutoRound, "
                   "compressed-tensors or Transformers' fine-grained FP8",
}


@dataclass(frozen=True)
class Method:
    """One quantization method hwrun plans.

    `name`: the `--quantize` spelling. `library`/`package`: what runs it (the import name is checked before load).
    `extra`: the hwrun extra that installs it (`pip install 'hwrun[EXTRA]'`). `quant_methods`: the
    `quantization_config.quant_method` values of a checkpoint this method loads. `on_load`: hwrun quantizes an
    unquantized checkpoint on load (False: pre-quantized checkpoints only). `bits`: weight bits, for the size estimate.
    """

    name: str
    library: str
    package: str
    extra: str
    quant_methods: tuple[str, ...]
    on_load: bool
    bits: int
    summary: str


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("int4-weight-only", "torchao", "torchao", "torchao", ("torchao",), True, 4,
           "int4 weights, bf16/fp32 activations (A16W4), group-wise"),
    Method("int8-weight-only", "torchao", "torchao", "torchao", ("torchao",), True, 8,
           "int8 per-channel weights, activations unquantized (A16W8)"),
    Method("int8-dynamic", "torchao", "torchao", "torchao", ("torchao",), True, 8,
           "int8 weights and per-token dynamic int8 activations (A8W8)"),
    Method("float8", "torchao", "torchao", "torchao", ("torchao",), True, 8,
           "float8 weights and dynamic float8 activations, per row"),
    Method("bnb-4bit", "bitsandbytes", "bitsandbytes", "quant", ("bitsandbytes",), True, 4,
           "NF4 with double quantization (`--quantization 4bit`)"),
    Method("bnb-8bit", "bitsandbytes", "bitsandbytes", "quant", ("bitsandbytes",), True, 8,
           "LLM.int8() (`--quantization 8bit`)"),
    Method("awq", "gptqmodel", "gptqmodel", "gptq", ("awq",), False, 4, "pre-quantized AWQ checkpoints"),
    Method("gptq", "gptqmodel", "gptqmodel", "gptq", ("gptq",), False, 4, "pre-quantized GPTQ checkpoints"),
    Method("auto-round", "auto-round", "auto_round", "autoround", ("auto-round", "intel/auto-round"), False, 4,
           "pre-quantized AutoRound checkpoints"),
    Method("compressed-tensors", "compressed-tensors", "compressed_tensors", "compressed-tensors",
           ("compressed-tensors",), False, 8, "pre-quantized llm-compressor checkpoints"),
    Method("hqq", "hqq", "hqq", "hqq", ("hqq",), True, 4, "Half-Quadratic Quantization on load"),
    Method("fp8", "transformers", "transformers", "", ("fp8",), False, 8,
           "pre-quantized fine-grained FP8 checkpoints (DeepSeek/Qwen style, W8A8 per block)"),
    Method("fp8-inc", "neural-compressor", "neural_compressor", "inc", (), True, 8,
           "FP8 on Gaudi through Intel Neural Compressor: convert() with an already-measured QUANTIZE config "
           "(inc_config / --inc-config, else $QUANT_CONFIG)"),
)}

#: Pre-quantized methods whose layers hwrun's loops run through the model's own forward, eagerly (their kernels are
#: not captured in hwrun's graphs or compiled steps): the one list `model.quantization.decode_blocker` and
#: `inference/engine/quantized.py` both read.
#: fp8-inc: the model INC's `convert` patched (its FP8 modules replace Linear/Matmul/KVCache...), marked by hwrun after
#: load (`model.quantization.INC_MARK`) since no Transformers quantizer loaded it.
EAGER_METHODS = ("awq", "gptq", "auto-round", "compressed-tensors", "fp8", "fp8-inc")

#: `--quantization 4bit|8bit` are bitsandbytes; the plan keeps these values (training and the engines read them).
PLAN_VALUE = {"bnb-4bit": "4bit", "bnb-8bit": "8bit"}
ALIASES = {value: name for name, value in PLAN_VALUE.items()}


def method_name(value: str) -> str:
    """The table's name of a plan value or a `--quantize` spelling ("4bit" -> "bnb-4bit")."""
    return ALIASES.get(value, value)


def plan_value(name: str) -> str:
    """The plan's `quantization` value for a method ("bnb-4bit" -> "4bit"; others keep their name)."""
    return PLAN_VALUE.get(name, name)


# ---- checks finer than the kind ------------------------------------------------------------------------


def _capability_at_least(minimum: tuple[int, int], what: str) -> Callable[[hwenv.Accelerator, str], str | None]:
    def check(accel: hwenv.Accelerator, dtype: str) -> str | None:
        if accel.capability is None or tuple(accel.capability) >= minimum:
            return None
        return (f"{what} needs compute capability >= {minimum[0]}.{minimum[1]}; this GPU has "
                f"{accel.capability[0]}.{accel.capability[1]}")
    return check


def _int4_cuda(accel: hwenv.Accelerator, dtype: str) -> str | None:
    if dtype != "bfloat16":
        return f"torchao's tinygemm int4 layout takes bfloat16 weights only, not {dtype} (pass dtype='bfloat16')"
    return _capability_at_least((8, 0), "torchao's tinygemm int4 kernel")(accel, dtype)


def _inc_gaudi(accel: hwenv.Accelerator, dtype: str) -> str | None:
    """INC's FP8 on Gaudi 2 and Gaudi 3 only (hwenv's generation table, `fp8`); a name hwenv does not know gets the
    newest known generation's rules."""
    import hwenv

    for name in dict.fromkeys(accel.names):
        generation = hwenv.generation_of(name)
        if not generation.fp8:
            return f"{generation.reason()}, and Intel documents FP8 through INC on Gaudi 2 and Gaudi 3 only"
    return None


def _int4_xpu(accel: hwenv.Accelerator, dtype: str) -> str | None:
    if dtype not in ("bfloat16", "float16"):
        return f"torchao's XPU int4 layout (oneDNN) takes bfloat16 or float16 weights, not {dtype}"
    return None


@dataclass(frozen=True)
class Cell:
    """One device x method: does hwrun run it (`runs`), why, from which `sources` (keys of SOURCES), and an optional
    finer `check(accel, dtype) -> why refused or None`. `tested`: run by hwrun's own tests on this device."""

    runs: bool
    reason: str
    sources: tuple[str, ...]
    check: Callable[[hwenv.Accelerator, str], str | None] | None = None
    tested: bool = False


def _yes(reason, *sources, check=None, tested=False):
    return Cell(True, reason, sources, check, tested)


def _no(reason, *sources):
    return Cell(False, reason, sources)


_NOT_ON_MPS = "hwrun plans Apple GPUs like a CPU without quantization"
#: transformers 5.22.2 to 5.25: `HqqHfQuantizer` has no `get_quantize_ops`, so quantizing on load raises
#: NotImplementedError ("hqq is not available yet and will be supported soon", `quantizers/base.py`); seen on the CPU
#: with hqq 0.2.8 (2026-12-06), whatever the overview says.
_HQQ_NOT_IN_TF5 = ("Transformers 5.22-5.25 cannot quantize with HQQ on load (HqqHfQuantizer has no get_quantize_ops: "
                   "NotImplementedError 'not available yet')")
#: compressed-tensors 0.20 under Transformers 5.25 (`quantizer_compressed_tensors.py`, `ModelCompressor.add_decompress_hook`):
#: a quantized checkpoint loads compressed and a forward pre-hook decompresses it in place at the first forward (seen on
#: the CPU with an int8 checkpoint, 2026-12-07); Transformers' row-wise FP8 kernels are opt-in (`use_optimized_inference`,
#: default False), which hwrun does not pass.
CT_DECOMPRESSES = ("compressed-tensors loads the weights compressed and its own hook decompresses them in place to the "
                   "model's dtype at the first forward (no compressed int kernels in Transformers 5.25; its FP8 "
                   "kernels are opt-in and hwrun does not opt in), so decoding runs dense weights and memory grows to "
                   "the unquantized size")
#: A check run through hwrun (plan, load, generate) on a lent H100, not a test: the layouts loaded and generated.
_RAN_H100 = "; loaded and generated through hwrun on an H100 (torch 2.11, torchao 0.18, 2026-12-06)"
_NO_GAUDI_COLUMN = "the overview has no Gaudi column and the library has no HPU backend"
_INC_ONLY_GAUDI = "INC's FP8 mode runs on Gaudi only (CPU: QDQ simulation)"
_INC_ON_GAUDI = ("Intel documents FP8 on Gaudi 2/3 through INC as a measurement run, then a quantized run; hwrun does "
                 "the second: the model loads in the planned dtype, then convert(model, FP8Config.from_json_file(path)) "
                 "with a QUANTIZE-mode config whose measurements (dump_stats_path) exist, checked before load; the "
                 "measurement run is the user's (prepare + finalize_calibration). Run by hwrun's tests on the CPU "
                 "with a fake Gaudi and a fake INC whose signatures a test holds to neural-compressor-pt 3.10's, "
                 "not on a Gaudi")

#: kind -> method -> Cell. Every registered hwenv kind has a row (a test checks it); a kind with no row (a plug-in)
#: gets `NO_ROW` for every method.
QUANTIZATION_TABLE: dict[str, dict[str, Cell]] = {
    "cuda": {
        "int4-weight-only": _yes("torchao Int4WeightOnlyConfig, tile_packed_to_4d layout (tinygemm); bfloat16, "
                                 "compute capability >= 8.0" + _RAN_H100, "overview", "torchao", check=_int4_cuda),
        "int8-weight-only": _yes("torchao Int8WeightOnlyConfig (Int8Tensor, torch ops)" + _RAN_H100, "overview",
                                 "torchao"),
        "int8-dynamic": _yes("torchao Int8DynamicActivationInt8WeightConfig (torch._int_mm)" + _RAN_H100, "overview",
                             "torchao"),
        "float8": _yes("torchao Float8DynamicActivationFloat8WeightConfig, per row; compute capability >= 8.9" + _RAN_H100,
                       "overview", "torchao", check=_capability_at_least((8, 9), "torchao's float8")),
        "bnb-4bit": _yes("bitsandbytes' CUDA backend", "overview", "bnb"),
        "bnb-8bit": _yes("bitsandbytes' CUDA backend", "overview", "bnb"),
        "awq": _yes("gptqmodel's AWQ kernels (Transformers casts bf16 to fp16 on CUDA)", "overview", "tf",
                    "gptqmodel"),
        "gptq": _yes("gptqmodel (with optimum)", "overview", "tf", "gptqmodel"),
        "auto-round": _yes("auto-round's CUDA backends", "overview", "tf"),
        "compressed-tensors": _yes(CT_DECOMPRESSES, "overview", "tf"),
        "hqq": _no(f"{_HQQ_NOT_IN_TF5}; the overview marks CUDA green", "tf", "overview"),
        "fp8": _yes("Transformers' fine-grained FP8 kernels; below compute capability 8.9 Transformers would "
                    "dequantize to bf16 silently, so hwrun refuses there", "overview", "tf",
                    check=_capability_at_least((8, 9), "fine-grained FP8 (else Transformers dequantizes silently)")),
        "fp8-inc": _no(_INC_ONLY_GAUDI, "inc-fp8"),
    },
    "rocm": {
        "int4-weight-only": _no("the overview marks torchao red on ROCm; torchao's int4 layouts are CUDA "
                                "(tinygemm), XPU and CPU ones", "overview", "torchao"),
        "int8-weight-only": _no("the overview marks torchao red on ROCm; not run by hwrun there", "overview"),
        "int8-dynamic": _no("the overview marks torchao red on ROCm; not run by hwrun there", "overview"),
        "float8": _no("the overview marks torchao red on ROCm (torchao's own check accepts MI300/MI350; not run by "
                      "hwrun there)", "overview", "torchao"),
        "bnb-4bit": _yes("bitsandbytes' ROCm wheels (0.50 installation guide)", "overview", "bnb"),
        "bnb-8bit": _yes("bitsandbytes' ROCm wheels (0.50 installation guide)", "overview", "bnb"),
        "awq": _yes("gptqmodel's ROCm kernels", "overview", "tf"),
        "gptq": _yes("gptqmodel's ROCm kernels", "overview", "tf"),
        "auto-round": _no("the overview marks AutoRound red on ROCm", "overview"),
        "compressed-tensors": _yes(CT_DECOMPRESSES, "overview", "tf"),
        "hqq": _no(f"the overview marks HQQ red on ROCm, and {_HQQ_NOT_IN_TF5}", "overview", "tf"),
        "fp8": _no("the overview marks fine-grained FP8 red on ROCm", "overview"),
        "fp8-inc": _no(_INC_ONLY_GAUDI, "inc-fp8"),
    },
    "xpu": {
        "int4-weight-only": _yes("torchao Int4WeightOnlyConfig, plain_int32 layout (oneDNN); bfloat16 or float16",
                                 "overview", "torchao", "X14", check=_int4_xpu),
        "int8-weight-only": _yes("torchao Int8WeightOnlyConfig (Int8Tensor, torch ops)", "overview", "torchao", "X14"),
        "int8-dynamic": _yes("torchao Int8DynamicActivationInt8WeightConfig (torch._int_mm on XPU)", "overview",
                             "torchao", "X14"),
        "float8": _yes("torchao's float8 check accepts XPU", "overview", "torchao", "X14"),
        "bnb-4bit": _yes("bitsandbytes' XPU backend (overview: yellow, in progress)", "overview", "bnb", "X14"),
        "bnb-8bit": _yes("bitsandbytes' XPU backend (overview: yellow, in progress)", "overview", "bnb", "X14"),
        "awq": _yes("gptqmodel's Intel XPU kernels (Transformers casts bf16 to fp16 on XPU)", "overview", "tf",
                    "gptqmodel", "X14"),
        "gptq": _yes("gptqmodel via IPEX, 4-bit checkpoints only (overview note 4)", "overview", "gptqmodel", "X14"),
        "auto-round": _yes("auto-round's XPU backends", "overview", "tf", "X14"),
        "compressed-tensors": _no("the overview marks compressed-tensors red on Intel GPU", "overview", "X14"),
        "hqq": _no(f"{_HQQ_NOT_IN_TF5}; the overview marks Intel GPU green", "tf", "overview", "X14"),
        "fp8": _yes("Transformers' fine-grained FP8 runs on XPU (`quantizer_finegrained_fp8.py`)", "overview", "tf",
                    "X14"),
        "fp8-inc": _no(_INC_ONLY_GAUDI, "inc-fp8"),
    },
    "hpu": {
        "int4-weight-only": _no(f"torchao: {_NO_GAUDI_COLUMN}", "overview", "torchao"),
        "int8-weight-only": _no(f"torchao: {_NO_GAUDI_COLUMN}", "overview", "torchao"),
        "int8-dynamic": _no(f"torchao: {_NO_GAUDI_COLUMN}", "overview", "torchao"),
        "float8": _no(f"torchao: {_NO_GAUDI_COLUMN}; FP8 on Gaudi is INC's (fp8-inc)", "overview", "torchao"),
        "bnb-4bit": _yes("bitsandbytes' HPU backend, Gaudi 2 and Gaudi 3 (G10)", "G10", "bnb", "hwenv-gen"),
        "bnb-8bit": _yes("bitsandbytes' HPU backend, Gaudi 2 and Gaudi 3 (G10)", "G10", "bnb", "hwenv-gen"),
        "awq": _no(f"gptqmodel: {_NO_GAUDI_COLUMN}", "overview"),
        "gptq": _no(f"gptqmodel: {_NO_GAUDI_COLUMN}", "overview"),
        "auto-round": _no("Intel ships a separate auto-round-hpu build; hwrun has not wired or run it", "overview"),
        "compressed-tensors": _no(f"compressed-tensors: {_NO_GAUDI_COLUMN}", "overview"),
        "hqq": _no(f"hqq: {_NO_GAUDI_COLUMN}", "overview"),
        "fp8": _no("Transformers' fine-grained FP8 kernels need a CUDA GPU or XPU (elsewhere it dequantizes "
                   "silently); FP8 on Gaudi is INC's (fp8-inc)", "tf"),
        "fp8-inc": _yes(_INC_ON_GAUDI, "inc-fp8", "inc-api", "inc-files", "hwenv-gen", check=_inc_gaudi),
    },
    "mps": {name: _no(_NOT_ON_MPS, "overview") for name in METHODS},
    "cpu": {
        "int4-weight-only": _yes("torchao PrototypeInt4WeightOnlyConfig (Int4OpaqueTensor, "
                                 "_weight_int4pack_mm_for_cpu), group size 32/64/128", "overview", "torchao",
                                 tested=True),
        "int8-weight-only": _yes("torchao Int8WeightOnlyConfig (Int8Tensor, torch ops)", "overview", "torchao",
                                 tested=True),
        "int8-dynamic": _yes("torchao Int8DynamicActivationInt8WeightConfig (torch._int_mm)", "overview", "torchao",
                             tested=True),
        "float8": _no("torchao's float8 check asks for CUDA >= 8.9, MI300/MI350 or XPU", "torchao"),
        "bnb-4bit": _yes("bitsandbytes' CPU backend (slow; layers its AVX512-BF16 repacking cannot take stay "
                         "on the generic path; on such CPUs importing bitsandbytes fetches "
                         "kernels-community/quantization-bitsandbytes from the Hub and, offline, logs that it "
                         "uses its own kernel)", "overview", "bnb", "bnb-cpu", tested=True),
        "bnb-8bit": _yes("bitsandbytes' CPU backend (slow)", "overview", "bnb", tested=True),
        "awq": _yes("gptqmodel's torch CPU kernels (gptqmodel 7.7 picked TorchCpuAvx512AwqLinear on an AVX512 CPU)",
                    "overview", "gptqmodel", tested=True),
        "gptq": _yes("gptqmodel's torch CPU kernels, all bits (IPEX: 4-bit); gptqmodel 7.7 picked TorchCpuAvx512Linear "
                     "on an AVX512 CPU and compiles its CPU extension at the first load (about a minute on 2 cores, "
                     "cached after)", "overview", "gptqmodel", tested=True),
        "auto-round": _yes("auto-round's CPU backends: its torch QuantLinear (packed int4) without auto-round-lib; "
                           "auto-round 0.16 casts the model to float16 on load whatever the planned dtype "
                           "(convert_model.py: 'Forced model to torch.float16'; hwrun warns)", "overview", "tf",
                           tested=True),
        "compressed-tensors": _yes(CT_DECOMPRESSES + " (FP8 schemes: no FP8 kernels on the CPU either)",
                                   "overview", "tf", tested=True),
        "hqq": _no(f"{_HQQ_NOT_IN_TF5}; the overview marks CPU green (tried here: it raised)", "tf", "overview"),
        "fp8": _no("without a GPU or XPU Transformers dequantizes FP8 checkpoints to bf16 silently "
                   "(`quantizer_finegrained_fp8.validate_environment`); hwrun refuses rather than load a "
                   "dequantized copy", "tf"),
        "fp8-inc": _no("INC runs FP8 on CPU only as QDQ simulation (no FP8 kernels)", "inc-fp8"),
    },
}

NO_ROW = Cell(False, "hwrun has no quantization row for this kind", ())


# ---- training: LoRA on a quantized base (`hwrun train --lora --quantize METHOD`, `--qlora`) -------------------


@dataclass(frozen=True)
class Training:
    """Whether `hwrun train` trains LoRA on a base quantized with a method (the same on every device: PEFT's LoRA
    layer and torch's autograd decide), why, from which `sources`, and what to use `instead` where it does not.
    `tested`: run by hwrun's own tests (on the CPU)."""

    trains: bool
    reason: str
    sources: tuple[str, ...]
    instead: str = ""
    tested: bool = False


_TRAIN_INSTEAD = ("--quantize int8-weight-only (torchao int8 weights, LoRA on top), --qlora (bitsandbytes NF4), or "
                  "--lora on the unquantized model")
_NOT_TRAINED = "hwrun has not run LoRA training on {what}; refused rather than trained untried"

#: method -> Training. Every method of METHODS has a row (a test checks it); `hwrun.training.kbit` refuses a "no"
#: before the model loads, with the reason and `instead`.
LORA_TRAINING: dict[str, Training] = {
    "int4-weight-only": Training(
        False, "PEFT's own check (peft 0.21.2 tuners/lora/torchao.py, TorchaoLoraLinear._check_dtype_supported: "
        "'only supports int8 weights for now') refuses torchao's Int4Tensor; the int4 layouts hwrun loads (Int4OpaqueTensor on the CPU, "
        "Int4TilePackedTo4dTensor on CUDA, Int4PlainInt32Tensor on XPU) pass that check, but their int4 matmuls have "
        "no derivative in torch, so backward fails ('derivative for aten::_weight_int4pack_mm_for_cpu is not "
        "implemented') before any LoRA weight below the first int4 layer gets a gradient",
        ("peft-torchao", "torch-autograd"), "--qlora (bitsandbytes NF4, also 4-bit weights) or --quantize "
        "int8-weight-only"),
    "int8-weight-only": Training(
        True, "PEFT's TorchaoLoraLinear over torchao's Int8Tensor; the weight-only int8 matmul passes the gradient to "
        "its input (equal to the dequantized weight's), so every LoRA layer trains; merging goes through an "
        "unquantized base, as after QLoRA", ("peft-torchao",), tested=True),
    "int8-dynamic": Training(
        False, "PEFT wraps it (TorchaoLoraLinear), but torchao's Int8Tensor with dynamic activation quantization "
        "rounds each input to int8 inside the matmul, so autograd stops there: no gradient flows through the base "
        "layers, and LoRA layers before them train on nothing (with PEFT's Llama targets q_proj/v_proj: none train)",
        ("peft-torchao", "torch-autograd"), "--quantize int8-weight-only (the same int8 weights, activations left "
        "unquantized) or --qlora"),
    "float8": Training(
        False, "PEFT wraps torchao's Float8Tensor (TorchaoLoraLinear), but its dynamic float8 matmul (torch._scaled_mm) "
        "has no derivative, so backward fails below the first float8 layer (not run by hwrun: float8 needs CUDA >= "
        "8.9 or XPU)", ("peft-torchao", "torch-autograd"), _TRAIN_INSTEAD),
    "bnb-4bit": Training(
        True, "QLoRA (--qlora): PEFT's bitsandbytes Linear4bit LoRA layer; hwrun freezes the base and keeps its "
        "unquantized weights in the plan's dtype (training/kbit.py)", ("peft-layers", "bnb"), tested=True),
    "bnb-8bit": Training(
        False, "hwrun trains LoRA on 4-bit bitsandbytes bases only (QLoRA); PEFT has an 8-bit layer, but hwrun has "
        "not wired or run LoRA on LLM.int8() weights", ("peft-layers",), "--qlora (4-bit NF4)"),
    "awq": Training(False, _NOT_TRAINED.format(what="AWQ weights (PEFT has a layer: awq.py)"), ("peft-layers",),
                    _TRAIN_INSTEAD),
    "gptq": Training(False, _NOT_TRAINED.format(what="GPTQ weights (PEFT has a layer: gptq.py)"), ("peft-layers",),
                     _TRAIN_INSTEAD),
    "auto-round": Training(False, _NOT_TRAINED.format(what="AutoRound weights (PEFT has no AutoRound layer)"),
                           ("peft-layers",), _TRAIN_INSTEAD),
    "compressed-tensors": Training(
        False, _NOT_TRAINED.format(what="compressed-tensors weights (PEFT has no compressed-tensors layer)"),
        ("peft-layers",), _TRAIN_INSTEAD),
    "hqq": Training(False, f"HQQ does not load in hwrun ({_HQQ_NOT_IN_TF5}); PEFT has a layer (hqq.py)",
                    ("peft-layers", "tf"), _TRAIN_INSTEAD),
    "fp8": Training(False, _NOT_TRAINED.format(what="fine-grained FP8 checkpoints (PEFT has no layer for "
                                                    "Transformers' FP8Linear)"), ("peft-layers",), _TRAIN_INSTEAD),
    "fp8-inc": Training(False, _NOT_TRAINED.format(what="INC FP8 models (PEFT has an INC layer: inc.py)"),
                        ("peft-layers", "inc-fp8"), "--qlora on Gaudi 2/3, or --lora on the unquantized model"),
}


def lora_training(method: str) -> Training:
    """The training row of a method (a table name or a plan value: "4bit" -> "bnb-4bit")."""
    return LORA_TRAINING[method_name(method)]


def cell(kind: str, method: str) -> Cell:
    """The table's cell for `kind` x `method` (`NO_ROW` for a kind with no row)."""
    from .. import devices

    return devices.row(QUANTIZATION_TABLE, kind, {}).get(method, NO_ROW)


def markdown(kinds: tuple[str, ...] = ("cuda", "rocm", "xpu", "hpu", "cpu", "mps")) -> str:
    """The README's table: one line per method, one column per kind ("yes"/"no", "(tested)" where hwrun's tests ran
    it), whether `hwrun train` trains LoRA on such a base, then the sources' keys."""
    header = "| method | library | " + " | ".join(kinds) + " | train --lora | sources |"
    lines = [header, "|" + "---|" * (len(kinds) + 4)]
    for name, method in METHODS.items():
        cells = []
        sources: dict[str, None] = {}
        for kind in kinds:
            c = QUANTIZATION_TABLE[kind][name]
            cells.append(("yes" if c.runs else "no") + (" (tested)" if c.tested else ""))
            sources.update(dict.fromkeys(c.sources))
        runs_somewhere = any(QUANTIZATION_TABLE[kind][name].runs for kind in kinds)
        on = ("on load" if method.on_load else "pre-quantized") if runs_somewhere else "not in hwrun yet"
        training = LORA_TRAINING[name]
        sources.update(dict.fromkeys(training.sources))
        trains = ("yes" if training.trains else "no") + (" (tested)" if training.tested else "")
        lines.append(f"| `{name}` ({on}) | {method.library} | " + " | ".join(cells) + f" | {trains} | "
                     f"{', '.join(sources)} |")
    return "\n".join(lines)


#: Kinds the README's reason list leaves out (MPS: no method of the overview names it).
REASONS_SKIPPED = frozenset({"mps"})


def reasons_markdown(kinds: tuple[str, ...] = ("cuda", "rocm", "xpu", "hpu", "cpu", "mps")) -> str:
    """Each cell's reason, per method (the README's list under the table)."""
    out = []
    for name in METHODS:
        parts = [f"{kind}: {'yes' if (c := QUANTIZATION_TABLE[kind][name]).runs else 'no'}, {c.reason}"
                 for kind in kinds if kind not in REASONS_SKIPPED]
        training = LORA_TRAINING[name]
        parts.append(f"train --lora: {'yes' if training.trains else 'no'}, {training.reason}"
                     + (f" (instead: {training.instead})" if training.instead else ""))
        out.append(f"- `{name}`: " + "; ".join(parts) + ".")
    return "\n".join(out)


README_START = "<!-- quantization-table: generated by hwrun.model.quantization_table.readme_block(); do not edit -->"
README_END = "<!-- quantization-table: end -->"


def readme_block() -> str:
    """The generated part of the README's quantization section: the table, each cell's reason, and the sources."""
    sources = "\n".join(f"- **{key}**: {text}" for key, text in SOURCES.items())
    return (f"{README_START}\n{markdown()}\n\nWhy, per method and device (mps: {_NOT_ON_MPS}):\n\n{reasons_markdown()}\n\n"
            f"Sources:\n\n{sources}\n{README_END}")


def write_readme(path: str) -> bool:
    """Replace the generated block in the README at `path`; returns whether it changed."""
    from pathlib import Path

    readme = Path(path)
    text = readme.read_text()
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    new = text[:start] + readme_block() + text[end:]
    if new != text:
        readme.write_text(new)
    return new != text
