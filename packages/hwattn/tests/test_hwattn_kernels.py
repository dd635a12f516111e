"""kernel_mapping, kernel_plan, load_kwargs and the offline kernel error (X12, X13), with the real kernels/KernelConfig."""

from __future__ import annotations

import logging

import hwattn
import pytest
from hwattn import (
    KernelMappingError,
    KernelsUnsupportedError,
    KernelUnavailableError,
    kernel_mapping,
    kernel_plan,
    load_kwargs,
)
from hwenv import Accelerator

XPU = Accelerator("xpu", torch_version="2.8.0")
H200 = Accelerator("cuda", capability=(9, 0))
HPU = Accelerator("hpu")
CPU = Accelerator("cpu")
RMS = {"RMSNorm": {"xpu": "kernels-community/rmsnorm:RMSNorm", "cuda": "kernels-community/liger-kernels:LigerRMSNorm"}}


@pytest.fixture(scope="module")
def model(make_config):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(make_config()).eval()


@pytest.mark.facts("X13")
def test_kernel_mapping_returns_a_real_kernel_config(model):
    from transformers import KernelConfig

    config = kernel_mapping(RMS, model=model)
    assert isinstance(config, KernelConfig)
    assert config.kernel_mapping == RMS and config.use_local_kernel is False and config.inherit_mapping is True
    assert set(config.registered_layer_names.values()) == {"RMSNorm", "SiLU", "rotary_pos_emb"}


def test_layer_defaults_to_mapping_name_and_tuples_are_kept():
    config = kernel_mapping({"RMSNorm": {"xpu": "kernels-community/rmsnorm"},
                             "SiLU": {"cuda": ("kernels-community/activation:Silu", {"version": 1})}})
    assert config.kernel_mapping["RMSNorm"] == {"xpu": "kernels-community/rmsnorm:RMSNorm"}
    assert config.kernel_mapping["SiLU"]["cuda"] == ("kernels-community/activation:Silu", {"version": 1})


def test_device_keys_are_read_from_transformers():
    from transformers.utils.kernel_config import KERNELS_SUPPORTED_DEVICE_TYPES

    assert hwattn.device_keys() == tuple(KERNELS_SUPPORTED_DEVICE_TYPES)
    assert "xpu" in hwattn.device_keys() and "cpu" not in hwattn.device_keys()


@pytest.mark.parametrize("mapping, pattern", [
    ({"RMSNorm": {"gpu": "kernels-community/rmsnorm:RMSNorm"}}, r"'gpu'.*'cuda' \(NVIDIA\), 'rocm' \(AMD\) or 'xpu'"),
    ({"RMSNorm": {"cpu": "kernels-community/rmsnorm:RMSNorm"}}, r"'cpu'.*no CPU key"),
    ({"RMSNorm": {"hpu": "kernels-community/rmsnorm:RMSNorm"}}, r"'hpu'.*Gaudi"),
    ({"RMSNorm": {"xpu": "flash-attn2"}}, r"'flash-attn2' is not 'org/name'.*'kernels-community/flash-attn2:RMSNorm'"),
    ({"RMSNorm": {"xpu": "kernels-community/rmsnorm:bad-name"}}, r"not an identifier"),
    ({"RMSNorm": {"xpu": ("kernels-community/rmsnorm:RMSNorm", {"version": 1, "revision": "main"})}}, "exactly one"),
    ({"RMSNorm": {"xpu": ("kernels-community/rmsnorm:RMSNorm", {"tag": 1})}}, "unknown keys"),
    ({"RMSNorm": {"xpu": 3}}, "must be a string"),
    ({"RMSNorm": {}}, "empty dict"),
    ({}, "non-empty dict"),
    ([("RMSNorm", "x")], "non-empty dict"),
])
def test_bad_mappings(mapping, pattern):
    with pytest.raises(KernelMappingError, match=pattern) as info:
        kernel_mapping(mapping)
    assert isinstance(info.value, ValueError)


def test_layer_the_model_does_not_have(model):
    with pytest.raises(KernelMappingError, match=r"'LayerNorm' is not in the model LlamaForCausalLM.*RMSNorm, SiLU"):
        kernel_mapping({"LayerNorm": {"xpu": "kernels-community/layer_norm:LayerNorm"}}, model=model)


def test_local_kernel_paths(tmp_path):
    config = kernel_mapping({"RMSNorm": {"xpu": f"{tmp_path}:RMSNorm"}}, use_local_kernel=True)
    assert config.use_local_kernel is True
    with pytest.raises(KernelMappingError, match="absolute path"):
        kernel_mapping({"RMSNorm": {"xpu": "relative/dir:RMSNorm"}}, use_local_kernel=True)


def expected_defaults(layers: dict[str, str], device: str, training: bool) -> dict[str, tuple[str, str]]:
    """What Transformers' installed default mapping gives each layer name on `device` (no capability rows).

    Read straight from `get_kernel_mapping_transformers()` with kernels' documented mode priority
    (inference takes inference, then training kernels; training takes training kernels only; a repo
    without modes serves every mode), independently of hwattn's planner.
    """
    from kernels import Mode
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    priority = ([Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK] if training else
                [Mode.INFERENCE, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING,
                 Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK])
    found = {}
    for layer in set(layers.values()):
        for key, value in get_kernel_mapping_transformers().get(layer, {}).items():
            if getattr(key, "type", key) != device or getattr(key, "properties", None) is not None:
                continue
            modes = value if isinstance(value, dict) else {Mode.FALLBACK: value}
            repo = next((modes[m] for m in priority if m in modes), None)
            if repo is not None:
                found[layer] = (repo._repo_id, repo.layer_name)
    return found


@pytest.mark.facts("X12")
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_plan_on_xpu_follows_the_installed_transformers_defaults(model, training):
    layers = hwattn.registered_layers(model)
    expected = expected_defaults(layers, "xpu", training)
    model.train(training)
    try:
        plan = kernel_plan(model, XPU)
    finally:
        model.eval()
    assert plan.mode == ("training" if training else "inference") and plan.device == "xpu"
    replaced = {k.layer: (k.repo, k.repo_layer) for k in plan.replaced}
    assert replaced == expected
    assert all(k.source == "transformers" for k in plan.replaced)
    assert len(plan.replaced) == sum(1 for name in layers.values() if name in expected)
    assert {k.layer for k in plan.unchanged} == set(layers.values()) - set(expected)
    assert plan.used is bool(expected)
    if not training:  # every release so far maps SiLU and rotary on XPU for inference
        assert {"SiLU", "rotary_pos_emb"} <= set(replaced)


@pytest.mark.facts("X12", "X13")
def test_default_mapping_facts_per_release(model):
    """The XPU defaults read from the wheels: 5.22-5.24 give RMSNorm (inference only) and rotary (inference
    only); 5.25 drops the XPU RMSNorm kernel and gives rotary for training too."""
    import transformers
    from hwenv import at_least

    layers = hwattn.registered_layers(model)
    inference, training = expected_defaults(layers, "xpu", False), expected_defaults(layers, "xpu", True)
    if at_least(transformers.__version__, (5, 25)):
        assert "RMSNorm" not in inference and "rotary_pos_emb" in training
    else:
        assert inference["RMSNorm"] == ("kernels-community/rmsnorm", "RMSNorm") and "RMSNorm" not in training
        assert "rotary_pos_emb" not in training
    model.train()
    try:
        planned = {k.layer for k in kernel_plan(model, XPU).replaced}
    finally:
        model.eval()
    assert planned == set(training)


@pytest.mark.facts("X12", "X13")
def test_plan_with_user_mapping_and_training_mode(model):
    mapping = {"RMSNorm": {"xpu": "myorg/fast-norm:FastRMSNorm"}}
    plan = kernel_plan(model, XPU, mapping, allowed_orgs=("myorg",))
    norms = [k for k in plan.replaced if k.layer == "RMSNorm"]
    assert len(norms) == 5
    assert all((k.repo, k.repo_layer, k.source) == ("myorg/fast-norm", "FastRMSNorm", "mapping") for k in norms)
    model.train()
    try:
        training = kernel_plan(model, XPU)
    finally:
        model.eval()
    # X13: the mode matters; whatever the installed Transformers maps for training only is replaced.
    layers = hwattn.registered_layers(model)
    expected, for_inference = expected_defaults(layers, "xpu", True), expected_defaults(layers, "xpu", False)
    assert training.mode == "training"
    assert {k.layer for k in training.replaced} == set(expected)
    inference_only = set(for_inference) - set(expected)
    assert all("no xpu kernel for training mode" == k.reason for k in training.unchanged if k.layer in inference_only)


def test_plan_with_kernel_config_without_inheritance(model):
    config = kernel_mapping({"RMSNorm": {"cuda": "myorg/fast-norm:FastRMSNorm"}}, inherit_mapping=False,
                            allow_repos="myorg/fast-norm")
    plan = kernel_plan(model, H200, config, allow_repos=["myorg/fast-norm"])
    assert {k.layer for k in plan.replaced} == {"RMSNorm"}
    assert {k.layer for k in plan.unchanged} == {"SiLU", "rotary_pos_emb"}


@pytest.mark.facts("G1")
def test_plan_on_gaudi_and_cpu_says_not_used(model):
    gaudi = kernel_plan(model, HPU)
    assert not gaudi.used and not gaudi.replaced and "Gaudi" in gaudi.reason and "hpu" in gaudi.reason
    assert len(gaudi.unchanged) == 9
    cpu = kernel_plan(model, CPU)
    assert not cpu.used and not cpu.replaced and "not used on CPU" in cpu.reason and "'cpu'" in cpu.reason


def test_plan_rejects_bad_mapping_for_model(model):
    with pytest.raises(KernelMappingError, match="not in the model"):
        kernel_plan(model, XPU, {"Nope": {"xpu": "a/b:C"}})
    with pytest.raises(KernelMappingError):
        kernel_plan(model, XPU, "RMSNorm")


def test_plan_loads_nothing(model, monkeypatch):
    import kernels

    def boom(*args, **kwargs):
        raise AssertionError("kernel_plan must not load kernels")

    monkeypatch.setattr(kernels, "get_kernel", boom)
    monkeypatch.setattr(kernels.LayerRepository, "load", boom)
    assert kernel_plan(model, XPU).used


@pytest.mark.facts("X12")
def test_load_kwargs():
    assert load_kwargs(CPU) == {"attn_implementation": "sdpa", "use_kernels": False}
    assert load_kwargs(XPU, "flash_attention_2") == {"attn_implementation": "kernels-community/flash-attn2", "use_kernels": False}
    assert load_kwargs(XPU, use_kernels=True) == {"attn_implementation": "sdpa", "use_kernels": True}


@pytest.mark.facts("X13")
def test_load_kwargs_narrows_the_mapping_to_the_device(caplog):
    with_map = load_kwargs(XPU, "sdpa", mapping=RMS)
    assert with_map["use_kernels"] is True
    assert with_map["kernel_config"].kernel_mapping == {"RMSNorm": {"xpu": "kernels-community/rmsnorm:RMSNorm"}}
    config = kernel_mapping(RMS, inherit_mapping=False)
    cuda = load_kwargs(H200, mapping=config)["kernel_config"]
    assert cuda.kernel_mapping == {"RMSNorm": {"cuda": "kernels-community/liger-kernels:LigerRMSNorm"}}
    assert cuda.inherit_mapping is False
    caplog.set_level(logging.WARNING, logger="hwattn.loading")
    mps = load_kwargs(Accelerator("mps"), mapping=RMS)  # no 'mps' entry: the (empty) narrowed config still goes
    assert mps["use_kernels"] is True and mps["kernel_config"].kernel_mapping == {}
    assert mps["kernel_config"].inherit_mapping is True
    assert any("no 'mps' entry for RMSNorm" in r.getMessage() for r in caplog.records)


NPU_ONLY = {"RMSNorm": {"npu": "kernels-community/liger-kernels:LigerRMSNorm"}}


@pytest.mark.facts("X13")
@pytest.mark.parametrize("accel", [XPU, H200, Accelerator("mps"), CPU], ids=["xpu", "cuda", "mps", "cpu"])
def test_load_kwargs_without_an_entry_for_the_device_is_the_same_on_every_device(accel, caplog):
    """The user's KernelConfig always goes (narrowed), so its inherit_mapping decides, never Transformers' default."""
    caplog.set_level(logging.WARNING, logger="hwattn.loading")
    inherited = load_kwargs(accel, mapping=NPU_ONLY)
    assert inherited["use_kernels"] is True and inherited["kernel_config"].kernel_mapping == {}
    assert inherited["kernel_config"].inherit_mapping is True
    assert any(f"no {accel.kind!r} entry for RMSNorm" in r.getMessage() and "default mapping" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    alone = load_kwargs(accel, mapping=kernel_mapping(NPU_ONLY, inherit_mapping=False))
    assert alone == {"attn_implementation": "sdpa", "use_kernels": False}  # nothing to replace: kernels are not asked for
    assert any("loading without hub kernels" in r.getMessage() and "inherit_mapping=False" in r.getMessage()
               for r in caplog.records)


@pytest.mark.facts("X13")
def test_load_kwargs_on_cpu_keeps_the_mapping_and_its_flags(caplog):
    caplog.set_level(logging.WARNING, logger="hwattn.loading")
    cpu = load_kwargs(CPU, mapping=RMS)  # KernelConfig has no 'cpu' key: no entry can apply
    assert cpu["use_kernels"] is True and cpu["kernel_config"].kernel_mapping == {}
    assert any("no 'cpu' entry for RMSNorm" in r.getMessage() for r in caplog.records)
    assert load_kwargs(CPU, mapping=kernel_mapping(RMS, inherit_mapping=False)) == {"attn_implementation": "sdpa", "use_kernels": False}
    local = kernel_mapping({"RMSNorm": {"xpu": "/opt/rmsnorm:RMSNorm"}}, use_local_kernel=True)
    assert load_kwargs(CPU, mapping=local) == {"attn_implementation": "sdpa", "use_kernels": False}  # local kernels inherit nothing
    caplog.clear()
    # A mapping without device keys is bound to the model's device by Transformers, which refuses 'cpu'
    # (KernelConfig.create_compatible_mapping -> add_to_mapping): dropped here, with the reason.
    plain = load_kwargs(CPU, mapping={"RMSNorm": "kernels-community/rmsnorm:RMSNorm"})
    assert plain["kernel_config"].kernel_mapping == {}
    assert any("no device key" in r.getMessage() and "'cpu'" in r.getMessage() for r in caplog.records)
    xpu = load_kwargs(XPU, mapping={"RMSNorm": "kernels-community/rmsnorm:RMSNorm"})
    assert xpu["kernel_config"].kernel_mapping == {"RMSNorm": "kernels-community/rmsnorm:RMSNorm"}


def test_load_kwargs_needs_no_kernels_when_none_would_be_used(monkeypatch):
    import hwattn.environment

    monkeypatch.setattr(hwattn.environment, "kernels_available", lambda: False)
    assert load_kwargs(CPU, mapping=kernel_mapping(RMS, inherit_mapping=False)) == {"attn_implementation": "sdpa", "use_kernels": False}
    with pytest.raises(hwattn.KernelsMissingError):
        load_kwargs(CPU, mapping=RMS)  # inherits Transformers' defaults: those need kernels


@pytest.mark.facts("X13")
def test_kernel_plan_on_cpu_agrees_with_load_kwargs(model):
    plain = {"RMSNorm": "kernels-community/rmsnorm:RMSNorm"}
    plan = kernel_plan(model, CPU, plain)
    assert not plan.used and all(k.layer != "RMSNorm" for k in plan.replaced)
    assert kernel_plan(model, XPU, plain).used


def test_load_kwargs_on_gaudi(caplog):
    with pytest.raises(KernelsUnsupportedError, match="Gaudi.*fallback=True"):
        load_kwargs(HPU, use_kernels=True)
    caplog.set_level(logging.WARNING, logger="hwattn.loading")
    assert load_kwargs(HPU, use_kernels=True, fallback=True) == {"attn_implementation": "sdpa", "use_kernels": False}
    assert any("hub kernels dropped" in r.getMessage() for r in caplog.records)


def test_load_kwargs_without_kernels(monkeypatch):
    import hwattn.environment

    monkeypatch.setattr(hwattn.environment, "kernels_available", lambda: False)
    with pytest.raises(hwattn.KernelsMissingError, match=r'pip install "hwattn\[kernels\]"'):
        load_kwargs(XPU, use_kernels=True)
    with pytest.raises(hwattn.KernelsMissingError):
        load_kwargs(XPU, "flash_attention_2")


def test_load_kwargs_bad_inputs():
    with pytest.raises(hwattn.UnknownAttentionError):
        load_kwargs(XPU, "flash-attention-2")
    with pytest.raises(KernelMappingError, match="'gpu'"):
        load_kwargs(XPU, mapping={"RMSNorm": {"gpu": "a/b:C"}})


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    return tmp_path


def test_offline_hub_kernel_load_says_how_to_use_a_local_checkout(offline_hub):
    with pytest.raises(KernelUnavailableError) as info:
        hwattn.load_kernel("kernels-community/flash-attn2")
    message = str(info.value)
    assert "offline mode (HF_HUB_OFFLINE=1)" in message and "'kernels-community/flash-attn2'" in message
    for how in ('LOCAL_KERNELS="kernels-community/flash-attn2=/path/to/flash-attn2"', "use_local_kernel=True",
                "LocalLayerRepository", "git clone https://huggingface.co/kernels-community/flash-attn2"):
        assert how in message
    assert isinstance(info.value.__cause__, Exception)


def test_from_pretrained_needs_one_repo_per_layer(offline_hub, make_config):
    """Transformers' from_pretrained loads mapped kernels before init and takes one repo per layer:
    the raw multi-device mapping fails there, the narrowed one from load_kwargs gets as far as the
    (offline) kernel download."""
    from transformers import LlamaForCausalLM

    LlamaForCausalLM(make_config()).save_pretrained(offline_hub / "model")
    with pytest.raises(ValueError, match="exactly one kernel repo"):
        LlamaForCausalLM.from_pretrained(offline_hub / "model", use_kernels=True, kernel_config=kernel_mapping(RMS))
    with pytest.raises(ValueError, match="offline mode"):
        LlamaForCausalLM.from_pretrained(offline_hub / "model", **load_kwargs(XPU, mapping=RMS))


@pytest.mark.facts("X13")
def test_from_pretrained_on_cpu_with_load_kwargs_and_a_mapping(offline_hub, make_config):
    """On CPU the narrowed (empty) KernelConfig loads: nothing is fetched, the layers keep PyTorch."""
    import torch
    from transformers import LlamaForCausalLM

    LlamaForCausalLM(make_config()).save_pretrained(offline_hub / "model")
    ids = torch.arange(8).unsqueeze(0)
    plain = LlamaForCausalLM.from_pretrained(offline_hub / "model", **load_kwargs(CPU))
    for mapping in (RMS, {"RMSNorm": "kernels-community/rmsnorm:RMSNorm"}):
        model = LlamaForCausalLM.from_pretrained(offline_hub / "model", **load_kwargs(CPU, mapping=mapping))
        assert model.use_kernels is True and model.kernel_config.kernel_mapping == {}
        with torch.no_grad():
            assert torch.equal(model(ids).logits, plain(ids).logits)


def test_local_path_must_exist(offline_hub):
    with pytest.raises(KernelUnavailableError, match="not a directory.*LOCAL_KERNELS"):
        hwattn.load_kernel("kernels-community/flash-attn2", local_path=offline_hub / "missing")


@pytest.mark.facts("X12", "X13")
@pytest.mark.parametrize("accel", [XPU, Accelerator("cuda"), Accelerator("rocm"), Accelerator("mps")],
                         ids=["xpu", "cuda", "rocm", "mps"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_default_kernels_is_the_installed_transformers_mapping(accel, training):
    """`default_kernels` (what examples and tests should compare with) equals the mapping read directly."""
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    every = {layer: layer for layer in get_kernel_mapping_transformers()}
    expected = {layer: f"{repo}:{name}" for layer, (repo, name) in expected_defaults(every, accel.kind, training).items()}
    assert hwattn.default_kernels(accel, training=training) == expected
    assert expected or accel.kind == "mps"  # the check compares real entries (MPS has none from 5.25 on)


def test_default_kernels_where_hub_kernels_are_not_used(monkeypatch):
    import hwattn.environment

    assert hwattn.default_kernels(HPU) == {}
    monkeypatch.setattr(hwattn.environment, "kernels_available", lambda: False)
    with pytest.raises(hwattn.KernelsMissingError, match="default kernel mapping needs `kernels`"):
        hwattn.default_kernels(XPU)


def test_use_kernels_off_is_passed_so_no_release_turns_hub_kernels_on(tmp_path):
    """transformers 5.25 defaults use_kernels to True (USE_HUB_KERNELS): a load without kernels must say False,
    or from_pretrained kernelizes and, on CUDA, fetches kernels from the Hub (found on the H200)."""
    import inspect

    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    kwargs = load_kwargs(CPU)
    assert kwargs["use_kernels"] is False
    model = AutoModelForCausalLM.from_pretrained(tmp_path, **kwargs)
    assert model.use_kernels is False
    source = inspect.getsource(transformers.PreTrainedModel.from_pretrained)
    if "elif use_kernels is None:" in source:  # the release whose default is on: absent means True there
        unsaid = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
        assert unsaid.use_kernels is True
