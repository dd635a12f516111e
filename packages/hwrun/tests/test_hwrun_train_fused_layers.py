"""hwrun's training-time layer patches: fused q/k/v (+ LoRA A) and gate/up matmuls, and the RoPE
table. Each gives the unpatched model's loss and gradients, is idempotent and reversible, and
leaves a model it cannot patch exactly as it was, with the reason."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from hwrun.training.patches import fused_projections
from hwrun.training.patches.fused_projections import apply_fused_projections
from hwrun.training.patches.rope_table import apply_rope_table
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def tiny_llama(**config) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=101, max_position_embeddings=64, **config)
    model = LlamaForCausalLM(cfg)
    model.requires_grad_(False)
    return model


def lora_model(targets=TARGETS, **lora) -> torch.nn.Module:
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=targets, **lora))
    with torch.no_grad():  # B = 0 at init would hide any error in the LoRA path
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    return model


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n.replace("_orig_mod.", ""): p.grad.clone()
                           for n, p in model.named_parameters() if p.requires_grad}


def base_weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def storages(attention):
    return {attention.q_proj.base_layer.weight.untyped_storage().data_ptr(),
            attention.k_proj.base_layer.weight.untyped_storage().data_ptr(),
            attention.v_proj.base_layer.weight.untyped_storage().data_ptr()}


IDS = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(3))


def test_fused_projections_give_the_same_loss_and_lora_gradients_and_undo_restores():
    reference = lora_model()
    ours = copy.deepcopy(reference)
    before = base_weights(ours)
    patch = apply_fused_projections(ours)
    assert patch.applied and patch.reason == "one matmul for q/k/v in 2 layers and gate/up in 2 layers"
    attention = ours.get_base_model().model.layers[0].self_attn
    assert len(storages(attention)) == 1  # q/k/v base weights are views of one concatenation
    mlp = ours.get_base_model().model.layers[0].mlp
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()
    assert apply_fused_projections(ours).reason == "already applied"  # idempotent

    loss, grads = loss_and_grads(ours, IDS)
    ref_loss, ref_grads = loss_and_grads(reference, IDS)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) == 16  # A and B of q/k/v/o in 2 layers
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-6)

    patch.undo()
    patch.undo()  # a second undo does nothing
    assert len(storages(attention)) == 3 and "forward" not in vars(attention) and "forward" not in vars(mlp)
    assert not hasattr(attention, "_hwrun_qkv") and not hasattr(ours.get_base_model(), "_hwrun_fused_projections")
    after = base_weights(ours)
    assert after.keys() == before.keys() and all(torch.equal(after[n], before[n]) for n in before)
    torch.testing.assert_close(loss_and_grads(ours, IDS)[0], ref_loss, rtol=1e-6, atol=1e-6)


def test_fused_projections_hold_under_torch_compile_without_graph_breaks():
    reference = lora_model()
    ours = copy.deepcopy(reference)
    patch = apply_fused_projections(ours)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)  # a graph break raises
    loss, grads = loss_and_grads(compiled, IDS)
    ref_loss, ref_grads = loss_and_grads(reference, IDS)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6)
    patch.undo()


def test_plain_frozen_projections_fuse_without_lora():
    model = tiny_llama()
    reference = copy.deepcopy(model)
    patch = apply_fused_projections(model)
    assert patch.applied and "q/k/v in 2 layers" in patch.reason
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, reference(input_ids=IDS).logits)
    patch.undo()


@pytest.mark.parametrize(("lora", "reason"), [({"lora_dropout": 0.1}, "LoRA dropout is on"),
                                              ({"use_dora": True}, "a LoRA variant (DoRA")])
def test_lora_that_cannot_fuse_keeps_qkv_separate_and_says_why(lora, reason):
    model = lora_model(**lora)
    patch = apply_fused_projections(model)
    attention = model.get_base_model().model.layers[0].self_attn
    assert f"q/k/v not fused: {reason}" in patch.reason
    assert len(storages(attention)) == 3 and "forward" not in vars(attention)
    assert "gate/up in 2 layers" in patch.reason  # the MLP has no LoRA here and still fuses
    patch.undo()


def test_trained_base_weights_are_not_fused():
    model = tiny_llama()
    model.requires_grad_(True)
    patch = apply_fused_projections(model)
    assert not patch.applied and "the base weights are trained" in patch.reason
    assert "forward" not in vars(model.model.layers[0].self_attn)


def test_a_fused_forward_that_disagrees_is_rejected_and_the_model_left_unchanged(monkeypatch):
    model = lora_model()
    reference = copy.deepcopy(model)
    monkeypatch.setattr(fused_projections, "_mlp_forward", lambda self, x: self.down_proj(self.act_fn(x[..., :96])))
    patch = apply_fused_projections(model)
    assert "gate/up not fused: the fused forward failed on a check input" in patch.reason \
        or "gate/up not fused: the fused forward does not reproduce" in patch.reason
    mlp = model.get_base_model().model.layers[0].mlp
    assert "forward" not in vars(mlp) and not hasattr(mlp, "_hwrun_gate_up")
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() != mlp.up_proj.weight.untyped_storage().data_ptr()
    torch.testing.assert_close(loss_and_grads(model, IDS)[0], loss_and_grads(reference, IDS)[0])
    patch.undo()


def test_rope_table_returns_the_modules_own_values_and_is_reversible():
    model = tiny_llama()
    rotary = model.model.rotary_emb
    x = torch.zeros(1, dtype=torch.bfloat16)
    positions = torch.arange(24).unsqueeze(0)
    expected = rotary(x, positions)
    longer = torch.arange(40).unsqueeze(0)
    expected_longer = rotary(x, longer)
    patch = apply_rope_table(model, 32)
    assert patch.applied and "32 positions" in patch.reason
    assert apply_rope_table(model, 32).reason == "already applied"
    for got, want in zip(rotary(x, positions), expected, strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    for got, want in zip(rotary(x, longer), expected_longer, strict=True):  # beyond the table: computed
        assert torch.equal(got, want)
    patch.undo()
    assert "forward" not in vars(rotary) and not hasattr(rotary, "_hwrun_rope_table")


def test_rope_table_is_not_used_for_a_length_dependent_rope():
    model = tiny_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    patch = apply_rope_table(model, 32)
    assert not patch.applied and "changes its frequencies with the sequence length" in patch.reason
    assert "forward" not in vars(model.model.rotary_emb)


@pytest.mark.parametrize(("args", "qlora", "reason"), [
    (SimpleNamespace(fsdp="full_shard", deepspeed=None), False, "FSDP"),
    (SimpleNamespace(fsdp=[], deepspeed="ds.json"), False, "DeepSpeed"),
    (SimpleNamespace(fsdp=[], deepspeed=None), True, "4-bit"),
])
def test_sharded_and_4bit_runs_keep_projections_separate(args, qlora, reason):
    from hwrun.training.run import _fusion_blocker

    assert reason in _fusion_blocker(args, qlora)
    assert _fusion_blocker(SimpleNamespace(fsdp=[], deepspeed=None), False) is None


def test_peft_default_targets_q_and_v_fuse_with_a_plain_k():
    """PEFT's mapping for llama adapts q_proj/v_proj only: k has no LoRA; q/k/v still fuse and
    give the unfused loss and LoRA gradients."""
    from hwrun.training.lora import peft_target_mapping

    targets = list(peft_target_mapping()["llama"])
    assert "k_proj" not in targets  # the case this test is about
    reference = lora_model(targets)
    ours = copy.deepcopy(reference)
    patch = apply_fused_projections(ours)
    assert patch.applied and patch.reason == "one matmul for q/k/v in 2 layers and gate/up in 2 layers"
    attention = ours.get_base_model().model.layers[0].self_attn
    assert len(storages_mixed(attention)) == 1
    loss, grads = loss_and_grads(ours, IDS)
    ref_loss, ref_grads = loss_and_grads(reference, IDS)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 2 * len(targets)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-6)
    patch.undo()
    assert len(storages_mixed(attention)) == 3 and "forward" not in vars(attention)


def storages_mixed(attention):
    def base(module):
        return getattr(module, "base_layer", module)
    return {base(getattr(attention, n)).weight.untyped_storage().data_ptr() for n in ("q_proj", "k_proj", "v_proj")}


def test_fused_projections_decode_with_a_kv_cache_as_the_model_does():
    """With a KV cache (past_key_values up to 5.24, cache from 5.25) the patched attention gives the
    unpatched greedy tokens: the cache is updated, not dropped."""
    model = lora_model()
    reference = copy.deepcopy(model)
    patch = apply_fused_projections(model)
    assert patch.applied
    with torch.no_grad():
        got = model.generate(input_ids=IDS[:1, :6], max_new_tokens=6, do_sample=False, use_cache=True)
        want = reference.generate(input_ids=IDS[:1, :6], max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(got, want)
    patch.undo()
