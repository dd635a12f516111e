"""The quantization table per device (issue 43.1): data, README agreement, and the plan's yes/no with the reason,
refused before load; XPU/HPU/CUDA decisions with given accelerators (hwenv.Accelerator) and hwenv.testing's fakes."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import hwenv
import hwrun
import pytest
from hwrun import devices
from hwrun.errors import QuantizationError
from hwrun.model import quantization_table as qt
from hwrun.model.quantization import BITSANDBYTES, checkpoint_quantization, int4_group_size
from hwrun.testing import build_tiny_model

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
README = Path(__file__).resolve().parents[1] / "README.md"
GiB = 2**30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-quant-table")))


def _with_quantization_config(tiny: str, folder: Path, quantization_config: dict) -> str:
    """A copy of `tiny` whose config.json says it is pre-quantized (the plan reads config.json only)."""
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_every_registered_kind_has_a_row_with_every_method_and_cited_sources():
    for kind in devices.kinds():
        assert kind in qt.QUANTIZATION_TABLE, f"no quantization row for {kind}"
        assert set(qt.QUANTIZATION_TABLE[kind]) == set(qt.METHODS)
    for row in qt.QUANTIZATION_TABLE.values():
        for cell in row.values():
            assert cell.reason and set(cell.sources) <= set(qt.SOURCES)
            assert not cell.tested or cell.runs


def test_the_bitsandbytes_cells_agree_with_the_bitsandbytes_table():
    for kind, support in BITSANDBYTES.items():
        assert qt.QUANTIZATION_TABLE[kind]["bnb-4bit"].runs == support.supported
        assert qt.QUANTIZATION_TABLE[kind]["bnb-8bit"].runs == support.supported


def test_the_readme_table_is_generated_from_the_data():
    text = README.read_text()
    start, end = text.index(qt.README_START), text.index(qt.README_END) + len(qt.README_END)
    assert text[start:end] == qt.readme_block(), "run hwrun.model.quantization_table.write_readme(README)"
    assert "| `int4-weight-only` (on load) | torchao | yes | no | yes | no | yes (tested) | no |" in text


def test_the_xpu_column_follows_the_overview(tiny):
    """X14: which methods run on XPU is the overview's Intel GPU column."""
    xpu = qt.QUANTIZATION_TABLE["xpu"]
    assert all(xpu[m].runs for m in ("int4-weight-only", "int8-weight-only", "bnb-4bit", "awq", "gptq", "auto-round",
                                     "fp8"))
    assert not xpu["compressed-tensors"].runs and "red on Intel GPU" in xpu["compressed-tensors"].reason
    assert not xpu["hqq"].runs and "Intel GPU green" in xpu["hqq"].reason  # green there, but Transformers 5 cannot


@needs_torchao
def test_cpu_plans_torchao_methods_with_the_reason(tiny):
    for method in ("int4-weight-only", "int8-weight-only", "int8-dynamic"):
        plan = hwrun.plan(tiny, device="cpu", quantization=method)
        assert plan.quantization == method and "cpu runs it" in plan.reasons["quantization"]
    four = hwrun.plan(tiny, device="cpu", quantization="int4-weight-only")
    assert "group size 64" in four.reasons["quantization"]  # hidden 64, intermediate 128
    assert four.weight_bytes < hwrun.plan(tiny, device="cpu", quantization="int8-weight-only").weight_bytes


def test_a_method_the_device_cannot_run_is_refused_with_reason_sources_and_where_it_runs(tiny):
    with pytest.raises(QuantizationError) as info:
        hwrun.plan(tiny, device="cpu", quantization="float8")
    message = str(info.value)
    assert "quantization='float8' (torchao) on CPU (cpu)" in message and "CUDA >= 8.9" in message
    assert "sources: torchao" in message and "hwrun runs it on: cuda, xpu" in message
    with pytest.raises(QuantizationError, match="not a method hwrun plans; use one of int4-weight-only"):
        hwrun.plan(tiny, device="cpu", quantization="int3")


def test_gaudi_refuses_torchao_and_names_inc_for_fp8(tiny):
    gaudi = hwenv.Accelerator("hpu", 1, names=("GAUDI2",), memory=(96 * GiB,))
    with pytest.raises(QuantizationError, match="no Gaudi column"):
        hwrun.plan(tiny, device=gaudi, quantization="int4-weight-only")
    with pytest.raises(QuantizationError, match="FP8 on Gaudi is INC's"):
        hwrun.plan(tiny, device=gaudi, quantization="float8")  # fp8-inc itself: test_hwrun_quant_inc.py
    assert "G10" in hwrun.plan(tiny, device=gaudi, quantization="bnb-4bit").reasons["quantization"]


@needs_torchao
def test_xpu_int4_needs_half_precision_and_runs_in_bf16(tiny):
    xpu = hwenv.Accelerator("xpu", 1, names=("Intel(R) Data Center GPU Max 1550",), memory=(64 * GiB,))
    plan = hwrun.plan(tiny, device=xpu, quantization="int4-weight-only")
    assert plan.dtype == "bfloat16" and "plain_int32" in plan.reasons["quantization"]
    with pytest.raises(QuantizationError, match="bfloat16 or float16 weights, not float32"):
        hwrun.plan(tiny, device=xpu, dtype="float32", quantization="int4-weight-only")
    from hwrun.model.quantization import torchao_config

    assert torchao_config("int4-weight-only", "xpu", {"hidden_size": 64}).int4_packing_format == "plain_int32"


@needs_torchao
def test_cuda_compute_capability_decides_int4_and_float8(tiny):
    def gpu(capability):
        return hwenv.Accelerator("cuda", 1, names=("GPU",), memory=(80 * GiB,), capability=capability)

    with pytest.raises(QuantizationError, match="tinygemm int4 kernel needs compute capability >= 8.0; this GPU has 7.5"):
        hwrun.plan(tiny, device=gpu((7, 5)), quantization="int4-weight-only")
    with pytest.raises(QuantizationError, match="float8 needs compute capability >= 8.9; this GPU has 8.0"):
        hwrun.plan(tiny, device=gpu((8, 0)), quantization="float8")
    assert hwrun.plan(tiny, device=gpu((9, 0)), quantization="float8").quantization == "float8"
    assert "tile_packed_to_4d" in hwrun.plan(tiny, device=gpu((8, 0)), quantization="int4-weight-only").reasons[
        "quantization"]


@needs_torchao
def test_fake_xpu_detected_plans_int4(fake_xpu, tiny):
    fake_xpu(1)
    plan = hwrun.plan(tiny, quantization="int4-weight-only")
    assert plan.accelerator.kind == "xpu" and "xpu runs it" in plan.reasons["quantization"]


def test_fake_gaudi_detected_refuses_awq_and_plans_bitsandbytes(fake_gaudi, tiny):
    fake_gaudi(8, name="GAUDI3")
    with pytest.raises(QuantizationError, match=r"quantization='awq' \(gptqmodel\) on .*no Gaudi column"):
        hwrun.plan(tiny, quantization="awq")
    assert hwrun.plan(tiny, quantization="8bit").quantization == "8bit"


def test_int4_group_size_divides_every_layer_or_is_refused():
    assert int4_group_size({"hidden_size": 2048, "num_attention_heads": 32, "intermediate_size": 8192})[0] == 128
    assert int4_group_size({"hidden_size": 128, "num_attention_heads": 4, "head_dim": 32,
                            "intermediate_size": 352})[0] == 32  # the shipped tiny model
    with pytest.raises(QuantizationError, match="no group size"):
        int4_group_size({"hidden_size": 100, "num_attention_heads": 4, "intermediate_size": 200})


# ---- pre-quantized checkpoints: config.json's quantization_config is planned by the same table -----------------

def test_checkpoint_quantization_is_read_from_config_json():
    assert checkpoint_quantization({}) is None
    assert checkpoint_quantization({"quantization_config": {"quant_method": "awq"}})[0] == "awq"
    assert checkpoint_quantization({"quantization_config": {"quant_method": "bitsandbytes",
                                                            "load_in_8bit": True}})[0] == "bnb-8bit"
    torchao = {"quant_method": "torchao", "quant_type": {"default": {"_type": "Int8WeightOnlyConfig", "_data": {}}}}
    assert checkpoint_quantization({"quantization_config": torchao})[0] == "int8-weight-only"
    with pytest.raises(QuantizationError, match="quant_method='vptq'.*no row"):
        checkpoint_quantization({"quantization_config": {"quant_method": "vptq"}})


def test_a_pre_quantized_checkpoint_is_planned_and_refused_where_it_cannot_run(tiny, tmp_path):
    fp8 = _with_quantization_config(tiny, tmp_path / "fp8", {"quant_method": "fp8", "weight_block_size": [128, 128]})
    with pytest.raises(QuantizationError, match="dequantizes FP8 checkpoints to bf16 silently"):
        hwrun.plan(fp8, device="cpu")  # nothing requested: the checkpoint's own config is planned
    h100 = hwenv.Accelerator("cuda", 1, names=("H100",), memory=(80 * GiB,), capability=(9, 0))
    plan = hwrun.plan(fp8, device=h100)
    assert plan.quantization == "fp8" and "pre-quantized checkpoint (quantization_config.quant_method='fp8')" in \
        plan.reasons["quantization"]
    assert "quantization_config" not in hwrun.from_pretrained_kwargs(plan)  # Transformers reads the checkpoint's
    with pytest.raises(QuantizationError, match="already quantized"):
        hwrun.plan(fp8, device=h100, quantization="int8-weight-only")


def test_pre_quantized_only_methods_need_such_a_checkpoint(tiny):
    with pytest.raises(QuantizationError, match="loads pre-quantized GPTQ checkpoints only"):
        hwrun.plan(tiny, device="cpu", quantization="gptq")


@needs_torchao
def test_a_torchao_int4_checkpoint_loads_only_on_the_device_kind_of_its_layout(tiny, tmp_path):
    cpu_int4 = _with_quantization_config(tiny, tmp_path / "int4cpu", {
        "quant_method": "torchao",
        "quant_type": {"default": {"_type": "PrototypeInt4WeightOnlyConfig", "_data": {"group_size": 64}}}})
    assert hwrun.plan(cpu_int4, device="cpu").quantization == "int4-weight-only"
    xpu = hwenv.Accelerator("xpu", 1, names=("Intel(R) Data Center GPU Max 1550",), memory=(64 * GiB,))
    with pytest.raises(QuantizationError, match="int4 layout is cpu-only"):
        hwrun.plan(cpu_int4, device=xpu)
    from hwrun.model.quantization import torchao_config
    from torchao.core.config import config_to_dict

    cuda_layout = config_to_dict(torchao_config("int4-weight-only", "cuda", {"hidden_size": 64}))  # as saved
    cuda_int4 = _with_quantization_config(tiny, tmp_path / "int4cuda", {"quant_method": "torchao",
                                                                       "quant_type": {"default": cuda_layout}})
    with pytest.raises(QuantizationError, match="int4 layout is cuda-only"):
        hwrun.plan(cuda_int4, device="cpu")


# ---- the CLI ----------------------------------------------------------------------------------------------

def test_cli_quantize_and_quantization_spellings(capsys, tiny):
    from hwrun.cli.main import main

    assert main(["plan", tiny, "--device", "cpu", "--quantize", "bnb-8bit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quantization"] == "8bit"
    assert main(["plan", tiny, "--device", "cpu", "--quantize", "bnb-4bit", "--quantization", "8bit"]) == 2
    assert "--quantize bnb-4bit and --quantization 8bit disagree" in capsys.readouterr().err
    assert main(["plan", tiny, "--device", "cpu", "--quantize", "float8"]) == 2
    assert "hwrun runs it on: cuda, xpu" in capsys.readouterr().err


def test_hqq_is_refused_everywhere_because_transformers_5_cannot_quantize_with_it(tiny):
    """The overview marks HQQ green on CPU/CUDA/XPU, but transformers 5.22-5.25's HqqHfQuantizer has no
    get_quantize_ops: quantizing on load raised NotImplementedError on the CPU. hwrun refuses it before load."""
    from transformers.quantizers.quantizer_hqq import HqqHfQuantizer

    assert "get_quantize_ops" not in HqqHfQuantizer.__dict__, "Transformers implements HQQ again: revisit the table"
    assert not any(row["hqq"].runs for row in qt.QUANTIZATION_TABLE.values())
    with pytest.raises(QuantizationError, match="cannot quantize with HQQ on load"):
        hwrun.plan(tiny, device="cpu", quantization="hqq")
