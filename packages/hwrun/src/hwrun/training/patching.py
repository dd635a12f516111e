"""The patch phase of `train()`: hwrun's model patches for one run (fused loss, RoPE table, causal SDPA, fused
projections, no KV cache), each recorded on a `PatchStack` whose `undo()` restores the model, newest change
first, whether the run finished or failed (idempotent)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .patches.record import ModelPatch

logger = logging.getLogger(__name__)


@dataclass
class PatchStack:
    """The undo steps of every change made to a model for training; `undo()` runs them newest first, once."""

    _steps: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def push(self, name: str, undo: Callable[[], None]) -> None:
        """Record how to undo the change `name`."""
        self._steps.append((name, undo))

    def add(self, name: str, patch: Any) -> Any:
        """Record a patch record (ModelPatch, FusedLossPatch) whose `.undo()` restores it; returns it."""
        self.push(name, patch.undo)
        return patch

    @property
    def names(self) -> list[str]:
        """The changes still in place, oldest first."""
        return [name for name, _ in self._steps]

    def undo(self) -> None:
        """Undo every change, newest first; a second call does nothing. Every step runs even if one fails
        (the first failure is raised afterwards)."""
        failure = None
        while self._steps:
            name, step = self._steps.pop()
            try:
                step()
            except Exception as error:  # keep undoing the rest; report the first
                logger.error("Undoing %s failed: %s", name, error)
                failure = failure or error
        if failure is not None:
            raise failure


@dataclass(frozen=True)
class PatchOptions:
    """Which of hwrun's own training patches a run asked for, with each op's implementation as the kernel policy
    resolved it (`kernels`: {op: impl}, hwrun.training.kernel_policy's names)."""

    fused_loss: bool
    fused_projections: bool
    compiled: bool
    kernels: Mapping[str, str]

    @classmethod
    def from_choices(cls, choices: Mapping[str, Any], *, fused_loss: bool, fused_projections: bool,
                     compiled: bool) -> PatchOptions:
        """The patches that the kernel policy's `choices` ({op: Choice}) ask for."""
        return cls(fused_loss, fused_projections, compiled, {op: c.impl for op, c in choices.items()})


def patch_base(model: Any, dataset: Any, options: PatchOptions, stack: PatchStack, reasons: dict) -> None:
    """Patch the base model before LoRA wraps it: no KV cache, fused loss, RoPE table, causal SDPA."""
    from .data import PackedDataset
    from .patches.fused_loss import apply_fused_loss
    from .patches.rope_table import apply_rope_table

    use_cache = getattr(model.config, "use_cache", None)
    if use_cache is not None:
        model.config.use_cache = False  # training needs no KV cache; restored before the final save
        stack.push("use_cache", lambda: setattr(model.config, "use_cache", use_cache))
    if options.fused_loss:
        patch = stack.add("fused loss", apply_fused_loss(model, compiled=options.compiled,
                                                         impl=options.kernels["cross_entropy"]))
        reasons["loss"] = patch.reason
    else:
        reasons["loss"] = "model's own loss (fused_loss=False)"
    # the table runs under hwrun's rotation and Liger's ('hwrun', 'liger'); 'inductor' is the model's own rotary module
    if options.kernels["rope"] != "inductor" and isinstance(dataset, PackedDataset):
        reasons["rope"] = stack.add("rope table", apply_rope_table(model, int(dataset.blocks.shape[1]))).reason
    _library_kernels_base(model, options, stack, reasons)
    restore = _use_causal_sdpa(model, dataset)
    if restore is not None:
        stack.push("causal sdpa", lambda: model.set_attn_implementation(restore))
        reasons["attention"] = ("sdpa, causal kernel with no mask built (packed blocks have no padding; "
                                "hwattn.causal), also under torch.compile")


def patch_lora(model: Any, options: PatchOptions, blocker: str | None, stack: PatchStack, reasons: dict) -> None:
    """Patch the LoRA-wrapped model: fused q/k/v and gate/up projections, unless `blocker` says why not."""
    from .patches.fused_projections import apply_fused_projections

    if not options.fused_projections:
        return
    swiglu = options.kernels["swiglu"]
    patch = apply_fused_projections(model, swiglu) if blocker is None else ModelPatch(False, blocker)
    reasons["projections"] = stack.add("fused projections", patch).reason


def _library_kernels_base(model: Any, options: PatchOptions, stack: PatchStack, reasons: dict) -> None:
    """Library kernels on the base model, before LoRA wraps it (PEFT replaces the projections, not the norms
    or MLPs, so per-instance forwards stay): RMSNorm (Liger's or torch's) and Liger's SwiGLU."""
    from .patches.library_kernels import apply_liger_swiglu, apply_rmsnorm

    rmsnorm = options.kernels["rmsnorm"]
    if rmsnorm != "inductor":
        reasons["rmsnorm"] = stack.add(f"{rmsnorm} rmsnorm", apply_rmsnorm(model, rmsnorm)).reason
    if options.kernels["swiglu"] == "liger":
        reasons["swiglu"] = stack.add("liger swiglu", apply_liger_swiglu(model)).reason


def patch_last(model: Any, options: PatchOptions, stack: PatchStack, reasons: dict) -> None:
    """The patches that go on after every other (LoRA and fused projections included): Liger's RoPE rotation,
    which reuses the fused attention forward where q/k/v are fused."""
    from .patches.library_kernels import apply_liger_rope

    if options.kernels["rope"] == "liger":
        reasons["rope rotation"] = stack.add("liger rope", apply_liger_rope(model)).reason


def _use_causal_sdpa(model: Any, dataset: Any) -> str | None:
    """Switch an sdpa model to hwattn's causal SDPA when every batch is an unpadded packed block
    (no mask to build); returns the implementation to restore afterwards, or None (unchanged)."""
    from .data import PackedDataset

    if not isinstance(dataset, PackedDataset) or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return None
    import hwattn

    model.set_attn_implementation(hwattn.register_causal_sdpa())
    return "sdpa"
