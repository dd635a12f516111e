"""The attention flags read from Transformers' source (hwattn.declared, issue 40 point 3) equal the imported
classes' own, and planning an attention choice for a config.json imports neither Transformers nor its
modeling code. Every causal LM of the installed Transformers is compared in `test_every_causal_lm...`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hwattn import model_support
from hwattn.declared import (
    FLAGS,
    NO_FLAG_BASES,
    PRETRAINED_DEFAULTS,
    declared_flags,
    source_constant,
)
from hwattn.environment import kernels_available_from_source

#: (model_type, architecture): own folder, a prefix folder (gemma3_text -> gemma3), another family's class
#: (exaone -> llama), a file named after the type (data2vec-text), classes bound twice in a module (xlstm),
#: sdpa declared False (gemma2, bloom), GPT-2's LMHeadModel, a MoE.
CASES = [("llama", "LlamaForCausalLM"), ("gemma2", "Gemma2ForCausalLM"), ("bloom", "BloomForCausalLM"),
         ("gpt2", "GPT2LMHeadModel"), ("gemma3_text", "Gemma3ForCausalLM"), ("exaone", "LlamaForCausalLM"),
         ("data2vec-text", "Data2VecTextForCausalLM"), ("xlstm", "xLSTMForCausalLM"), ("mixtral", "MixtralForCausalLM"),
         ("qwen3", "Qwen3ForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM")]


def _imported(name: str) -> dict[str, object]:
    import transformers

    cls = getattr(transformers, name)
    return {flag: getattr(cls, flag) for flag in FLAGS}


@pytest.mark.parametrize(("model_type", "name"), CASES)
def test_declared_flags_equal_the_imported_class(model_type, name):
    assert declared_flags(name, model_type) == _imported(name)


def test_every_causal_lm_of_the_installed_transformers_reads_the_same_or_defers():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    checked = 0
    for model_type, names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        for name in (names,) if isinstance(names, str) else names:
            read = declared_flags(name, model_type)
            if read is None:  # not understood: model_support imports the class instead (still correct)
                continue
            assert read == _imported(name), (model_type, name)
            checked += 1
    assert checked >= 0.9 * len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)  # 200 of 200 on transformers 5.25.0


def test_the_defaults_and_skipped_bases_are_transformers_own():
    from transformers import GenerationMixin, PreTrainedModel

    assert {flag: getattr(PreTrainedModel, flag) for flag in FLAGS} == PRETRAINED_DEFAULTS
    assert ("transformers.generation", "GenerationMixin") in NO_FLAG_BASES
    assert not any(hasattr(GenerationMixin, flag) for flag in FLAGS)


def test_an_unknown_class_or_type_defers_to_the_import():
    assert declared_flags("NoSuchModelForCausalLM", "llama") is None
    assert declared_flags("LlamaForCausalLM", None) is not None  # found from the class name alone
    assert declared_flags("not an identifier", "llama") is None


def test_model_support_from_a_config_json_matches_the_imported_lookup():
    config = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"}
    fast = model_support(config)
    slow = model_support(config, model_class="Gemma2ForCausalLM")  # the class imported
    assert (fast.model_class, fast.sdpa, fast.flash, fast.flex, fast.compatible_flash) == \
        (slow.model_class, slow.sdpa, slow.flash, slow.flex, slow.compatible_flash) == \
        ("Gemma2ForCausalLM", False, True, True, None)
    assert fast.source == "Gemma2ForCausalLM (config.architectures)"
    assert fast.transformers_version == slow.transformers_version


def test_kernels_window_read_from_source_matches_transformers():
    from transformers.utils import import_utils, is_kernels_available

    assert source_constant("transformers.utils.import_utils", "KERNELS_MIN_VERSION") == import_utils.KERNELS_MIN_VERSION
    assert source_constant("transformers.utils.import_utils", "KERNELS_MAX_VERSION") == import_utils.KERNELS_MAX_VERSION
    assert kernels_available_from_source() == is_kernels_available()
    assert source_constant("transformers.utils.import_utils", "NO_SUCH_CONSTANT") is None


def test_resolving_attention_for_a_config_json_imports_no_transformers():
    script = textwrap.dedent("""
        import json, sys
        import hwattn, hwenv
        choice = hwattn.resolve_attention(hwenv.Accelerator("cpu", torch_version="2.8.0"), "auto",
                                          model_config={"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
        assert choice.implementation == "sdpa" and choice.model_class == "LlamaForCausalLM", choice
        print(json.dumps(sorted(m for m in ("transformers", "torch") if m in sys.modules)))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
