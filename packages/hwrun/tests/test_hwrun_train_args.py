"""`training_arguments(plan, ...)`: real TrainingArguments per device, checked with hwenv's fakes
(X16, X17, X18, G12, G14, G15), and LoRA target modules per architecture."""

from __future__ import annotations

import hwenv
import hwrun
import peft  # noqa: F401  (imported before any fake: bitsandbytes builds tensors at import time)
import pytest
import transformers.trainer  # noqa: F401
from hwrun.training import (
    TrainingConfigError,
    target_modules_for,
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


@pytest.mark.parametrize(("model_type", "expected"), [
    ("llama", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("mistral", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("qwen2", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("phi3", ("qkv_proj", "o_proj")),
    ("gpt2", ("c_attn", "c_proj")),
])
def test_lora_targets_per_architecture(model_type, expected):
    modules, reason = target_modules_for(model_type)
    assert modules == expected and model_type in reason


def test_lora_targets_override_peft_default_and_unknown():
    assert target_modules_for("llama", ["gate_proj"])[0] == ("gate_proj",)
    assert target_modules_for("t5")[0] == ("q", "v")  # from PEFT's own table
    with pytest.raises(TrainingConfigError, match="model_type='madeup'.*target_modules"):
        target_modules_for("madeup")
