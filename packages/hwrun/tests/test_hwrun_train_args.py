"""`training_arguments(plan, ...)`: real TrainingArguments per device, checked with hwenv's fakes
(X16, X17, X18, G12, G14, G15), and LoRA target modules per architecture."""

from __future__ import annotations

import hwenv
import hwrun
import peft  # noqa: F401  (imported before any fake: bitsandbytes builds tensors at import time)
import pytest
import transformers.trainer  # noqa: F401
from hwrun.training import (
    ALL_LINEAR,
    TrainingConfigError,
    lora_config,
    lora_targets,
    peft_target_mapping,
    training_arguments,
    training_keywords,
)
from hwrun.training.arguments import is_distributed_launch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from hwrun.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m")))


def test_cpu_arguments(model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = training_arguments(hwrun.plan(model_dir, device="cpu"), tmp_path, save_steps=7)
    assert args.use_cpu and not args.bf16 and not args.torch_compile
    assert str(args.device) == "cpu" and args.save_steps == 7 and args.report_to == []
    assert args.ddp_backend is None  # single process: a backend would make accelerate expect a group
    assert not args.logging_nan_inf_filter  # no per-step sync; a NaN loss is logged, not averaged away
    assert not args.accelerator_config.non_blocking  # host memory: nothing to overlap


@pytest.mark.facts("X16", "X17")
def test_one_xpu_gives_bf16_and_device_xpu0(model_dir, tmp_path, fake_xpu, clean_device_env):
    fake_xpu(count=1)
    plan = hwrun.plan(model_dir)
    args = training_arguments(plan, tmp_path)
    assert plan.accelerator.kind == "xpu" and args.bf16 and not args.use_cpu
    assert str(args.device) == "xpu:0"
    assert args.optim == "adamw_torch_fused"
    assert args.dataloader_pin_memory and args.accelerator_config.non_blocking  # batch copies do not block


@pytest.mark.facts("X17")
def test_bf16_on_an_xpu_without_it_raises_naming_the_device(model_dir, tmp_path, fake_xpu, clean_device_env,
                                                            monkeypatch):
    fake_xpu(count=1, bf16=False, name="Intel(R) Arc(TM) A770")
    plan = hwrun.plan(model_dir)
    assert plan.dtype != "bfloat16"
    built = []
    monkeypatch.setattr("transformers.TrainingArguments", lambda **kw: built.append(kw))
    with pytest.raises(TrainingConfigError, match=r"Arc\(TM\) A770, device xpu:0\) does not support bfloat16") as info:
        training_arguments(plan, tmp_path, bf16=True)
    assert isinstance(info.value, ValueError)
    assert built == []  # rejected before TrainingArguments (and before any model load)
    keywords = training_keywords(plan, tmp_path)  # the plan's own precision is accepted
    assert keywords["bf16"] is False and keywords["fp16"] is (plan.dtype == "float16")


@pytest.mark.facts("G12", "G14")
def test_gaudi_gives_hpu_device_bf16_and_hpu_backend(model_dir, tmp_path, fake_gaudi, clean_device_env):
    fake_gaudi(8)
    plan = hwrun.plan(model_dir, compile=True)
    args = training_arguments(plan, tmp_path)
    assert args.device.type == "hpu"  # Transformers prints hpu:0 for one Gaudi
    assert args.bf16 and args.torch_compile and args.torch_compile_backend == "hpu_backend"
    assert args.optim == "adamw_torch"  # torch's fused AdamW has no hpu kernel
    assert not args.accelerator_config.non_blocking


@pytest.mark.facts("X18", "G15")
@pytest.mark.parametrize(("accelerator", "backend"), [
    (hwenv.Accelerator("xpu", 2), "xccl"), (hwenv.Accelerator("hpu", 8), "hccl"),
    (hwenv.Accelerator("cuda", 2, capability=(9, 0)), "nccl"), (hwenv.Accelerator("cpu"), "gloo"),
])
def test_ddp_backend_under_a_distributed_launch(model_dir, tmp_path, monkeypatch, accelerator, backend):
    plan = hwrun.plan(model_dir, device=accelerator)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert "ddp_backend" not in training_keywords(plan, tmp_path)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert training_keywords(plan, tmp_path)["ddp_backend"] == backend


def test_distributed_launch_detection():
    assert not is_distributed_launch({})
    assert not is_distributed_launch({"LOCAL_RANK": "-1", "WORLD_SIZE": "1"})
    assert is_distributed_launch({"LOCAL_RANK": "1"})
    assert is_distributed_launch({"WORLD_SIZE": "4"})


def test_overrides_win_and_pass_through(model_dir, tmp_path):
    plan = hwrun.plan(model_dir, device="cpu")
    keywords = training_keywords(plan, tmp_path, learning_rate=1e-5, optim="adamw_torch")
    assert keywords["learning_rate"] == 1e-5 and keywords["optim"] == "adamw_torch"
    # fsdp passes through on an accelerator plan (on CPU it is refused: test_hwrun_train_fsdp.py)
    cuda = hwrun.plan(model_dir, device=hwenv.Accelerator("cuda", 2, capability=(9, 0)))
    assert training_keywords(cuda, tmp_path, fsdp="full_shard")["fsdp"] == "full_shard"
    with pytest.raises(TrainingConfigError, match="both given"):
        training_keywords(plan, tmp_path, bf16=True, fp16=True)


def test_lora_default_targets_are_peft_mapping_itself():
    from peft.utils import constants

    assert peft_target_mapping() is constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING


@pytest.mark.parametrize(("model_type", "expected"), [
    ("llama", ("q_proj", "v_proj")),  # peft 0.21's rows (PEFT's choice, not the q/k/v/o recipe)
    ("qwen2", ("q_proj", "v_proj")),
    ("gemma2", ("q_proj", "v_proj")),
    ("gpt2", ("c_attn",)),
    ("gpt_neox", ("query_key_value",)),
    ("falcon", ("query_key_value",)),
    ("t5", ("q", "v")),
])
def test_lora_targets_from_peft_mapping(model_type, expected):
    targets = lora_targets(model_type)
    assert targets.modules == expected and targets.source == "peft"
    assert targets.reason == f"peft's mapping for {model_type}: {', '.join(expected)}"
    assert targets.for_peft() == list(expected)


@pytest.mark.parametrize("model_type", ["phi3", "olmo2", "qwen3_moe", "madeup", ""])
def test_lora_targets_all_linear_for_types_peft_does_not_map(model_type):
    assert model_type not in peft_target_mapping()
    targets = lora_targets(model_type)
    assert targets.modules == ALL_LINEAR == targets.for_peft() and targets.source == "all-linear"
    assert targets.reason.startswith("all-linear: PEFT's every linear layer but the output head")


def test_lora_targets_given_win_and_all_linear_can_be_given():
    assert lora_targets("llama", ["gate_proj", " up_proj "]).modules == ("gate_proj", "up_proj")
    assert lora_targets("llama", ["gate_proj"]).source == "given"
    assert lora_targets("llama", ("All-Linear",)).for_peft() == ALL_LINEAR
    with pytest.raises(TrainingConfigError, match=r"target_modules=\(' ',\) names no module"):
        lora_targets("llama", [" "])


def test_lora_settings_refuse_empty_targets_and_missing_peft_mapping(monkeypatch):
    from hwrun.training import LoraSettings
    from peft.utils import constants

    with pytest.raises(TrainingConfigError, match="names no module"):
        LoraSettings(target_modules=())
    monkeypatch.delattr(constants, "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING")
    with pytest.raises(TrainingConfigError, match="has no peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA"):
        lora_targets("llama")
    assert lora_targets("llama", ["q_proj"]).modules == ("q_proj",)  # given targets need no mapping


def test_lora_config_passes_peft_the_choice():
    from types import SimpleNamespace

    assert set(lora_config(SimpleNamespace(model_type="llama")).target_modules) == {"q_proj", "v_proj"}
    assert lora_config(SimpleNamespace(model_type="phi3")).target_modules == ALL_LINEAR
