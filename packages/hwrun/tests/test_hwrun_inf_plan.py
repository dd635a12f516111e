"""plan(): every decision and its reason on CPU for real, and on XPU / Gaudi / CUDA through hwenv's fakes."""

from __future__ import annotations

import json

import hwenv
import hwrun
import pytest
from hwrun.errors import ModelSourceError, PlanError, QuantizationError
from hwrun.model.source import config_parameters, resolve_source, weight_bytes
from hwrun.testing import build_tiny_model

GiB = 2**30

#: config.json of a Llama-3-70B-shaped model (about 70.6e9 parameters), for size estimates only.
LLAMA_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny")))


def test_cpu_plan_decisions(tiny):
    plan = hwrun.plan(tiny, device="cpu")
    assert plan.accelerator.kind == "cpu" and plan.device == "cpu"
    assert plan.dtype == "float32" and "CPU" in plan.reasons["dtype"]
    assert plan.device_map == "cpu"
    assert plan.attention.implementation == "sdpa"
    assert plan.compile is None and plan.quantization is None and plan.env == {}
    assert plan.dist_backend.name == "gloo"
    assert plan.trust_remote_code is False
    assert plan.weight_bytes == 4 * sum(p.numel() for p in _params(tiny))
    for name, _value, reason in plan.rows():
        assert reason, f"{name} has no reason"


def _params(path):
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_pretrained(path, local_files_only=True).parameters())


def test_plan_render_and_json(tiny):
    plan = hwrun.plan(tiny, device="cpu", compile=True)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["dtype"] == "float32" and data["device_map"] == "cpu"
    assert data["compile"]["backend"] == "inductor"
    assert set(data["reasons"]) >= {"device", "dtype", "device_map", "attention", "compile", "dist_backend", "env"}
    table = plan.render()
    for field in ("device", "dtype", "device_map", "attention", "compile", "dist_backend", "env"):
        assert field in table


def test_explicit_dtype_on_cpu(tiny):
    assert hwrun.plan(tiny, device="cpu", dtype="bf16").dtype == "bfloat16"
    assert hwrun.plan(tiny, device="cpu", dtype="float16").torch_dtype().itemsize == 2


@pytest.mark.facts("X9", "X17")
def test_fake_xpu_bf16_and_single_device_map(fake_xpu, tiny):
    fake_xpu(count=4, bf16=True)
    plan = hwrun.plan(tiny)
    assert plan.device == "xpu:0" and plan.dtype == "bfloat16"
    assert plan.device_map == "xpu"
    assert plan.dist_backend.name in ("xccl", "ccl")


@pytest.mark.facts("X9")
def test_fake_four_xpus_split_a_model_larger_than_one(fake_xpu, tiny):
    fake_xpu(count=4, memory=256 * 1024)  # smaller than the tiny model's bf16 weights (~225 KiB at 85%)
    plan = hwrun.plan(tiny)
    assert plan.device_map == "auto"
    assert "4 selected devices" in plan.reasons["device_map"]


@pytest.mark.facts("X9")
def test_config_only_estimate_of_a_70b_model_splits_on_four_xpus():
    params = config_parameters(LLAMA_70B)
    assert 70e9 < params < 71.5e9
    source = hwrun.model.source.ModelSource("meta/llama-70b", False, None, LLAMA_70B)
    nbytes, how = weight_bytes(source, "bfloat16")
    assert nbytes == 2 * params and "config.json" in how
    accel = hwenv.Accelerator("xpu", 4, memory=(64 * GiB,) * 4)
    from hwrun.model.plan import choose_device_map

    assert choose_device_map(accel, nbytes, how)[0] == "auto"
    assert choose_device_map(hwenv.Accelerator("xpu", 4, memory=(192 * GiB,) * 4), nbytes, how)[0] == "xpu"
    assert choose_device_map(accel, weight_bytes(source, "bfloat16", "4bit")[0], how)[0] == "xpu"


def test_one_device_too_small_offloads_with_a_warning(fake_cuda, tiny, caplog):
    fake_cuda(count=1, memory=128 * 1024)
    plan = hwrun.plan(tiny)
    assert plan.device_map == "auto" and "offloads" in plan.reasons["device_map"]
    assert any("offloads to CPU" in r.message for r in caplog.records)


@pytest.mark.facts("X17")
def test_bf16_on_an_xpu_that_emulates_it_follows_torch_and_says_emulated(fake_xpu, tiny):
    """Issue 41.7: torch/xpu/__init__.py `is_bf16_supported(including_emulation=True)` is True on every available
    XPU, and transformers' `TrainingArguments(bf16=True)` checks exactly that, so an explicit bf16 is accepted
    (emulated, slow, said); dtype='auto' still picks float32 there for speed."""
    fake_xpu(count=1, bf16=False)
    given = hwrun.plan(tiny, dtype="bfloat16")
    assert given.dtype == "bfloat16" and "emulated, not natively" in given.reasons["dtype"]
    auto = hwrun.plan(tiny)
    assert auto.dtype == "float32" and "emulated only" in auto.reasons["dtype"]
    no_bf16 = hwenv.Accelerator("xpu", 1, bf16=False)  # a device whose stack says no, even counting emulation
    with pytest.raises(PlanError, match="does not support bfloat16") as info:
        hwrun.plan(tiny, device=no_bf16, dtype="bfloat16")
    assert isinstance(info.value, ValueError)


@pytest.mark.facts("G4", "G9", "G12", "G15")
def test_fake_gaudi_plan(fake_gaudi, tiny):
    fake_gaudi(8)
    plan = hwrun.plan(tiny)
    assert plan.device == "hpu" and plan.device_map == "hpu" and plan.dtype == "bfloat16"
    assert plan.env == {"PT_ENABLE_INT64_SUPPORT": "1"} and "G4" in plan.reasons["env"]
    assert plan.dist_backend.name == "hccl"


@pytest.mark.facts("G13")
def test_fake_gaudi_compile_routes_to_hpu_backend(fake_gaudi, tiny):
    fake_gaudi(8)
    plan = hwrun.plan(tiny, compile="inductor")
    assert plan.compile.backend == "hpu_backend"


def test_fake_cuda_plan(fake_cuda, tiny):
    fake_cuda(count=2, capability=(9, 0))
    plan = hwrun.plan(tiny, compile=True)
    assert plan.device == "cuda:0" and plan.device_map == "cuda" and plan.dtype == "bfloat16"
    assert plan.dist_backend.name == "nccl" and plan.compile.backend == "inductor"


@pytest.mark.facts("X14", "G10")
def test_quantization_rules(fake_gaudi, tiny):
    with pytest.raises(QuantizationError, match="'3bit'"):
        hwrun.plan(tiny, device="cpu", quantization="3bit")
    cpu = hwrun.plan(tiny, device="cpu", quantization="8bit")
    assert cpu.quantization == "8bit" and "bitsandbytes" in cpu.reasons["quantization"]
    assert cpu.weight_bytes < hwrun.plan(tiny, device="cpu").weight_bytes
    with pytest.raises(QuantizationError, match="Gaudi 2"):
        hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI",)), quantization="4bit")
    with pytest.raises(QuantizationError, match="mps"):
        hwrun.plan(tiny, device=hwenv.Accelerator("mps", 1), quantization="4bit")
    fake_gaudi(8, name="GAUDI3")
    assert "G10" in hwrun.plan(tiny, quantization="4bit").reasons["quantization"]


def test_bad_inputs_are_rejected_before_loading(tmp_path, tiny):
    with pytest.raises(ModelSourceError, match="does not exist"):
        hwrun.plan(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="no \\*.safetensors") as info:
        hwrun.plan(str(tmp_path / "empty"))
    assert "pytorch_model.bin" in str(info.value) and isinstance(info.value, OSError)
    with pytest.raises(PlanError, match="not a device kind"):
        hwrun.plan(tiny, device="tpu")
    with pytest.raises(PlanError, match="not an index"):
        hwrun.plan(tiny, device="cuda:1")
    with pytest.raises(PlanError, match="not usable here"):
        hwrun.plan(tiny, device="xpu")
    with pytest.raises(PlanError, match="not a dtype"):
        hwrun.plan(tiny, device="cpu", dtype="int4")
    with pytest.raises(PlanError, match="attention"):
        hwrun.plan(tiny, device="cpu", attention="nonsense_attention")
    with pytest.raises(PlanError, match="compile"):
        hwrun.plan(tiny, device="cpu", compile="")


def test_hub_id_is_planned_without_network(tiny):
    source = resolve_source("someorg/some-model")
    assert not source.local and source.path is None
    plan = hwrun.plan("someorg/some-model", device="cpu")
    assert plan.model == "someorg/some-model" and plan.weight_bytes is None


# --- issue 27 point 6: the plan validates this machine's device selection with hwdist's/doctor's parser ---

@pytest.mark.parametrize(("variable", "value", "message"), [
    ("HABANA_VISIBLE_MODULES", "9", r"module ID\(s\) \[9\] do not exist"),
    ("PT_HPU_LAZY_MODE", "yes", r"PT_HPU_LAZY_MODE='yes'"),
    ("PT_ENABLE_INT64_SUPPORT", "maybe", r"PT_ENABLE_INT64_SUPPORT='maybe'"),
])
def test_invalid_gaudi_environment_is_a_plan_error(fake_gaudi, tiny, monkeypatch, variable, value, message):
    fake_gaudi(8)
    monkeypatch.setenv(variable, value)
    with pytest.raises(hwrun.PlanError, match=rf"invalid device selection \(planning for hpu\): .*{message}"):
        hwrun.plan(tiny)


def test_invalid_xpu_affinity_mask_is_a_plan_error(fake_xpu, tiny, monkeypatch):
    fake_xpu(2)
    monkeypatch.setenv("ZE_AFFINITY_MASK", "abc")
    with pytest.raises(hwrun.PlanError, match=r"invalid device selection \(planning for (xpu|cpu)\): .*ZE_AFFINITY_MASK='abc'"):
        hwrun.plan(tiny)


def test_plan_env_shows_the_value_loading_uses(fake_gaudi, tiny, monkeypatch):
    fake_gaudi(8)
    plan = hwrun.plan(tiny)
    assert plan.env == {"PT_ENABLE_INT64_SUPPORT": "1"} and "mode (" in plan.reasons["device"]
    monkeypatch.setenv("PT_ENABLE_INT64_SUPPORT", "0")
    plan = hwrun.plan(tiny)
    assert plan.env == {"PT_ENABLE_INT64_SUPPORT": "0"}
    assert "PT_ENABLE_INT64_SUPPORT=0 is set by you and kept (hwrun would set 1)" in plan.reasons["env"]
    from hwrun.model.load import apply_env

    assert apply_env(plan) == {} and __import__("os").environ["PT_ENABLE_INT64_SUPPORT"] == "0"


def test_a_plan_for_a_given_accelerator_does_not_read_this_machines_selection(tiny, monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "9")
    plan = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 8, memory=(96 * GiB,) * 8))
    assert "selection variables were not read" in plan.reasons["device"]


def test_hiding_every_gpu_on_purpose_still_plans_the_cpu(tiny, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert hwrun.plan(tiny).device == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,,1")
    with pytest.raises(hwrun.PlanError, match=r"CUDA_VISIBLE_DEVICES='0,,1'"):
        hwrun.plan(tiny)


def test_a_pickle_only_adapter_folder_is_refused_by_the_plan(tmp_path):
    """issue 27 point 8: safetensors only, adapters too; the opt-in is named."""
    from hwrun.errors import AdapterFormatError

    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": hwrun.DEFAULT_MODEL,
                                                            "peft_type": "LORA"}))
    (folder / "adapter_model.bin").write_bytes(b"not loaded")
    with pytest.raises(AdapterFormatError, match=r"adapter_model\.bin.*allow_pickle=True"):
        hwrun.plan(str(folder))
