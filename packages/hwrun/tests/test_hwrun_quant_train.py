"""LoRA training on torchao-quantized weights (issue 43.2, `hwrun train --lora --quantize METHOD`): int8 weight-only trains
through PEFT's TorchaoLoraLinear on the CPU; int4 weight-only, int8 dynamic and the rest of the table's "no" rows are
refused before the model loads with PEFT's or torch's reason and what to use instead. The table's training column
(`quantization_table.LORA_TRAINING`) is checked against the installed PEFT, torchao and torch."""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import QuantizedTrainingError
from hwrun.model import quantization_table as qt
from hwrun.testing import build_tiny_model

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant-train")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold, and the queen said it was not. " * 40,
                    encoding="utf-8")
    return str(build_tiny_model(root / "model")), data


def _plan(model, method):
    from hwrun.training import train_plan

    return train_plan(model, device="cpu", quantization=method)


def _train(plan, data, out, **kwargs):
    from hwrun.training import train

    options = dict(lora=True, max_steps=8, batch_size=4, block_size=16, lr=5e-3, plot=False, disable_tqdm=True,
                   output_dir=out, seed=0)
    return train(plan, data, **{**options, **kwargs})


# ---- the table's training column ------------------------------------------------------------------------------


def test_every_method_has_a_training_row_with_sources_and_what_to_use_instead():
    assert set(qt.LORA_TRAINING) == set(qt.METHODS)
    for name, row in qt.LORA_TRAINING.items():
        assert row.reason and row.sources and set(row.sources) <= set(qt.SOURCES), name
        assert row.trains or row.instead, f"{name}: a refusal names what to use instead"
        assert not row.tested or row.trains
    assert [n for n, row in qt.LORA_TRAINING.items() if row.trains] == ["int8-weight-only", "bnb-4bit"]
    assert qt.lora_training("4bit") is qt.LORA_TRAINING["bnb-4bit"]  # plan values read as their method
    assert "| `int8-weight-only` (on load) | torchao | yes | no | yes | no | yes (tested) | no | yes (tested) |" in \
        qt.markdown()


@needs_torchao
def test_peft_wraps_every_torchao_weight_and_refuses_int4tensor_only():
    """The PEFT facts the int4 and int8 rows cite: `dispatch_torchao` wraps any TorchAOBaseTensor weight, and
    `TorchaoLoraLinear._check_dtype_supported` refuses torchao's Int4Tensor ("only supports int8 weights for now");
    the int4 layout hwrun loads on the CPU is not an Int4Tensor, so it passes that check."""
    from peft.tuners.lora import torchao as peft_torchao
    from torchao.prototype.quantization.int4.int4_opaque_tensor import Int4OpaqueTensor
    from torchao.quantization import Int4Tensor, Int8Tensor

    check = inspect.getsource(peft_torchao.TorchaoLoraLinear._check_dtype_supported)
    assert "Int4Tensor" in check and "only supports int8 weights" in check
    assert "TorchAOBaseTensor" in inspect.getsource(peft_torchao.dispatch_torchao)
    assert not issubclass(Int4OpaqueTensor, Int4Tensor) and not issubclass(Int8Tensor, Int4Tensor)


def _quantized_linear(config):
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32, bias=False)
    quantize_(layer, config)
    return layer


@needs_torchao
def test_the_autograd_facts_behind_the_rows():
    """int8 weight-only passes the gradient to its input (the dequantized weight's); int8 dynamic rounds the input to
    int8, so its output does not require grad; the CPU int4 matmul has no derivative."""
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    x = torch.randn(4, 64)
    int8 = _quantized_linear(Int8WeightOnlyConfig())
    ours = x.clone().requires_grad_(True)
    int8(ours).sum().backward()
    reference = x.clone().requires_grad_(True)
    (reference @ int8.weight.dequantize().t()).sum().backward()
    assert torch.allclose(ours.grad, reference.grad, atol=1e-4, rtol=1e-3)

    dynamic = _quantized_linear(Int8DynamicActivationInt8WeightConfig())
    assert not dynamic(x.clone().requires_grad_(True)).requires_grad  # autograd stops at the int8 activation

    int4 = _quantized_linear(PrototypeInt4WeightOnlyConfig(group_size=32))
    out = int4(x.clone().requires_grad_(True))
    with pytest.raises(RuntimeError, match="derivative for aten::_weight_int4pack_mm_for_cpu is not implemented"):
        out.sum().backward()


def test_the_gpu_layouts_matmuls_have_no_derivative_either():
    """The int4 matmuls of the CUDA (tinygemm) and XPU layouts and float8's torch._scaled_mm: torch has no derivative
    for them (checked on meta/fake tensors: no GPU needed), so a LoRA backward through them fails as on the CPU."""
    meta = dict(device="meta")
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True, **meta)
    xpu_int4 = torch.ops.aten._weight_int4pack_mm_with_scales_and_zeros(
        x, torch.empty(32, 8, dtype=torch.int32, **meta), 64, torch.empty(1, 32, dtype=torch.bfloat16, **meta),
        torch.empty(1, 32, dtype=torch.int8, **meta))
    with pytest.raises(RuntimeError, match="derivative for aten::_weight_int4pack_mm_with_scales_and_zeros is not"):
        xpu_int4.sum().backward()
    a = torch.randn(16, 32, requires_grad=True, **meta)
    b = torch.randn(32, 16, **meta).to(torch.float8_e4m3fn).t().contiguous().t()
    scaled = torch._scaled_mm(a.to(torch.float8_e4m3fn), b, torch.ones((), **meta), torch.ones((), **meta),
                              out_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="derivative for aten::_scaled_mm is not implemented"):
        scaled.sum().backward()
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode():  # tinygemm's op has a CUDA kernel only: a fake CUDA tensor carries its autograd node
            x = torch.randn(4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
            cuda_int4 = torch.ops.aten._weight_int4pack_mm(x, torch.empty(4, 2, 32, 4, dtype=torch.int32, device="cuda"),
                                                           64, torch.empty(1, 32, 2, dtype=torch.bfloat16, device="cuda"))
    except (RuntimeError, AssertionError) as error:  # a torch built without CUDA cannot fake a CUDA tensor
        pytest.skip(f"no fake CUDA tensors in this torch build: {error}")
    assert type(cuda_int4.grad_fn).__name__ == "NotImplemented"  # torch's node for an op with no derivative


# ---- refused before the model loads ---------------------------------------------------------------------------


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model fails the test: the refusals must come first."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@needs_torchao
@pytest.mark.parametrize("method, why, instead", [
    ("int4-weight-only", "TorchaoLoraLinear._check_dtype_supported", "--qlora"),
    ("int8-dynamic", "autograd stops there", "--quantize int8-weight-only"),
])
def test_lora_on_a_base_peft_cannot_train_is_refused_before_load(files, tmp_path, no_load, method, why, instead):
    model, data = files
    out = tmp_path / "o"
    with pytest.raises(QuantizedTrainingError) as info:
        _train(_plan(model, method), data, out)
    message = str(info.value)
    assert f"quantized with {method} (torchao)" in message and why in message and f"instead: {instead}" in message
    assert not out.exists()


@needs_torchao
def test_full_fine_tuning_and_qlora_on_a_torchao_base_are_refused_before_load(files, tmp_path, no_load):
    model, data = files
    plan = _plan(model, "int8-weight-only")
    with pytest.raises(QuantizedTrainingError, match="full fine-tuning on a base quantized with int8-weight-only.*"
                                                     "train LoRA adapters on it"):
        _train(plan, data, tmp_path / "full", lora=None)
    with pytest.raises(QuantizedTrainingError, match="qlora=True .* loads a 4-bit bitsandbytes base, but the plan "
                                                     "quantizes with int8-weight-only"):
        _train(plan, data, tmp_path / "qlora", qlora=True)


@needs_torchao
def test_the_cli_refuses_int4_in_one_line(files, tmp_path, capsys):
    from hwrun.cli.main import main

    model, data = files
    out = tmp_path / "o"
    assert main(["train", "--data", str(data), "--model", model, "--device", "cpu", "--lora", "--quantize",
                 "int4-weight-only", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hwrun: error: ") and "int4-weight-only" in err and "--qlora" in err and not out.exists()


# ---- int8 weight-only trains -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_run(files, tmp_path_factory):
    """A LoRA run on the tiny model quantized to int8 weight-only: (result, what a callback saw before each update)."""
    from transformers import TrainerCallback

    model, data = files
    seen: list[dict] = []

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen.append({"with_grad": {n for n, p in model.named_parameters() if p.grad is not None},
                         "trainable": {n for n, p in model.named_parameters() if p.requires_grad},
                         "weights": {type(m.base_layer.weight).__name__ for m in model.modules()
                                     if hasattr(m, "base_layer") and hasattr(m.base_layer, "weight")}})

    out = tmp_path_factory.mktemp("int8-lora") / "out"
    result = _train(_plan(model, "int8-weight-only"), data, out, callbacks=[Gradients()])
    return result, seen


@needs_torchao
def test_lora_trains_on_an_int8_weight_only_base_with_gradients_in_the_adapter_only(int8_run):
    result, seen = int8_run
    assert result.global_step == 8 and result.lora and not result.merged
    losses = [loss for _, loss in result.losses]
    assert min(losses[-3:]) < losses[0]  # the loss went down over the run
    assert "int8-weight-only (torchao) base" in result.reasons["quantized base"]
    assert "not fused: the base weights are quantized" in result.reasons["projections"]
    for step in seen:
        assert step["weights"] == {"Int8Tensor"}  # the base stayed int8 while training
        assert step["trainable"] and all("lora_" in name for name in step["trainable"])
        assert step["with_grad"] == step["trainable"]  # every adapter weight got a gradient, nothing else did


@needs_torchao
def test_the_adapter_loads_onto_a_base_quantized_the_same_way_and_generates(int8_run):
    from peft.tuners.lora.torchao import TorchaoLoraLinear

    result, _ = int8_run
    out = result.output_dir
    config = json.loads((Path(out) / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    plan = hwrun.plan(out, device="cpu", quantization="int8-weight-only")  # the adapter's base, quantized again
    assert plan.adapter is not None and plan.quantization == "int8-weight-only"
    model, tokenizer = hwrun.load(plan)
    layers = [m for m in model.modules() if isinstance(m, TorchaoLoraLinear)]
    assert layers and {type(m.base_layer.weight).__name__ for m in layers} == {"Int8Tensor"}
    assert any(m.lora_B["default"].weight.abs().sum() > 0 for m in layers)  # the trained adapter, not a fresh one
    generated = hwrun.generate(plan, ["the king", "a queen said"], 5, model=model, tokenizer=tokenizer)
    assert generated.new_tokens == [5, 5]


@needs_torchao
def test_merge_goes_through_the_unquantized_base(files, tmp_path):
    """--merge on an int8 base: the adapter is merged into the unquantized weights (as after QLoRA), so the merged
    model is a plain checkpoint, not int8 weights rounded twice."""
    model, data = files
    result = _train(_plan(model, "int8-weight-only"), data, tmp_path / "merged", max_steps=2, merge=True)
    assert result.merged
    saved = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert "quantization_config" not in saved
    merged_plan = hwrun.plan(str(tmp_path / "merged"), device="cpu")
    assert merged_plan.quantization is None
    assert hwrun.generate(merged_plan, ["the king"], 3).new_tokens == [3]


@needs_torchao
def test_the_cli_trains_with_quantize_and_says_how_to_generate(files, tmp_path, capsys):
    from hwrun.cli.main import main

    model, data = files
    out = tmp_path / "o"
    assert main(["train", "--data", str(data), "--model", model, "--device", "cpu", "--lora", "--quantize",
                 "int8-weight-only", "--max-steps", "2", "--batch-size", "4", "--block-size", "16", "--output",
                 str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "LoRA adapter saved in" in printed
    assert f"hwrun generate --model {out} --quantize int8-weight-only" in printed


@needs_torchao
def test_an_adapter_loaded_with_a_plan_for_another_folder_keeps_the_plans_quantization(int8_run, tmp_path):
    """load_adapter_model plans the adapter's base again when the plan is for another folder (here a copy of the
    base, as after moving a model): quantization is part of that plan too, so the base is not loaded unquantized."""
    import shutil

    from hwrun.model.adapters import adapter_base_model
    from hwrun.training import load_adapter_model

    result, _ = int8_run
    base = adapter_base_model(result.output_dir)
    copy = shutil.copytree(base, tmp_path / "copy-of-base")
    plan = hwrun.plan(str(copy), device="cpu", quantization="int8-weight-only")
    assert plan.model != base  # the case that re-plans
    model, _ = load_adapter_model(result.output_dir, plan)
    weights = {type(m.base_layer.weight).__name__ for m in model.modules() if hasattr(m, "base_layer")}
    assert weights == {"Int8Tensor"}
