"""Library kernels (Liger's, torch's own) for RMSNorm, SwiGLU and RoPE, put on one model instance.

Liger's own way (`apply_liger_kernel_to_llama`) replaces classes and functions in Transformers' modeling
modules for the whole process. hwrun instead sets a forward on each module of this model (as its other
patches do): explicit, idempotent (a second call changes nothing) and reversible (`.undo()` leaves the
model as loaded). The kernel functions are looked up when a patch is applied, never at import, and can be
passed in (`function=`), which is how the CPU tests check the patches without a GPU.

Which implementation runs is the kernel policy's decision (`hwrun.training.kernel_policy`)."""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

from ...errors import TrainingConfigError
from .record import ModelPatch

logger = logging.getLogger(__name__)

#: RMSNorm classes computing `weight * (x / rms(x)).to(dtype)` (no +1 offset, no bias): Liger's "llama"
#: casting mode and torch's rms_norm compute the same formula, equal to these classes within rounding (in bf16
#: torch's rms_norm differs from LlamaRMSNorm by up to 2 ulp). Gemma-style norms (weight + 1) are not among them.
RMSNORM_CLASSES = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
#: MLP classes of the form `down(act(gate(x)) * up(x))`.
SWIGLU_CLASSES = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
_SILU = ("SiLUActivation", "SiLU")
_FLAG = "_hwrun_library_kernel"
#: The attribute `fused_projections._attention_forward` reads the rotation function from.
ROTARY_ATTRIBUTE = "_hwrun_rotary"


def liger_rmsnorm_function() -> Callable[[Any, Any, float], Any]:
    """Liger's RMSNorm as `f(x, weight, eps)` (Llama casting, in place in the backward, as Liger runs Llama)."""
    from liger_kernel.ops import LigerRMSNormFunction

    def rmsnorm(x, weight, eps):
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", True, None)

    return rmsnorm


def torch_rmsnorm_function() -> Callable[[Any, Any, float], Any]:
    """torch's own `torch.nn.functional.rms_norm` as `f(x, weight, eps)`."""
    import torch.nn.functional as F

    def rmsnorm(x, weight, eps):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    return rmsnorm


def liger_swiglu_function() -> Callable[[Any, Any], Any]:
    """Liger's SwiGLU as `f(gate, up) = silu(gate) * up`."""
    from liger_kernel.ops import LigerSiLUMulFunction

    def silu_mul(gate, up):
        return LigerSiLUMulFunction.apply(gate, up)

    return silu_mul


def liger_rope_function() -> Callable[..., Any]:
    """Liger's rotation as Transformers' `apply_rotary_pos_emb(q, k, cos, sin)`."""
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    def rotate(q, k, cos, sin, unsqueeze_dim=1):
        return liger_rotary_pos_emb(q, k, cos, sin, None, unsqueeze_dim)

    return rotate


RMSNORM_FUNCTIONS = {"liger": liger_rmsnorm_function, "torch": torch_rmsnorm_function}


def _set_forward(module: Any, forward: Callable[..., Any], undo: list[Callable[[], None]], impl: str) -> None:
    module.forward = types.MethodType(forward, module)
    setattr(module, _FLAG, impl)  # which implementation runs, so a second call can tell

    def restore() -> None:
        if _FLAG in vars(module):
            del module.forward
            delattr(module, _FLAG)

    undo.append(restore)


def _already(module: Any, what: str, impl: str) -> ModelPatch:
    """A second call on a patched model: nothing to do for the same `impl`, refused for another (the old one
    would keep running while the patch said otherwise)."""
    running = getattr(module, _FLAG)
    if running == impl:
        return ModelPatch(True, "already applied")
    raise TrainingConfigError(f"{what} {impl!r} cannot be applied: this model's {type(module).__name__} already "
                              f"runs {running!r} (patched earlier). Fix: undo that patch first (its .undo()), "
                              "then apply this one.")


def _done(what: str, patched: int, skipped: dict[str, str], undo: list[Callable[[], None]]) -> ModelPatch:
    notes = "; ".join(f"{name}: {why}" for name, why in skipped.items())
    if not patched:
        return ModelPatch(False, notes or f"no module to patch for {what}")
    reason = f"{what} in {patched} modules" + (f" (not patched: {notes})" if notes else "")
    logger.info("Kernel patch: %s.", reason)
    return ModelPatch(True, reason, undo)


def apply_rmsnorm(model: Any, impl: str, function: Callable[[Any, Any, float], Any] | None = None) -> ModelPatch:
    """Run every Llama-style RMSNorm of `model` through `impl`'s kernel ('liger' or 'torch'), per instance
    (explicit, idempotent, reversible with `.undo()`); other norms keep their own forward, with the reason."""
    if impl not in RMSNORM_FUNCTIONS:
        raise TrainingConfigError(f"apply_rmsnorm: impl={impl!r} is not one of {sorted(RMSNORM_FUNCTIONS)} "
                                  "('liger': Liger's RMSNorm kernel, 'torch': torch.nn.functional.rms_norm); the "
                                  "model's own RMSNorm needs no patch.")
    kernel = function or RMSNORM_FUNCTIONS[impl]()
    undo: list[Callable[[], None]] = []
    skipped: dict[str, str] = {}
    patched = 0
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("RMSNorm"):
            continue
        if getattr(module, _FLAG, False):
            return _already(module, "RMSNorm", impl)
        if name not in RMSNORM_CLASSES or not hasattr(module, "variance_epsilon"):
            skipped[name] = f"not one of {sorted(RMSNORM_CLASSES)} (its formula may differ)"
            continue
        if "forward" in vars(module):
            skipped[name] = "its forward is already replaced on the instance"
            continue

        def forward(self, hidden_states, kernel=kernel):
            return kernel(hidden_states, self.weight, self.variance_epsilon)

        _set_forward(module, forward, undo, impl)
        patched += 1
    return _done(f"{impl} RMSNorm", patched, skipped, undo)


def apply_liger_swiglu(model: Any, function: Callable[[Any, Any], Any] | None = None) -> ModelPatch:
    """Run every SiLU gate/up MLP of `model` as `down(liger_silu_mul(gate(x), up(x)))`, per instance (explicit,
    idempotent, reversible with `.undo()`). The projections are looked up at call time, so PEFT may wrap them
    afterwards."""
    kernel = function or liger_swiglu_function()
    undo: list[Callable[[], None]] = []
    skipped: dict[str, str] = {}
    patched = 0
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("MLP"):
            continue
        if getattr(module, _FLAG, False):
            return _already(module, "SwiGLU", "liger")
        act = type(getattr(module, "act_fn", None)).__name__
        if name not in SWIGLU_CLASSES or act not in _SILU:
            skipped[name] = f"not a SiLU gate/up MLP of {sorted(SWIGLU_CLASSES)} (activation {act})"
            continue
        if "forward" in vars(module):
            skipped[name] = "its forward is already replaced on the instance"
            continue

        def forward(self, x, kernel=kernel):
            return self.down_proj(kernel(self.gate_proj(x), self.up_proj(x)))

        _set_forward(module, forward, undo, "liger")
        patched += 1
    return _done("Liger SwiGLU", patched, skipped, undo)


def apply_liger_rope(model: Any, function: Callable[..., Any] | None = None) -> ModelPatch:
    """Rotate q/k with Liger's RoPE kernel in every LlamaAttention of `model`, per instance (explicit,
    idempotent, reversible with `.undo()`). Attention whose q/k/v are fused already runs hwrun's forward,
    which reads the rotation from the instance; the others get that forward. Apply it after
    `apply_fused_projections` (which fuses only attention whose forward is the class's own)."""
    from .fused_projections import _attention_forward

    kernel = function or liger_rope_function()
    undo: list[Callable[[], None]] = []
    skipped: dict[str, str] = {}
    patched = 0
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("Attention"):
            continue
        if ROTARY_ATTRIBUTE in vars(module):
            return ModelPatch(True, "already applied")
        if name != "LlamaAttention":
            skipped[name] = "not LlamaAttention (hwrun's attention forward is Llama's)"
            continue
        own = vars(module).get("forward")
        if own is not None and getattr(own, "__func__", None) is not _attention_forward:
            skipped[name] = "its forward is already replaced on the instance"
            continue
        setattr(module, ROTARY_ATTRIBUTE, kernel)
        if own is None:
            module.forward = types.MethodType(_attention_forward, module)

        def restore(module=module, ours=own is None) -> None:
            if ROTARY_ATTRIBUTE in vars(module):
                delattr(module, ROTARY_ATTRIBUTE)
                if ours:
                    del module.forward

        undo.append(restore)
        patched += 1
    return _done("Liger RoPE rotation", patched, skipped, undo)
