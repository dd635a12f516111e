"""Chunked linear + cross-entropy loss for causal LMs: the LM-head logits are computed one chunk
of tokens at a time and the gradient is formed in the same pass, so the full
(batch x seq x vocab) fp32 logits tensor (4.2 GB for 8x1024x128256) never exists.

Per chunk, the loss and d(loss)/d(logits) are computed either in place (eager: about eight passes
over a 1024 x 128256 fp32 block, one fp32 copy alive) or, with `compiled=True`, out of place: the
form that the model's own `torch.compile` fuses into a reduction and one pointwise pass (bf16 in,
bf16 gradient out). The loss is not compiled separately: a nested `torch.compile` is a graph
break in the model's compiled graph (measured on torch 2.11), and so is a class defined during
tracing, which is why the autograd.Function is built before the model runs."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any

from ...errors import TrainingConfigError

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
DEFAULT_CHUNK_TOKENS = 1024
# Architectures whose CausalLM head is `logits = lm_head(norm(hidden))` with nothing after it
# (no soft-capping, no logit scale), so the fused loss is exactly the model's own loss.
FUSED_LOSS_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_FLAG = "_hwrun_fused_loss"


def _chunk_loss(full, targets):
    """(valid rows, targets with ignored rows at 0, per-row logsumexp, summed CE of the valid rows)
    of one chunk's fp32 logits."""
    import torch

    valid = targets != IGNORE_INDEX
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    lse = torch.logsumexp(full, dim=-1)
    picked = full.gather(1, safe.unsqueeze(1)).squeeze(1)
    return valid, safe, lse, torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()


def _chunk_loss_grad(logits, targets, scale):
    """(summed CE of the valid rows, d(sum * scale)/d(logits) in logits' dtype), out of place:
    the form `torch.compile` fuses into a reduction and one pointwise pass."""
    import torch

    full = logits.float()
    valid, safe, lse, loss = _chunk_loss(full, targets)
    onehot = torch.arange(full.shape[1], device=full.device).unsqueeze(0) == safe.unsqueeze(1)
    grad = (torch.exp(full - lse.unsqueeze(1)) - onehot.to(full.dtype)) * (valid.to(full.dtype) * scale).unsqueeze(1)
    return loss, grad.to(logits.dtype)


def _chunk_loss_grad_in_place(logits, targets, scale):
    """The same as `_chunk_loss_grad`, eagerly, reusing one fp32 copy of the logits for the gradient."""
    import torch

    full = logits.float()
    valid, safe, lse, loss = _chunk_loss(full, targets)
    grad = full.sub_(lse.unsqueeze(1)).exp_()  # softmax - onehot, scaled, in place (no copies)
    grad.scatter_add_(1, safe.unsqueeze(1), -torch.ones_like(safe.unsqueeze(1), dtype=grad.dtype))
    grad.mul_(valid.unsqueeze(1).to(grad.dtype) * scale)
    return loss, grad.to(logits.dtype)


#: The chunk form of `linear_cross_entropy` (its `kernel`): 'triton' is hwrun's Triton chunk kernel (`ce_kernel`),
#: 'torch' the torch form, 'auto' the kernel policy's choice for the device (`hwrun.training.kernel_policy`).
KERNELS = ("auto", "torch", "triton")


def check_kernel(kernel: str) -> None:
    """Reject a `kernel` value that is not one of KERNELS, saying what each one does."""
    if kernel not in KERNELS:
        raise TrainingConfigError(f"kernel={kernel!r} is not one of {KERNELS}: 'auto' runs the kernel policy's "
                                  "choice for the device (the Triton chunk kernel on CUDA, the torch form "
                                  "elsewhere), 'torch' always the torch form, 'triton' the kernel (CUDA, or any "
                                  "device under TRITON_INTERPRET=1).")


def chunk_function(compiled: bool = False, kernel: str = "torch", kind: str | None = "cpu"):
    """The per-chunk loss/gradient function: hwrun's Triton kernel (`kernel='triton'`, or 'auto' where the
    kernel policy chooses it on the platform `kind`), else the torch form: out of place for a compiled
    model, in place otherwise."""
    check_kernel(kernel)
    if kernel == "auto":
        from ..kernel_policy import choose

        kernel = "triton" if choose("cross_entropy", "auto", kind) == "hwrun" else "torch"
    if kernel == "triton":
        from .ce_kernel import chunk_ce_triton

        return chunk_ce_triton
    return _chunk_loss_grad if compiled else _chunk_loss_grad_in_place


def _fused_function():
    import torch
    import torch.nn.functional as F

    class LinearCrossEntropy(torch.autograd.Function):
        """sum(CE(hidden @ weight.T, targets)) * scale, gradient computed chunk by chunk in forward."""

        @staticmethod
        def forward(ctx, hidden, weight, targets, scale, chunk_tokens, chunk_fn):  # noqa: D401
            need_hidden = hidden.requires_grad
            need_weight = weight.requires_grad
            grad_hidden = torch.zeros_like(hidden) if need_hidden else None
            grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, hidden.shape[0], chunk_tokens):
                h = hidden[start:start + chunk_tokens]
                t = targets[start:start + chunk_tokens]
                if not (need_hidden or need_weight):  # evaluation: the loss alone
                    total = total + F.cross_entropy((h @ weight.t()).float(), t, ignore_index=IGNORE_INDEX,
                                                    reduction="sum")
                    continue
                loss, grad = chunk_fn(h @ weight.t(), t, scale)
                total = total + loss
                grad = grad.to(weight.dtype)
                if need_hidden:
                    grad_hidden[start:start + chunk_tokens] = grad @ weight
                if need_weight:
                    grad_weight += (grad.t() @ h.to(weight.dtype)).float()
            ctx.save_for_backward(*(g for g in (grad_hidden, grad_weight) if g is not None))
            ctx.has = (need_hidden, need_weight)
            ctx.weight_dtype = weight.dtype
            return total * scale

        @staticmethod
        def backward(ctx, grad_output):
            saved = list(ctx.saved_tensors)
            need_hidden, need_weight = ctx.has
            grad_hidden = None
            if need_hidden:
                grad_hidden = saved.pop(0)
                grad_hidden = grad_hidden * grad_output.to(grad_hidden.dtype)
            grad_weight = (saved.pop(0) * grad_output).to(ctx.weight_dtype) if need_weight else None
            return grad_hidden, grad_weight, None, None, None, None

    return LinearCrossEntropy


_FUNCTION = None


def _linear_ce():
    """The autograd.Function, defined once (before any torch.compile traces a call: Dynamo cannot
    trace a class definition, and a graph break there would split the compiled model)."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _fused_function()
    return _FUNCTION


def prepare_linear_cross_entropy(kernel: str = "auto") -> None:
    """Define the loss's autograd.Function and, for `kernel` 'triton'/'auto' where triton is
    installed, register the `hwrun::chunk_ce` op: call it before `torch.compile` traces
    `linear_cross_entropy` (Dynamo can trace neither a class definition nor an op registration).
    Idempotent; `apply_fused_loss` calls it."""
    check_kernel(kernel)
    _linear_ce()
    if kernel == "triton" or (kernel == "auto" and importlib.util.find_spec("triton") is not None):
        from .ce_kernel import chunk_ce_op

        chunk_ce_op()


def linear_cross_entropy(hidden: Any, weight: Any, targets: Any, *, num_items_in_batch: Any = None,
                         chunk_tokens: int = DEFAULT_CHUNK_TOKENS, compiled: bool = False,
                         kernel: str = "torch"):
    """Mean (or sum / num_items_in_batch) cross-entropy of `hidden @ weight.T` against `targets`.

    `hidden` is (N, H), `weight` (V, H), `targets` (N,) with -100 = ignore: the same reduction as
    Transformers' `ForCausalLMLoss` (sum / num_items_in_batch when given, else mean over valid).
    `compiled=True` when the caller runs under `torch.compile` (the fusable form; see the module doc).
    `kernel` picks the per-chunk softmax/gradient: 'torch', 'triton' (`ce_kernel`) or 'auto' (the kernel
    policy's choice: Triton on CUDA, else torch; pass a resolved one under `torch.compile`). Under
    `torch.compile`, call `prepare_linear_cross_entropy(kernel)` first.
    """
    import torch

    from hwrun.devices import kind_of_device_type

    function = _linear_ce()
    if num_items_in_batch is None:
        denominator = (targets != IGNORE_INDEX).sum().clamp_min(1)
    else:
        denominator = torch.as_tensor(num_items_in_batch, device=hidden.device)
    scale = 1.0 / denominator.to(torch.float32)
    kind = kind_of_device_type(hidden.device.type) if kernel == "auto" else None  # only 'auto' asks the policy
    chunk_fn = chunk_function(compiled, kernel, kind)
    return function.apply(hidden, weight, targets, scale, int(chunk_tokens), chunk_fn)


#: The libraries that can compute the fused loss instead of hwrun's chunked function.
LIBRARY_LOSSES = ("liger", "torch")


def library_linear_cross_entropy(impl: str, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
    """`f(hidden, weight, targets, num_items_in_batch) -> loss` for `impl` 'liger' or 'torch', with the
    reduction of Transformers' ForCausalLMLoss (sum / num_items_in_batch when given, else the mean over the
    targets that are not -100). 'torch' computes `chunk_tokens` tokens per chunk; Liger chooses its own
    chunking (it takes no chunk size), so `chunk_tokens` is unused there."""
    import torch
    import torch.nn.functional as F

    if impl == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        def compute(hidden, weight, targets, reduction):
            return liger_fused_linear_cross_entropy(hidden, weight, targets, ignore_index=IGNORE_INDEX,
                                                    reduction=reduction)
    elif impl == "torch":
        # The chunked path (the logits never exist whole), in hwrun's chunk size: with its own "auto" chunking
        # (16 rows per chunk at the test model's 4096 x 128 head) torch 2.15 sums the chunks' losses in bf16 on CPU
        # and the mean lands 2.6 % off (8.56 against 8.34); with 1024-token chunks it is within bf16 rounding.
        options = torch.nn.LinearCrossEntropyOptions(chunking_method=None, batch_chunk_size=int(chunk_tokens))

        def compute(hidden, weight, targets, reduction):
            return F.linear_cross_entropy(hidden, weight, targets, reduction=reduction, ignore_index=IGNORE_INDEX,
                                          options=options)
    else:
        raise TrainingConfigError(f"impl={impl!r} is not a library loss; use one of {LIBRARY_LOSSES}.")

    def loss(hidden, weight, targets, num_items_in_batch=None):
        if num_items_in_batch is None:
            return compute(hidden, weight, targets, "mean")
        return compute(hidden, weight, targets, "sum") / num_items_in_batch

    return loss


@dataclass(frozen=True)
class FusedLossPatch:
    """The record of one model whose forward computes the chunked loss; `undo()` restores it."""

    model: Any = field(repr=False)
    applied: bool
    reason: str

    def undo(self) -> None:
        """Remove the fused forward (idempotent)."""
        if self.applied and getattr(self.model, _FLAG, False):
            del self.model.forward
            delattr(self.model, _FLAG)


def fused_loss_support(model: Any) -> str | None:
    """None when `model` can use the fused loss exactly, else the reason it cannot."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FUSED_LOSS_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {sorted(FUSED_LOSS_MODEL_TYPES)}"
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, name, None) not in (None, 1, 1.0):
            return f"config.{name} is set"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "bias", None) is not None or not hasattr(head, "weight"):
        return "the output head is not a bias-free linear layer"
    if type(head).__name__ != "Linear" or getattr(head.weight, "quant_state", None) is not None:
        return f"the output head is a {type(head).__name__}, not a plain Linear"
    return None


def apply_fused_loss(model: Any, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, compiled: bool = False,
                     kernel: str | None = None, impl: str = "auto") -> FusedLossPatch:
    """Make this CausalLM instance compute its training loss with `linear_cross_entropy`
    (explicit, idempotent, reversible via `.undo()`); calls without labels run unchanged.
    `compiled=True` when the model will run under `torch.compile` (the loss takes its fusable form).
    `impl` is the kernel policy's name for the loss (`hwrun.training.kernel_policy`): 'auto' (the policy's choice
    for the model's device: hwrun's on CUDA), 'hwrun' (the chunked loss with the Triton chunk kernel), 'inductor'
    (the chunked loss in the torch form), 'liger' (Liger's fused linear cross-entropy, which chunks on its own)
    or 'torch' (torch's own chunked `F.linear_cross_entropy`, `chunk_tokens` per chunk). `kernel` is hwrun 0.1.0's
    spelling ('triton', 'torch', 'auto'; a FutureWarning). A second call with the same `impl` changes nothing;
    with another `impl` it is refused (undo the first patch)."""
    from hwrun.devices import kind_of_device_type

    from ..kernel_policy import choose, from_old_keyword

    if kernel is not None:
        old = from_old_keyword("kernel", kernel, "cross_entropy", replacement="impl={impl!r}")
        if impl != "auto" and old != "auto" and old != impl:
            raise TrainingConfigError(f"apply_fused_loss(kernel={kernel!r}, impl={impl!r}): kernel={kernel!r} is "
                                      f"impl={old!r}; give impl alone (kernel is deprecated).")
        impl = old if impl == "auto" else impl
    parameter = next(iter(model.parameters()), None)
    device_type = parameter.device.type if parameter is not None else "cpu"
    impl = choose("cross_entropy", impl, kind_of_device_type(device_type))  # resolved once, here
    running = getattr(model, _FLAG, False)
    if running:
        if running == impl:
            return FusedLossPatch(model, True, "already applied")
        raise TrainingConfigError(f"apply_fused_loss(impl={impl!r}): this model already computes its loss with "
                                  f"impl={running!r} (patched earlier). Fix: undo that patch first (its .undo()), "
                                  "then apply this one.")
    reason = fused_loss_support(model)
    if reason is not None:
        logger.info("Fused chunked loss not applied: %s; using the model's own loss.", reason)
        return FusedLossPatch(model, False, reason)

    import torch.nn.functional as F
    from transformers.modeling_outputs import CausalLMOutputWithPast

    original = type(model).forward
    decoder = model.get_decoder()
    library = library_linear_cross_entropy(impl, chunk_tokens) if impl in LIBRARY_LOSSES else None
    kernel = "triton" if impl == "hwrun" else "torch"  # the chunk form of hwrun's chunked loss
    if library is None:
        prepare_linear_cross_entropy(kernel)

    def forward(input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        if past_key_values is not None:  # passed on only when given: 5.25 renamed it `cache` (a warning)
            kwargs["past_key_values"] = past_key_values
        if labels is None:
            return original(model, input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, inputs_embeds=inputs_embeds, use_cache=use_cache,
                            logits_to_keep=logits_to_keep, **kwargs)
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("return_dict", None)
        outputs = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, use_cache=False, **kwargs)
        hidden = outputs.last_hidden_state
        targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].to(hidden.device)
        head = model.get_output_embeddings()
        if library is not None:
            loss = library(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1), num_items)
        else:
            loss = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                        targets.reshape(-1), num_items_in_batch=num_items,
                                        chunk_tokens=chunk_tokens, compiled=compiled, kernel=kernel)
        return CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions)

    model.forward = forward
    setattr(model, _FLAG, impl)  # which loss runs, so a second call can tell
    if library is not None:
        what = {"liger": "Liger's fused linear cross-entropy",
                "torch": "torch's own chunked F.linear_cross_entropy"}[impl]
        logger.info("Fused loss: %s (the full logits are never materialised).", what)
        return FusedLossPatch(model, True, what)
    how = "Triton kernel" if kernel == "triton" else "out of place, fused by torch.compile" if compiled else "in place"
    logger.info("Fused chunked cross-entropy on (%d tokens per chunk, softmax/gradient %s): the full "
                "logits are never materialised.", chunk_tokens, how)
    return FusedLossPatch(model, True, f"fused chunked cross-entropy ({how})")
