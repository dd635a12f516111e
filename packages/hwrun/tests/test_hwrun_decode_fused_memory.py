"""Fused weights without a second copy: the fused step's q/k/v and gate/up matrices are built once and the
model's Linear weights become views into them, so a cached decoder adds no weight memory; the model's values,
forward, gradients and in-place loads are unchanged, and a second decoder reuses the same matrices."""

from __future__ import annotations

import torch
from hwrun.inference.decode.fused_step import FUSED_QKV, FusedLlamaStep
from hwrun.inference.decode.static import GraphDecoder
from hwrun.inference.engine import EngineCore


def _model():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    return model


def storage_bytes(*tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (what they hold in memory, shared storage once)."""
    seen = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _weights(model, step=None):
    tensors = [*model.parameters(), *model.buffers()]
    if step is not None:
        for layer in step.layers:
            tensors += [t for key, t in layer.items() if key in ("qkv", "qkv_bias", "gate_up", "gate_up_bias")
                        and t is not None]
    return tensors


def test_a_fused_step_adds_no_weight_memory():
    model = _model()
    ids = torch.tensor([[3, 7, 11, 5]])
    with torch.no_grad():
        logits = model(ids).logits
    before = storage_bytes(*_weights(model))
    separate = {name: p.data_ptr() for name, p in model.named_parameters()}
    step = FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    after = storage_bytes(*_weights(model, step))
    assert after == before, f"{after - before} extra bytes"
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv = step.layers[0]["qkv"]
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()  # the model's weights live in the fused matrix
    assert attn.k_proj.weight.data_ptr() == qkv[attn.q_proj.out_features].data_ptr()
    assert attn.v_proj.bias.untyped_storage().data_ptr() == step.layers[0]["qkv_bias"].untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == step.layers[0]["gate_up"].untyped_storage().data_ptr()
    assert attn.q_proj.weight.data_ptr() != separate["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(attn.q_proj.weight, torch.nn.Parameter) and attn.q_proj.weight.requires_grad
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)
    # the old code's copies: what a cached decoder used to cost on top of the model
    copies = sum(t.numel() * t.element_size() for layer in step.layers for t in (layer["qkv"], layer["gate_up"]))
    assert copies > 0.4 * before


def test_second_decoder_reuses_the_fused_matrices_and_loads_reach_them():
    model = _model()
    first = GraphDecoder(model, batch_size=1, max_cache_len=32)
    total = storage_bytes(*_weights(model, first.fused))
    second = EngineCore(model, slots=2, max_cache_len=32)
    assert second.runner.step.fused.layers[0]["qkv"] is first.fused.layers[0]["qkv"]
    assert storage_bytes(*_weights(model, first.fused), *_weights(model, second.runner.step.fused)) == total
    # load_state_dict copies into the views: the decoders see the new values without rebuilding
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.layers.0.self_attn.k_proj.weight"].mul_(-1.0)
    model.load_state_dict(state)
    rows = model.model.layers[0].self_attn.q_proj.out_features
    k = first.fused.layers[0]["qkv"][rows:rows + model.model.layers[0].self_attn.k_proj.out_features]
    assert torch.equal(k, state["model.layers.0.self_attn.k_proj.weight"])
    ids = torch.tensor([[3, 7, 11, 5]])
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert first.generate(ids, 6, eos_token_id=None)[0].tolist() == ref[0, 4:].tolist()


def test_a_replaced_weight_is_fused_again_not_reused():
    model = _model()
    FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    attn = model.model.layers[0].self_attn
    old = attn.__dict__[FUSED_QKV][0]
    attn.q_proj.weight = torch.nn.Parameter(attn.q_proj.weight.detach().clone() * 2)
    step = FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    assert step.layers[0]["qkv"] is not old
    assert torch.equal(step.layers[0]["qkv"][: attn.q_proj.out_features], attn.q_proj.weight)


def test_fusing_inside_inference_mode_leaves_trainable_weights():
    model = _model()
    with torch.inference_mode():
        FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert not weight.is_inference()
    model.train()
    loss = model(torch.tensor([[3, 7, 11, 5]]), labels=torch.tensor([[3, 7, 11, 5]])).loss
    loss.backward()
    assert weight.grad is not None and weight.grad.shape == weight.shape


def test_save_pretrained_after_fusing_round_trips(tmp_path):
    from transformers import AutoModelForCausalLM

    model = _model()
    FusedLlamaStep(model, batch_size=1, max_cache_len=16)
    model.save_pretrained(tmp_path, safe_serialization=True)  # shared storage must not make safetensors refuse
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
