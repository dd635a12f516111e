"""Attention chosen from what the model can run (issue 25, point 4): the model class's declared support,
read from the config without loading weights, checked side by side with what Transformers itself does.

Tiny models are built from config classes (never downloaded). The oracle is Transformers: building
the model with no `attn_implementation` gives its own default, and building it with a name it does
not declare raises; hwattn must agree, before anything is built.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import hwattn
import pytest
from hwattn import (
    AttentionEnvironment,
    AttentionUnsupportedError,
    ModelAttentionError,
    model_support,
    resolve_attention,
)
from hwenv import Accelerator

CPU = Accelerator("cpu", torch_version="2.8.0")
H200 = Accelerator("cuda", capability=(9, 0), torch_version="2.8.0")
XPU = Accelerator("xpu", torch_version="2.8.0")
KERNELS = AttentionEnvironment(kernels_available=True, flash_packages=frozenset({"flash_attention_2"}))

LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, head_dim=8, max_position_embeddings=64)
#: config class -> tiny arguments (15 families; Gemma2, Bloom, Mamba and, on 5.22, GPT-J declare no sdpa).
FAMILIES: dict[str, dict] = {
    "LlamaConfig": LLAMA_LIKE, "Qwen2Config": LLAMA_LIKE, "Qwen3Config": LLAMA_LIKE, "MistralConfig": LLAMA_LIKE,
    "GemmaConfig": LLAMA_LIKE, "Gemma2Config": LLAMA_LIKE, "Gemma3TextConfig": LLAMA_LIKE,
    "Phi3Config": {**{k: v for k, v in LLAMA_LIKE.items() if k != "head_dim"}, "pad_token_id": 0},
    "MixtralConfig": {**LLAMA_LIKE, "num_local_experts": 2, "num_experts_per_tok": 1},
    "GPT2Config": dict(n_embd=32, n_layer=1, n_head=4, vocab_size=64, n_positions=64),
    "GPTNeoXConfig": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                          vocab_size=64),
    "GPTJConfig": dict(n_embd=32, n_layer=1, n_head=4, vocab_size=64, n_positions=64, rotary_dim=4),
    "OPTConfig": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, ffn_dim=64, vocab_size=64,
                      word_embed_proj_dim=32),
    "BloomConfig": dict(hidden_size=32, n_layer=1, n_head=4, vocab_size=64),
    "MambaConfig": dict(hidden_size=32, num_hidden_layers=1, vocab_size=64, state_size=4),
}


def tiny(name: str):
    import transformers

    return getattr(transformers, name)(**FAMILIES[name])


def transformers_builds(config, attention: str | None) -> str | Exception:
    """What Transformers does with `attention` for this config: the implementation it sets, or its error."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attention)
    except (ValueError, ImportError) as error:
        return error
    return model.config._attn_implementation


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_is_what_transformers_itself_picks(family):
    config = tiny(family)
    choice = resolve_attention(CPU, "auto", model_config=config)
    assert choice.implementation == transformers_builds(config, None)
    assert choice.model_class == model_support(config).model_class


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention", ["sdpa", "eager", "flex_attention"])
def test_an_explicit_request_fails_before_loading_exactly_where_transformers_refuses(family, attention):
    config = tiny(family)
    outcome = transformers_builds(config, attention)
    if isinstance(outcome, Exception):
        with pytest.raises(ModelAttentionError) as info:
            resolve_attention(CPU, attention, model_config=config)
        message = str(info.value)
        cls = model_support(config).model_class
        assert cls in message and repr(attention) in message and "'eager'" in message  # class, backend, alternative
        assert cls in str(outcome)  # ... and Transformers' own refusal names the same class
        assert isinstance(info.value, AttentionUnsupportedError) and isinstance(info.value, ValueError)
    else:
        assert resolve_attention(CPU, attention, model_config=config).implementation == outcome == attention


def test_gemma2_the_issue_case():
    """Issue 25 (a): a Gemma2 model was planned with sdpa and then failed to load."""
    config = tiny("Gemma2Config")
    refusal = transformers_builds(config, "sdpa")
    assert "does not support an attention implementation through torch.nn.functional.scaled_dot_product_attention" \
        in str(refusal)
    auto = resolve_attention(CPU, "auto", model_config=config)
    assert auto.implementation == "eager" and not auto.fallback and auto.model_class == "Gemma2ForCausalLM"
    assert "auto -> eager: Gemma2ForCausalLM does not support sdpa" in auto.reason
    assert "Gemma2ForCausalLM._supports_sdpa is False in transformers" in auto.reason
    with pytest.raises(ModelAttentionError) as info:
        resolve_attention(CPU, "sdpa", model_config=config)
    message = str(info.value)
    assert message.startswith("'sdpa' cannot run Gemma2ForCausalLM: the model class does not support "
                              "torch.nn.functional.scaled_dot_product_attention (sdpa)")
    assert "On CPU Gemma2ForCausalLM runs 'eager', 'flex_attention';" in message
    assert "'auto' (-> 'eager')" in message and "fallback=True" in message
    # H200 with kernels: the alternatives include FlashAttention, which Gemma2 declares.
    with pytest.raises(ModelAttentionError, match=r"runs 'eager', 'flash_attention_2', 'flash_attention_3', "
                                                  r"'flash_attention_4', 'flex_attention'"):
        resolve_attention(H200, "sdpa", model_config=config, environment=KERNELS)


def test_gemma2_loads_with_what_hwattn_chose(tmp_path):
    """The plan and the load agree: load_kwargs(model_config=...) gives an implementation Gemma2 loads with."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny("Gemma2Config")
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    kwargs = hwattn.load_kwargs(CPU, "auto", model_config=config)
    assert kwargs == {"attn_implementation": "eager", "use_kernels": False}
    model = AutoModelForCausalLM.from_pretrained(tmp_path, **kwargs)
    assert model.config._attn_implementation == "eager"
    assert model.use_kernels is False  # transformers >= 5.25 turns hub kernels on when use_kernels is absent
    with torch.no_grad():
        assert model(torch.arange(5).unsqueeze(0)).logits.shape == (1, 5, 64)
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        AutoModelForCausalLM.from_pretrained(tmp_path, **hwattn.load_kwargs(CPU, "auto"))  # no config: sdpa


def test_fallback_true_takes_the_best_backend_the_model_declares(caplog):
    caplog.set_level(logging.WARNING, logger="hwattn.resolve")
    gemma2 = tiny("Gemma2Config")
    choice = resolve_attention(CPU, "sdpa", model_config=gemma2, fallback=True)
    assert (choice.implementation, choice.fallback) == ("eager", True)
    assert "sdpa requested, but Gemma2ForCausalLM does not support sdpa" in choice.reason
    assert any("attention fallback" in r.getMessage() and "Gemma2ForCausalLM" in r.getMessage()
               for r in caplog.records)
    # A device fallback (flash on CPU -> sdpa) continues to eager for a model without sdpa.
    flash = resolve_attention(CPU, "flash_attention_2", model_config=gemma2, fallback=True)
    assert flash.implementation == "eager" and flash.fallback
    assert "fallback=True -> sdpa" in flash.reason and "Gemma2ForCausalLM does not support sdpa" in flash.reason
    bloom = resolve_attention(H200, "flex_attention", model_config=tiny("BloomConfig"), fallback=True)
    assert bloom.implementation == "eager" and bloom.fallback


def test_flash_needs_the_models_flash_declaration():
    bloom = tiny("BloomConfig")  # no sdpa, no flash, no flex
    assert model_support(bloom).flash is False
    for request in ("flash_attention_2", "kernels-community/flash-attn2"):
        with pytest.raises(ModelAttentionError, match=r"BloomForCausalLM.*FlashAttention.*_supports_flash_attn is False"):
            resolve_attention(H200, request, model_config=bloom, environment=KERNELS)
    with pytest.raises(ModelAttentionError, match="BloomForCausalLM"):
        resolve_attention(XPU, "flash_attention_2", model_config=bloom, environment=KERNELS)
    llama = resolve_attention(XPU, "flash_attention_2", model_config=tiny("LlamaConfig"), environment=KERNELS)
    assert llama.implementation == "kernels-community/flash-attn2" and "LlamaForCausalLM" in llama.reason
    # The device rule still comes first where the model would allow it: FA3 is NVIDIA-only (X8).
    with pytest.raises(AttentionUnsupportedError, match="only on NVIDIA") as info:
        resolve_attention(XPU, "flash_attention_3", model_config=tiny("LlamaConfig"), environment=KERNELS)
    assert not isinstance(info.value, ModelAttentionError)


@pytest.mark.parametrize("view", ["config", "dict", "namespace", "architectures only"])
def test_the_class_is_found_from_any_form_of_the_config(view):
    config = tiny("Gemma2Config")
    given = {"config": config, "dict": config.to_dict(), "namespace": SimpleNamespace(**config.to_dict()),
             "architectures only": {"architectures": ["Gemma2ForCausalLM"]}}[view]
    support = model_support(given)
    assert (support.model_class, support.sdpa, support.flash, support.flex) == ("Gemma2ForCausalLM", False, True, True)
    assert resolve_attention(CPU, "auto", model_config=given).implementation == "eager"
    how = {"config": "AutoModelForCausalLM for Gemma2Config", "dict": "model_type 'gemma2'",
           "namespace": "model_type 'gemma2'", "architectures only": "config.architectures"}[view]
    assert how in support.source


def test_a_config_json_dict_also_refines_gqa_from_its_text_config():
    config = tiny("LlamaConfig").to_dict()
    gqa = resolve_attention(Accelerator("xpu", torch_version="2.8.0"), "sdpa", model_config=config)
    mha = resolve_attention(Accelerator("xpu", torch_version="2.8.0"), "sdpa",
                            model_config={**config, "num_key_value_heads": 4})
    assert gqa.gqa_native is True and mha.gqa_native is None  # MHA: no grouped-query attention to speak of
    nested = {"model_type": "llava", "text_config": {**config}}
    assert resolve_attention(Accelerator("xpu", torch_version="2.8.0"), "sdpa",
                             model_config=nested).gqa_native is True


def test_nothing_is_built_or_loaded(monkeypatch):
    from transformers import Gemma2ForCausalLM

    def boom(*args, **kwargs):
        raise AssertionError("model_support must not build the model")

    monkeypatch.setattr(Gemma2ForCausalLM, "__init__", boom)
    monkeypatch.setattr(Gemma2ForCausalLM, "from_pretrained", boom)
    assert resolve_attention(CPU, "auto", model_config=tiny("Gemma2Config")).implementation == "eager"


def test_unknown_classes_are_left_to_transformers_and_said_so():
    remote = {"model_type": "mymodel", "auto_map": {"AutoModelForCausalLM": "modeling_my.MyForCausalLM"},
              "architectures": ["MyForCausalLM"]}
    support = model_support(remote)
    assert not support.known and "remote code (modeling_my.MyForCausalLM)" in support.source
    choice = resolve_attention(CPU, "sdpa", model_config=remote)
    assert choice.implementation == "sdpa" and choice.model_class is None
    assert "model class not checked: the config maps AutoModelForCausalLM to remote code" in choice.reason
    assert "no Transformers model class for model_type 'not-a-model'" in model_support({"model_type": "not-a-model"}).source
    assert "neither architectures nor a model_type" in model_support(SimpleNamespace(num_attention_heads=4)).source
    # Without a model config nothing about the model is said (the decision tables stay per device).
    plain = resolve_attention(CPU, "auto")
    assert plain.model_class is None and "model class" not in plain.reason


def test_model_class_overrides_the_lookup():
    from transformers import LlamaForCausalLM

    class NoSdpa(LlamaForCausalLM):
        _supports_sdpa = False

    config = tiny("LlamaConfig")
    assert resolve_attention(CPU, "auto", model_config=config).implementation == "sdpa"
    choice = resolve_attention(CPU, "auto", model_config=config, model_class=NoSdpa)
    assert choice.implementation == "eager" and choice.model_class == "NoSdpa" and "NoSdpa (given)" in choice.reason
    assert model_support(model_class="Gemma2ForCausalLM").sdpa is False
    assert "is not a model class" in model_support(model_class="NoSuchModel").source


def test_a_models_compatible_flash_kernels_replace_a_flash_request():
    """Transformers swaps a flash request for the first of `_compatible_flash_implementations` that has a build
    for the device; hwattn plans the same kernel."""
    from transformers import LlamaForCausalLM

    class OwnKernels(LlamaForCausalLM):
        _compatible_flash_implementations = ["kernels-community/flash-attn3", "kernels-community/flash-attn2"]

    xpu = resolve_attention(XPU, "flash_attention_2", model_class=OwnKernels, environment=KERNELS)
    assert xpu.implementation == "kernels-community/flash-attn2"  # flash-attn3 ships CUDA builds only
    assert "flash_attention_2 -> kernels-community/flash-attn2: OwnKernels lists its compatible flash" in xpu.reason
    cuda = resolve_attention(H200, "flash_attention_2", model_class=OwnKernels, environment=KERNELS)
    assert cuda.implementation == "kernels-community/flash-attn3"


def test_load_kwargs_and_the_plan_agree_for_every_family():
    for family in FAMILIES:
        config = tiny(family)
        assert hwattn.load_kwargs(CPU, "auto", model_config=config)["attn_implementation"] == \
            resolve_attention(CPU, "auto", model_config=config).implementation
