"""One matmul where a layer runs several on the same input, for LoRA training on frozen bf16 weights.

In each Llama layer, q/k/v read the same normed input, and so do the MLP's gate and up
projections. Run separately they cost more than their FLOPs: the k/v matmuls are narrow (N=512 at
the benchmark's size), LoRA adds a rank-16 A matmul per projection, and the backward sums one
input gradient per matmul (six for q/k/v with LoRA) before the RMSNorm backward. Fused, each group
is one base matmul over the concatenated weights and one LoRA A matmul over the concatenated A
matrices; the input gradient is then two matmuls for the whole group.

The frozen base weights are concatenated once; each projection's weight becomes a view into the
concatenation, so no memory is added. LoRA's trainable A/B parameters stay where PEFT put them
(its adapter saving is unchanged) and are concatenated per step (a few KiB). `undo()` restores
separate weights and the original forwards. Patching checks on a small input that the fused
forward gives what the original gives, and leaves the model as it was where it does not.

With SiLU and gate/up without LoRA, the MLP's `silu(gate) * up` runs through `swiglu` on the
fused matmul's output (its backward in torch, compiled by inductor).

Why kept: measured together with the RoPE table, this layer path gained +2.4 % and +3.2 % end to end in two
H200 calls (hwrun 87,844 vs 85,825 and 89,899 vs 87,136 tokens/s without both, docs/benchmarks/train.md, the
fused layer path); the two shares were not measured apart."""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any

from .record import ModelPatch
from .rope_table import rotary_module
from .swiglu import prepare_swiglu, swiglu

logger = logging.getLogger(__name__)

_FLAG = "_hwrun_fused_projections"
_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")
_SILU = ("SiLUActivation", "SiLU")  # Transformers' ACT2FN["silu"], torch.nn.SiLU


class _Unfusable(Exception):
    """A group of projections cannot be fused; the message says why."""


def _plain_linear(module: Any) -> bool:
    import torch

    return type(module) is torch.nn.Linear


def _lora_linear(module: Any) -> bool:
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return type(module) is LoraLinear


def _adapter(module: Any) -> str:
    """The one plain-LoRA adapter of a PEFT lora.Linear, or _Unfusable."""
    import torch

    active = list(module.active_adapters)
    if len(active) != 1 or module.merged or module.disable_adapters:
        raise _Unfusable("adapters are merged, disabled or more than one is active")
    name = active[0]
    if name in getattr(module, "lora_variant", {}) or module.use_dora.get(name, False):
        raise _Unfusable("a LoRA variant (DoRA, ...) is active")
    if not isinstance(module.lora_dropout[name], torch.nn.Identity):
        raise _Unfusable("LoRA dropout is on (each projection draws its own mask)")
    if module.lora_B[name].bias is not None or not _plain_linear(module.lora_A[name]):
        raise _Unfusable("the LoRA A/B layers are not bias-free Linear layers")
    return name


def _base(module: Any) -> Any:
    return module.base_layer if _lora_linear(module) else module


class _FusedGroup:
    """Projections `modules` (each a plain frozen Linear or a PEFT lora.Linear on one) of the same
    input, computed with one base matmul and one LoRA A matmul over the projections that have LoRA
    (PEFT's default for Llama adapts q and v, not k)."""

    def __init__(self, modules: Sequence[Any]) -> None:
        lora = [_lora_linear(m) for m in modules]
        bases = [_base(m) for m in modules]  # without LoRA, the projections themselves
        if not all(_plain_linear(b) for b in bases):
            raise _Unfusable("a projection's base layer is not a torch.nn.Linear (quantized or custom)")
        weights = [b.weight for b in bases]
        if any(w.requires_grad for w in weights):
            raise _Unfusable("the base weights are trained (fusing is for frozen bases)")
        if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
            raise _Unfusable("the base weights differ in dtype, device or input size")
        if len({b.bias is None for b in bases}) != 1:
            raise _Unfusable("some base layers have a bias and some do not")
        self.modules = list(modules)
        self.bases = bases
        self.lora = any(lora)
        # (position in the group, module, adapter name) of the projections with LoRA
        self.adapted = [(i, m, _adapter(m)) for i, m in enumerate(modules) if lora[i]]
        if len({m.lora_A[n].weight.dtype for _, m, n in self.adapted}) > 1:
            raise _Unfusable("the LoRA A matrices differ in dtype")
        self.sizes = [w.shape[0] for w in weights]
        self.weight: Any = None
        self.bias: Any = None

    def fuse(self) -> None:
        """Concatenate the base weights once; each base weight becomes a view into the result."""
        import torch

        with torch.no_grad():
            self.weight = torch.cat([b.weight for b in self.bases])
            self.bias = None if self.bases[0].bias is None else torch.cat([b.bias for b in self.bases])
        start = 0
        for base, size in zip(self.bases, self.sizes, strict=True):
            base.weight = torch.nn.Parameter(self.weight[start:start + size], requires_grad=False)
            if self.bias is not None:
                base.bias = torch.nn.Parameter(self.bias[start:start + size], requires_grad=False)
            start += size

    def unfuse(self) -> None:
        """Give each base weight its own storage again (the state a save or merge expects)."""
        import torch

        with torch.no_grad():
            for base in self.bases:
                base.weight = torch.nn.Parameter(base.weight.clone(), requires_grad=False)
                if base.bias is not None:
                    base.bias = torch.nn.Parameter(base.bias.clone(), requires_grad=False)
        self.weight = self.bias = None

    def joint(self, x: Any) -> Any:
        """The base matmul's output, not split: the projections side by side on the last dimension."""
        import torch.nn.functional as F

        return F.linear(x, self.weight, self.bias)

    def __call__(self, x: Any) -> list[Any]:
        """The projections of `x`, as the separate modules compute them."""
        import torch
        import torch.nn.functional as F

        base = F.linear(x, self.weight, self.bias)
        outputs = list(base.split(self.sizes, dim=-1))
        if not self.lora:
            return outputs
        _, first, name = self.adapted[0]
        lora_x = first._cast_input_dtype(x, first.lora_A[name].weight.dtype)
        a = torch.cat([m.lora_A[n].weight for _, m, n in self.adapted])
        ranks = [m.lora_A[n].weight.shape[0] for _, m, n in self.adapted]
        hidden = F.linear(lora_x, a).split(ranks, dim=-1)
        for (i, m, n), h in zip(self.adapted, hidden, strict=True):
            outputs[i] = (outputs[i] + F.linear(h, m.lora_B[n].weight) * m.scaling[n]).to(outputs[i].dtype)
        return outputs


#: The KV-cache keyword of LlamaAttention.forward: `past_key_values` up to Transformers 5.24, `cache` from 5.25.
_CACHE_KEYWORDS = ("past_key_values", "cache")


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """LlamaAttention.forward (Transformers 5.x) with q/k/v from one fused group (or the separate projections
    where the instance has no group) and the rotation the instance names (`_hwrun_rotary`). With a KV cache
    (decoding; its keyword and update() differ between releases) the class's own forward runs on the
    separate projections, whose weights are views of the fused one."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if any(kwargs.get(name) is not None for name in _CACHE_KEYWORDS):
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, **kwargs)
    for name in _CACHE_KEYWORDS:
        kwargs.pop(name, None)
    module = sys.modules[type(self).__module__]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    fused = getattr(self, "_hwrun_qkv", None)
    if fused is not None:
        query, key, value = fused(hidden_states)
    else:  # q/k/v not fused here: the forward was set only for another kernel (library_kernels.apply_liger_rope)
        query, key, value = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
    query_states = query.view(hidden_shape).transpose(1, 2)
    key_states = key.view(hidden_shape).transpose(1, 2)
    value_states = value.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    rotate = getattr(self, "_hwrun_rotary", None) or module.apply_rotary_pos_emb  # a library kernel, or the model's
    query_states, key_states = rotate(query_states, key_states, cos, sin)
    attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, module.eager_attention_forward)
    attn_output, attn_weights = attention_interface(
        self, query_states, key_states, value_states, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights


def _mlp_forward(self, x):
    """LlamaMLP.forward with gate and up from one fused group. With SiLU and no LoRA on gate/up,
    `swiglu` takes the one [gate | up] matmul output and writes both halves of its gradient at once."""
    group = self._hwrun_gate_up
    if not group.lora and type(self.act_fn).__name__ in _SILU and group.sizes[0] == group.sizes[1]:
        return self.down_proj(swiglu(group.joint(x)))
    gate, up = group(x)
    return self.down_proj(self.act_fn(gate) * up)


def _check_hidden(weight: Any) -> Any:
    """A small fixed random (1, 4, in_features) input for the patch-time check of a projection group."""
    import torch

    return torch.randn(1, 4, weight.shape[1], dtype=weight.dtype, device=weight.device,
                       generator=torch.Generator(weight.device).manual_seed(0))


def _attention_check_inputs(model: Any, weight: Any):
    import torch

    hidden = _check_hidden(weight)
    positions = torch.arange(hidden.shape[1], device=weight.device).unsqueeze(0)
    return (hidden,), {"position_embeddings": rotary_module(model)(hidden, positions), "attention_mask": None}


def _close(a: Any, b: Any) -> bool:
    import torch

    scale = max(float(b.float().abs().max()), 1e-6)
    return bool(torch.isfinite(a.float()).all()) and float((a.float() - b.float()).abs().max()) <= 2e-2 * scale


def _patch_one(module: Any, names: tuple[str, ...], attribute: str, forward: Any, check_inputs: Any) -> Any:
    """Fuse `names` of `module` and swap its forward; returns an undo, or raises _Unfusable (and
    leaves `module` unchanged) when the fused forward does not reproduce the original one."""
    import torch

    if "forward" in vars(module):
        raise _Unfusable(f"{type(module).__name__}.forward is already replaced on this instance")
    group = _FusedGroup([getattr(module, n) for n in names])
    args, kwargs = check_inputs(group.bases[0].weight)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            expected = module(*args, **kwargs)
            group.fuse()
            setattr(module, attribute, group)
            module.forward = types.MethodType(forward, module)
            got = module(*args, **kwargs)
    except Exception as exc:
        _restore(module, group, attribute)
        raise _Unfusable(f"the fused forward failed on a check input ({type(exc).__name__}: {exc})") from exc
    finally:
        module.train(was_training)
    expected = expected[0] if isinstance(expected, tuple) else expected
    got = got[0] if isinstance(got, tuple) else got
    if not _close(got, expected):
        _restore(module, group, attribute)
        raise _Unfusable("the fused forward does not reproduce this module's own forward")
    return lambda: _restore(module, group, attribute)


def _restore(module: Any, group: _FusedGroup, attribute: str) -> None:
    if "forward" in vars(module):
        del module.forward
    if attribute in vars(module):
        delattr(module, attribute)
    if group.weight is not None:
        group.unfuse()


def apply_fused_projections(model: Any, swiglu_kernel: str = "auto") -> ModelPatch:
    """Fuse q/k/v (with their LoRA A matrices) and gate/up in every decoder layer of `model` (a
    PEFT or plain Transformers causal LM with frozen base weights). Explicit, idempotent,
    reversible (`.undo()`); layers or groups that cannot be fused run as before, with the reason
    logged. `swiglu_kernel` is the kernel policy's SwiGLU choice: 'auto' (the policy's for the model's device),
    'inductor' (gate/up fused, `swiglu` on their output) or 'liger' (gate/up left separate: Liger's SwiGLU
    kernel takes them as two tensors, see `library_kernels.apply_liger_swiglu`); hwrun 0.1.0's 'torch' is
    'inductor' (a FutureWarning)."""
    from hwrun.devices import kind_of_device_type

    from ..kernel_policy import OLD_VALUES, choose, from_old_keyword

    base_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    if swiglu_kernel in OLD_VALUES and swiglu_kernel != "auto":  # hwrun 0.1.0's 'torch'/'triton'
        swiglu_kernel = from_old_keyword("swiglu_kernel", swiglu_kernel, replacement="swiglu_kernel={impl!r}")
    parameter = next(iter(base_model.parameters()), None)
    swiglu_kernel = choose("swiglu", swiglu_kernel, kind_of_device_type(parameter.device.type if parameter
                                                                         is not None else "cpu"))
    if getattr(base_model, _FLAG, None) is not None:
        return ModelPatch(True, "already applied")
    prepare_swiglu()  # its autograd.Function exists before any trace
    decoder = base_model.get_decoder() if hasattr(base_model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        return ModelPatch(False, "the model has no decoder.layers")
    undo: list[Any] = []
    skipped: dict[str, str] = {}
    fused = {"q/k/v": 0, "gate/up": 0}
    for layer in layers:
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        groups = (("q/k/v", attention, _QKV, "_hwrun_qkv", _attention_forward,
                   lambda w: _attention_check_inputs(base_model, w)),
                  ("gate/up", mlp, _GATE_UP, "_hwrun_gate_up", _mlp_forward,
                   lambda w: ((_check_hidden(w),), {})))
        for label, module, names, attribute, forward, check in groups:
            if label in skipped:
                continue
            if label == "gate/up" and swiglu_kernel == "liger":
                skipped[label] = "swiglu='liger' runs Liger's kernel on separate gate and up outputs"
                continue
            if module is None or not all(hasattr(module, n) for n in names):
                skipped[label] = f"the layers have no {'/'.join(names)}"
                continue
            if label == "q/k/v" and type(module).__name__ != "LlamaAttention":
                skipped[label] = f"{type(module).__name__} is not LlamaAttention (its forward is replaced)"
                continue
            try:
                undo.append(_patch_one(module, names, attribute, forward, check))
                fused[label] += 1
            except _Unfusable as exc:
                skipped[label] = str(exc)
    for label, why in skipped.items():
        logger.info("%s projections not fused: %s; they run as separate matmuls.", label, why)
    done = [f"{label} in {count} layers" for label, count in fused.items() if count]
    if not done:
        return ModelPatch(False, "; ".join(f"{k}: {v}" for k, v in skipped.items()) or "nothing to fuse")
    setattr(base_model, _FLAG, True)
    undo.insert(0, lambda: delattr(base_model, _FLAG))
    reason = "one matmul for " + " and ".join(done)
    if skipped:
        reason += " (" + "; ".join(f"{k} not fused: {v}" for k, v in skipped.items()) + ")"
    logger.info("Fused projections: %s.", reason)
    return ModelPatch(True, reason, undo)
