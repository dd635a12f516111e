"""The fused chunked cross-entropy equals Transformers' own causal-LM loss, values and gradients."""

from __future__ import annotations

import pytest
import torch
from hwrun.training.fused_loss import apply_fused_loss, fused_loss_support, linear_cross_entropy


def reference(hidden, weight, targets, num_items=None):
    logits = (hidden @ weight.t()).float()
    if num_items is None:
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum") / num_items


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("num_items", [None, 31])
def test_chunked_loss_and_grads_equal_full_loss(chunk, num_items):
    torch.manual_seed(0)
    hidden = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (23,))
    targets[[0, 7, 22]] = -100
    ours = linear_cross_entropy(hidden, weight, targets, num_items_in_batch=num_items, chunk_tokens=chunk)
    (g_hidden, g_weight) = torch.autograd.grad(ours * 3.0, (hidden, weight))
    ref = reference(hidden, weight, targets, num_items)
    (r_hidden, r_weight) = torch.autograd.grad(ref * 3.0, (hidden, weight))
    torch.testing.assert_close(ours, ref.to(ours.dtype), rtol=1e-6, atol=1e-6)
    # both sides compute the logits in float32 (as Transformers' loss does), hence float32 tolerances
    torch.testing.assert_close(g_hidden, r_hidden, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_weight, r_weight, rtol=1e-5, atol=1e-6)


def test_frozen_weight_gets_no_gradient_and_all_ignored_is_zero():
    hidden = torch.randn(4, 8, requires_grad=True)
    weight = torch.randn(10, 8)
    loss = linear_cross_entropy(hidden, weight, torch.full((4,), -100), chunk_tokens=2)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(hidden.grad) == 0


def tiny_llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, **overrides)
    return LlamaForCausalLM(config)


def test_patched_model_loss_matches_its_own_loss_under_lora():
    from peft import LoraConfig, get_peft_model

    model = tiny_llama()
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False, task_type="CAUSAL_LM"))
    ids = torch.randint(0, 97, (2, 13))
    labels = ids.clone()
    labels[0, :4] = -100
    expected = peft_model(input_ids=ids, labels=labels)
    expected.loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.requires_grad}
    peft_model.zero_grad()

    patch = apply_fused_loss(model, chunk_tokens=5)
    assert patch.applied
    assert apply_fused_loss(model).reason == "already applied"  # idempotent
    fused = peft_model(input_ids=ids, labels=labels)
    assert fused.logits is None  # the full logits were never built
    fused.loss.backward()
    torch.testing.assert_close(fused.loss, expected.loss)
    for name, param in peft_model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.grad, ref_grads[name], msg=name)
    # num_items_in_batch (Trainer's gradient-accumulation normaliser) is honoured the same way
    with torch.no_grad():
        a = peft_model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(40)).loss
    # without labels the model's own forward runs (logits present, e.g. for generation)
    assert peft_model(input_ids=ids).logits.shape == (2, 13, 97)
    patch.undo()
    patch.undo()
    assert "forward" not in vars(model)
    with torch.no_grad():
        b = peft_model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(40)).loss
    torch.testing.assert_close(a, b)


def test_unsupported_models_keep_their_loss(caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16))
    patch = apply_fused_loss(gpt2)
    assert not patch.applied and "gpt2" in patch.reason
    assert "forward" not in vars(gpt2)
    assert fused_loss_support(tiny_llama()) is None
