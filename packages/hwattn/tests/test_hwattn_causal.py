"""hwattn_causal_sdpa: the same outputs as Transformers' sdpa, no mask for unpadded batches, reversible."""

from __future__ import annotations

import pytest
import torch
from hwattn import (
    CAUSAL_SDPA,
    causal_sdpa_mask,
    is_causal_sdpa_registered,
    register_causal_sdpa,
    unregister_causal_sdpa,
)


@pytest.fixture
def registered():
    name = register_causal_sdpa()
    yield name
    unregister_causal_sdpa()


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def test_mask_is_skipped_only_for_the_plain_causal_square():
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    common = dict(batch_size=2, q_length=5, kv_length=5, device="cpu")
    assert causal_sdpa_mask(**common, mask_function=causal_mask_function) is None
    padded = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    mask = causal_sdpa_mask(**common, mask_function=causal_mask_function, attention_mask=padded)
    assert mask.shape == (2, 1, 5, 5) and not bool(mask[0, 0, :, 0].any())  # the pad column is masked
    assert causal_sdpa_mask(**common, mask_function=sliding_window_causal_mask_function(2), local_size=2) is not None
    assert causal_sdpa_mask(**common, allow_is_causal_skip=False) is not None
    # decoding after a prefix (an offset, or more keys than queries) goes to Transformers' rule
    from transformers.masking_utils import sdpa_mask

    decode = dict(batch_size=1, q_length=1, kv_length=6, q_offset=5, device="cpu")
    assert causal_sdpa_mask(**decode) is None and sdpa_mask(**decode) is None  # Transformers' is_causal=False rule
    offset = causal_sdpa_mask(batch_size=1, q_length=2, kv_length=6, q_offset=torch.tensor(4), device="cpu")
    assert offset is not None and offset.shape == (1, 1, 2, 6)


def test_model_outputs_equal_sdpa_with_and_without_padding(registered):
    model = tiny_llama()
    ids = torch.randint(0, 97, (2, 9))
    padding = torch.ones_like(ids)
    padding[0, :3] = 0
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        padded = model(input_ids=ids, attention_mask=padding).logits
        model.set_attn_implementation(registered)
        assert model.config._attn_implementation == CAUSAL_SDPA
        torch.testing.assert_close(model(input_ids=ids).logits, plain)
        torch.testing.assert_close(model(input_ids=ids, attention_mask=padding).logits, padded)
        out = model.generate(ids[1:], max_new_tokens=4, do_sample=False)  # cache + decode steps
        model.set_attn_implementation("sdpa")
        torch.testing.assert_close(model.generate(ids[1:], max_new_tokens=4, do_sample=False), out)


def test_no_mask_reaches_attention_under_compile(registered):
    """Under torch.compile the attention sees mask None, so SDPA takes its is_causal path."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append(attention_mask is None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    model = tiny_llama()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        reference = model(input_ids=ids).logits
    AttentionInterface.register(CAUSAL_SDPA, spy)
    model.set_attn_implementation(CAUSAL_SDPA)
    compiled = torch.compile(model, backend="eager", fullgraph=False)
    with torch.no_grad():
        logits = compiled(input_ids=ids).logits
    torch.testing.assert_close(logits, reference)
    assert seen and all(seen)


def test_registration_is_idempotent_and_reversible():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    before = (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping))
    assert not is_causal_sdpa_registered()
    assert register_causal_sdpa() == register_causal_sdpa() == CAUSAL_SDPA
    assert is_causal_sdpa_registered()
    assert AttentionMaskInterface._global_mapping["sdpa"] is before[1]["sdpa"]  # nothing existing changed
    unregister_causal_sdpa()
    unregister_causal_sdpa()
    assert not is_causal_sdpa_registered()
    assert (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping)) == before
