"""The fused chunked cross-entropy equals Transformers' own causal-LM loss, values and gradients."""

from __future__ import annotations

import pytest
import torch
from hwrun.training.patches.fused_loss import (
    apply_fused_loss,
    chunk_function,
    fused_loss_support,
    linear_cross_entropy,
)


def reference(hidden, weight, targets, num_items=None):
    logits = (hidden @ weight.t()).float()
    if num_items is None:
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum") / num_items


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("num_items", [None, 31])
@pytest.mark.parametrize("compiled", [False, True])  # in place, and the out-of-place form a compiled model fuses
def test_chunked_loss_and_grads_equal_full_loss(chunk, num_items, compiled):
    torch.manual_seed(0)
    hidden = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (23,))
    targets[[0, 7, 22]] = -100
    ours = linear_cross_entropy(hidden, weight, targets, num_items_in_batch=num_items, chunk_tokens=chunk,
                                compiled=compiled)
    (g_hidden, g_weight) = torch.autograd.grad(ours * 3.0, (hidden, weight))
    ref = reference(hidden, weight, targets, num_items)
    (r_hidden, r_weight) = torch.autograd.grad(ref * 3.0, (hidden, weight))
    torch.testing.assert_close(ours, ref.to(ours.dtype), rtol=1e-6, atol=1e-6)
    # both sides compute the logits in float32 (as Transformers' loss does), hence float32 tolerances
    torch.testing.assert_close(g_hidden, r_hidden, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_weight, r_weight, rtol=1e-5, atol=1e-6)


def test_compiled_and_in_place_chunk_functions_agree_in_bf16():
    torch.manual_seed(1)
    logits = (torch.randn(6, 300) * 4).to(torch.bfloat16)
    targets = torch.tensor([3, -100, 299, 0, 17, -100])
    scale = torch.tensor(1 / 4)
    loss_a, grad_a = chunk_function(None)(logits.clone(), targets, scale)
    loss_b, grad_b = torch.compile(chunk_function(True), backend="aot_eager")(logits, targets, scale)
    assert grad_a.dtype == grad_b.dtype == torch.bfloat16
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)
    assert torch.count_nonzero(grad_b[[1, 5]]) == 0  # ignored rows get no gradient
    # each valid row of softmax - onehot sums to zero
    assert grad_b[[0, 2, 3, 4]].float().sum(dim=1).abs().max() < 1e-2


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


def test_patched_model_compiles_as_one_graph_from_a_fresh_process(monkeypatch):
    """No graph break: the loss's autograd.Function exists before Dynamo traces the forward (a class
    definition traced inside the model split the compiled model into eager pieces)."""
    import torch._dynamo
    from hwrun.training.patches import fused_loss
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.utils import counters

    monkeypatch.setattr(fused_loss, "_FUNCTION", None)  # as in a new process
    model = tiny_llama()
    apply_fused_loss(model, chunk_tokens=8, compiled=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    ids = torch.randint(0, 97, (2, 12))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(peft_model, backend="eager")
    loss = compiled(input_ids=ids, labels=ids).loss  # the first call of the loss is traced
    loss.backward()
    torch.testing.assert_close(loss, peft_model(input_ids=ids, labels=ids).loss)
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()
