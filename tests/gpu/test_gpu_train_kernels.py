"""The training kernel policy's library kernels on a real accelerator (`gpu` marker): Liger's fused linear
cross-entropy, SwiGLU, RMSNorm and RoPE, and torch's own F.linear_cross_entropy / F.rms_norm, each put on a
bf16 Llama by hwrun's per-instance patches, give the torch form's loss and LoRA gradients within bf16
tolerance, and undoing the patches restores the model (no forward left on an instance, the same outputs).
hwrun's own Triton kernels are compared too, so one run checks every candidate of the policy. Their CPU
twins are packages/hwrun/tests/test_hwrun_train_kernel_policy.py (patch mechanics, Liger under Triton's
interpreter). Skipped, with the reason, where only a CPU is here or the candidate does not run on this device.
"""

from __future__ import annotations

import copy

import pytest
from gpu_marks import ACCEL, GPU_MARKS  # tests/gpu is on sys.path (conftest.py)

pytestmark = GPU_MARKS


def _runs_here(op: str, impl: str) -> None:
    """Skip, with the policy's reason, where `impl` of `op` cannot run on this accelerator."""
    from hwrun.training.kernel_policy import candidate, runs_on

    why = runs_on(candidate(op, impl), ACCEL.kind)
    if why is not None:
        pytest.skip(f"{op}={impl} does not run on {ACCEL.kind}: {why}")


def _model():
    """A bf16 Llama (two layers, 128-dim, vocab 4096) with LoRA on q/k/v/o and random B, on the accelerator."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=4096, max_position_embeddings=256, use_cache=False)
    base = LlamaForCausalLM(cfg).to(device=ACCEL.device, dtype=torch.bfloat16).requires_grad_(False)
    base.config.use_cache = False
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                "o_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    return model


IDS_SHAPE = (4, 128)


def _ids():
    import torch

    return torch.randint(0, 4096, IDS_SHAPE, generator=torch.Generator().manual_seed(3)).to(ACCEL.device)


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}


def _assert_close(ours, reference, ids):
    """Loss within 1e-2 relative; every LoRA gradient within 5 % of its largest value (bf16 rounding)."""
    loss, grads = _loss_and_grads(ours, ids)
    ref_loss, ref_grads = _loss_and_grads(reference, ids)
    assert abs(loss.item() - ref_loss.item()) <= 1e-2 * abs(ref_loss.item())
    assert grads.keys() == ref_grads.keys() and len(grads) == 16
    for name, grad in grads.items():
        scale = ref_grads[name].abs().max().item()
        assert (grad - ref_grads[name]).abs().max().item() <= 0.05 * scale + 1e-6, name


def _own_forwards(model) -> set[str]:
    return {name for name, module in model.named_modules() if "forward" in vars(module)}


def _outputs(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("impl", ["liger", "torch", "hwrun", "inductor"])
def test_fused_loss_candidates_match_the_models_loss(impl):
    from hwrun.training.patches.fused_loss import apply_fused_loss

    _runs_here("cross_entropy", impl)
    ids = _ids()
    reference = _model()
    ours = copy.deepcopy(reference)
    before = _outputs(ours, ids)
    patch = apply_fused_loss(ours.get_base_model(), compiled=False, impl=impl)
    assert patch.applied
    _assert_close(ours, reference, ids)
    patch.undo()
    assert _own_forwards(ours) == set()
    assert (_outputs(ours, ids) - before).abs().max().item() == 0.0


@pytest.mark.parametrize("impl", ["liger", "torch"])
def test_rmsnorm_candidates_match_the_models_norm(impl):
    from hwrun.training.patches.library_kernels import apply_rmsnorm

    _runs_here("rmsnorm", impl)
    ids = _ids()
    reference = _model()
    ours = copy.deepcopy(reference)
    before = _outputs(ours, ids)
    patch = apply_rmsnorm(ours, impl)
    assert patch.reason == f"{impl} RMSNorm in 5 modules"
    _assert_close(ours, reference, ids)
    patch.undo()
    assert _own_forwards(ours) == set()
    assert (_outputs(ours, ids) - before).abs().max().item() == 0.0


def test_liger_swiglu_matches_the_models_mlp():
    from hwrun.training.patches.library_kernels import apply_liger_swiglu

    _runs_here("swiglu", "liger")
    ids = _ids()
    reference = _model()
    ours = copy.deepcopy(reference)
    before = _outputs(ours, ids)
    patch = apply_liger_swiglu(ours)
    assert patch.reason == "Liger SwiGLU in 2 modules"
    _assert_close(ours, reference, ids)
    patch.undo()
    assert _own_forwards(ours) == set()
    assert (_outputs(ours, ids) - before).abs().max().item() == 0.0


@pytest.mark.parametrize("fused", [False, True])
def test_liger_rope_matches_the_models_rotation(fused):
    from hwrun.training.patches.fused_projections import apply_fused_projections
    from hwrun.training.patches.library_kernels import apply_liger_rope

    _runs_here("rope", "liger")
    ids = _ids()
    reference = _model()
    ours = copy.deepcopy(reference)
    before = _outputs(ours, ids)
    fusion = apply_fused_projections(ours, "inductor") if fused else None
    patch = apply_liger_rope(ours)
    assert patch.reason == "Liger RoPE rotation in 2 modules"
    _assert_close(ours, reference, ids)
    patch.undo()
    if fusion is not None:
        fusion.undo()
    assert _own_forwards(ours) == set()
    assert (_outputs(ours, ids) - before).abs().max().item() == 0.0


def test_every_liger_kernel_together_under_train(tmp_path):
    """train(kernels=all liger) on this accelerator: it runs, says so per op, and ends with a finite loss."""
    import math

    import hwrun
    from hwrun.training import train_plan
    from hwrun.training.data import PackedDataset

    _runs_here("swiglu", "liger")
    import torch

    ids = torch.randint(0, 4096, (16, 128), generator=torch.Generator().manual_seed(1))
    model_dir = tmp_path / "model"
    _model().get_base_model().save_pretrained(model_dir)
    _save_tokenizer(model_dir)
    plan = train_plan(str(model_dir), device=ACCEL.kind, dtype="bfloat16", compile=False)
    result = hwrun.train(plan, PackedDataset(ids, ["random"]), lora=True, max_steps=3, batch_size=4,
                         output_dir=tmp_path / "out", plot=False, disable_tqdm=True, resume=False,
                         kernels={"cross_entropy": "liger", "swiglu": "liger", "rmsnorm": "liger", "rope": "liger"})
    for op in ("cross_entropy", "swiglu", "rmsnorm", "rope"):
        assert result.reasons[f"kernel {op}"].startswith("liger: asked for")
    assert result.reasons["loss"] == "Liger's fused linear cross-entropy"
    assert all(math.isfinite(loss) for _, loss in result.losses)


def _save_tokenizer(path) -> None:
    """A byte-level tokenizer beside the model (train() loads one with the plan)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["</s>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>").save_pretrained(path)
