"""Which implementation `train()` runs for each of four training ops: the one place that decides.

For cross-entropy, SwiGLU, RMSNorm and RoPE the candidates are hwrun's own (the Triton loss chunk kernel; for
RoPE the cos/sin table), Liger's kernels (the optional extra `hwrun[liger]`), torch's own op where torch has one,
and the torch form that inductor compiles. The rule for `kernels="auto"` (per op, per device):

1. hwrun's own where it was measured end to end at least `OWN_MARGIN` (2 %) ahead on that device: a kernel
   of our own is code to keep, so it has to pay for itself (one that did not, the SwiGLU backward at +1.8 %,
   was deleted: `REMOVED`);
2. otherwise a library's (Liger, torch's own op) where it was measured ahead of the torch form there;
3. otherwise the op's default (`UNMEASURED_DEFAULT`): the torch form, or for RoPE the table.

`MEASUREMENTS` holds every end-to-end ratio with its source (docs/benchmarks/train.md) and, where a figure
was not measured on the candidate alone, its caveat. A candidate never measured on a device is never chosen
by "auto" there; the reason says "not measured yet".

The RoPE table is not a kernel: it is a lookup of the model's own rotary values for the block's positions,
computed once instead of in every layer, with no code specific to a device. On CUDA it is chosen by the one
figure there is, measured together with the fused projections (+2.4 % to +3.2 % on an H200; the table's own
share is not measured, and the reason says so). Elsewhere it is the default because it is a table.

Explicit choices (`train(kernels={"swiglu": "liger"})`, `hwrun train --kernel swiglu=liger`) are checked here
before any work: a name that is not a candidate, a library that is not installed, a device the candidate does
not run on. The older keywords (`loss_kernel=`, `swiglu_kernel=`, `rope_table=` of hwrun 0.1.0) are read here too,
with a FutureWarning naming the replacement (`from_old_keyword`): kernels= is the one way to choose.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import TrainingConfigError

OPS = ("cross_entropy", "swiglu", "rmsnorm", "rope")
#: What "hwrun's own" must gain end to end before it is the default (else the library or inductor is).
OWN_MARGIN = 1.02
LIGER_INSTALL = "pip install hwrun[liger]"

#: Per kind: do Liger's kernels run there, and why. Liger's kernels are Triton; Liger documents NVIDIA
#: (CUDA), AMD (ROCm, the same torch device type) and Intel XPU. Gaudi has no Triton; on the host there is
#: no Triton backend (Liger's CPU path is its reference torch code, which hwrun's torch form already is).
LIGER_DEVICES: dict[str, tuple[bool, str]] = {
    "cuda": (True, "Liger's Triton kernels run on NVIDIA GPUs (its main target)"),
    "rocm": (True, "Liger's Triton kernels run on ROCm (Liger lists AMD; not run by hwrun yet)"),
    "xpu": (True, "Liger's Triton kernels run on Intel XPU through torch's XPU Triton (not run by hwrun yet)"),
    "hpu": (False, "Gaudi has no Triton, so none of Liger's kernels run there"),
    "mps": (False, "Apple GPUs have no Triton, so none of Liger's kernels run there"),
    "cpu": (False, "Liger's kernels are Triton GPU kernels; the host runs hwrun's torch form instead"),
}


@dataclass(frozen=True)
class Candidate:
    """One implementation of an op: who wrote it (`source`: hwrun, liger, torch or inductor), what it is, and the
    train() option it runs inside (`needs`: an explicit choice with that option off is refused)."""

    op: str
    name: str
    source: str
    what: str
    needs: str | None = None


CANDIDATES: dict[str, tuple[Candidate, ...]] = {
    "cross_entropy": (
        Candidate("cross_entropy", "hwrun", "hwrun", "hwrun's chunked linear + cross-entropy with its Triton "
                  "chunk kernel (patches.ce_kernel)", "fused_loss"),
        Candidate("cross_entropy", "inductor", "inductor", "hwrun's chunked linear + cross-entropy, each chunk in "
                  "the torch form that torch.compile fuses (eager: in place)", "fused_loss"),
        Candidate("cross_entropy", "liger", "liger", "Liger's fused linear cross-entropy "
                  "(LigerFusedLinearCrossEntropyFunction)", "fused_loss"),
        Candidate("cross_entropy", "torch", "torch", "torch's own chunked torch.nn.functional.linear_cross_entropy "
                  "(where torch has it)", "fused_loss"),
    ),
    "swiglu": (
        Candidate("swiglu", "inductor", "inductor", "silu(gate) * up in torch, compiled by inductor (on the fused "
                  "gate/up output where the projections are fused)"),
        Candidate("swiglu", "liger", "liger", "Liger's SwiGLU kernel (LigerSiLUMulFunction) on separate gate and "
                  "up matmuls, as Liger's own MLP runs it"),
    ),
    "rmsnorm": (
        Candidate("rmsnorm", "inductor", "inductor", "the model's own RMSNorm, compiled by inductor"),
        Candidate("rmsnorm", "liger", "liger", "Liger's RMSNorm kernel (LigerRMSNormFunction, Llama casting)"),
        Candidate("rmsnorm", "torch", "torch", "torch's own torch.nn.functional.rms_norm"),
    ),
    "rope": (
        Candidate("rope", "hwrun", "hwrun", "hwrun's cos/sin table for packed blocks (patches.rope_table), "
                  "rotation compiled by inductor"),
        Candidate("rope", "inductor", "inductor", "the model's own rotary module and rotation, compiled by inductor"),
        Candidate("rope", "liger", "liger", "Liger's RoPE kernel for the rotation (cos/sin from hwrun's table "
                  "where the table applies: packed blocks)"),
    ),
}

#: Candidates that were deleted, and why (an explicit choice of one is refused with this).
REMOVED: dict[tuple[str, str], str] = {
    ("swiglu", "hwrun"): "hwrun's Triton SwiGLU backward was deleted in hwrun 0.2.0: it measured +1.8 % end to end "
                         "on an H200 (88,821 vs 87,213 tokens/s, docs/benchmarks/train.md, 2026-12-04), below the 2 % "
                         "a kernel of our own must gain",
}

#: The default of each op where nothing measured beats it, and why.
UNMEASURED_DEFAULT: dict[str, tuple[str, str]] = {
    "cross_entropy": ("inductor", "the torch form is the baseline every loss candidate is measured against"),
    "swiglu": ("inductor", "the torch form is the baseline every SwiGLU candidate is measured against"),
    "rmsnorm": ("inductor", "the model's own RMSNorm under inductor is the baseline"),
    "rope": ("hwrun", "the table is not a kernel (a lookup of the rotary module's own cos/sin for the block's "
                      "positions, computed once instead of in every layer, no device-specific code), so the rule "
                      "that a kernel of our own needs a measurement does not hold it back; its one figure is "
                      "CUDA's, measured together with the fused projections"),
}


@dataclass(frozen=True)
class Measurement:
    """An end-to-end ratio: tokens/s with `impl` over tokens/s with `baseline`, on `kind`, with its source."""

    op: str
    impl: str
    baseline: str
    kind: str
    ratio: float
    source: str
    caveat: str = ""  # what the figure does not isolate (said in every reason that uses it)


#: Every end-to-end measurement the policy decides with (LoRA, 1.24B Llama, seq 1024, batch 8, H200).
MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement("cross_entropy", "hwrun", "inductor", "cuda", 89_512 / 87_631,
                "docs/benchmarks/train.md, 2026-12-03: hwrun 89,512 vs hwrun_torch_loss 87,631 tokens/s"),
    Measurement("rope", "hwrun", "inductor", "cuda", 87_844 / 85_825,
                "docs/benchmarks/train.md, layer path: hwrun 87,844 vs hwrun_unfused 85,825 tokens/s (call 1; "
                "89,899 vs 87,136 in call 2, +3.2%)",
                "measured together with the fused projections (hwrun_unfused drops both); the table's own "
                "share is not measured"),
)


@dataclass(frozen=True)
class Choice:
    """The implementation one op runs with on this device, and why."""

    op: str
    impl: str
    reason: str


def candidate(op: str, name: str, asked: str | None = None) -> Candidate:
    """The candidate `name` of `op` (a TrainingConfigError naming the valid ones otherwise). `asked`: how the
    user spelled the choice, when not as kernels[op]=name (the error names it)."""
    if op not in CANDIDATES:
        raise TrainingConfigError(f"kernels: {op!r} is not an op hwrun chooses a kernel for; the ops are "
                                  f"{', '.join(OPS)}.")
    for item in CANDIDATES[op]:
        if item.name == name:
            return item
    asked = asked or f"kernels[{op!r}]={name!r}"
    names = ", ".join(c.name for c in CANDIDATES[op])
    if (op, name) in REMOVED:
        raise TrainingConfigError(f"{asked}: {REMOVED[op, name]}. Fix: choose 'auto' or one of {names} for {op}.")
    raise TrainingConfigError(f"{asked} is not an implementation of {op}; choose 'auto' or one of "
                              f"{names} ({'; '.join(f'{c.name}: {c.what}' for c in CANDIDATES[op])}).")


def measured(op: str, impl: str, kind: str) -> Measurement | None:
    """The measurement of `impl` for `op` on `kind`, or None."""
    return next((m for m in MEASUREMENTS if (m.op, m.impl, m.kind) == (op, impl, kind)), None)


def liger_installed() -> bool:
    """Whether liger-kernel (the optional extra `hwrun[liger]`) is importable."""
    return importlib.util.find_spec("liger_kernel") is not None


def torch_has(op: str) -> bool:
    """Whether this torch has its own op for `op` (checked by attribute, not by version)."""
    import torch
    import torch.nn.functional as F

    if op == "cross_entropy":
        return hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
    if op == "rmsnorm":
        return hasattr(F, "rms_norm")
    return False


def runs_on(item: Candidate, kind: str) -> str | None:
    """None when `item` can run on the platform `kind` in this environment, else why not (with the fix)."""
    from hwrun.devices import platform, row

    if item.source == "liger":
        if not liger_installed():
            return f"liger-kernel is not installed (install the optional extra: {LIGER_INSTALL})"
        usable, why = row(LIGER_DEVICES, kind, (False, f"hwrun has no Liger row for the device kind {kind!r}"))
        return None if usable else why
    if item.source == "torch" and not torch_has(item.op):
        return f"torch {_torch_version()} has no own {item.op} op (it needs torch.nn.functional's " \
               f"{'linear_cross_entropy with LinearCrossEntropyOptions' if item.op == 'cross_entropy' else 'rms_norm'})"
    if item.source == "hwrun" and item.op == "cross_entropy":
        if importlib.util.find_spec("triton") is None:
            return "hwrun's kernel is Triton code and triton is not installed"
        if not platform(kind).triton:
            return f"{platform(kind).display_name} has no Triton, which hwrun's kernel is written in"
    return None


def _torch_version() -> str:
    import torch

    return torch.__version__


def _figure(m: Measurement) -> str:
    """A measurement as reasons quote it: the ratio, its baseline, its source and its caveat."""
    caveat = f"; {m.caveat}" if m.caveat else ""
    return f"{m.ratio - 1:+.1%} end to end over {m.baseline} ({m.source}{caveat})"


def auto_choice(op: str, kind: str) -> Choice:
    """What `kernels="auto"` runs for `op` on `kind`, by the module's rule, with the figures that decided.
    Every reason starts with the implementation's name and a colon."""
    default, default_why = UNMEASURED_DEFAULT[op]
    own = measured(op, "hwrun", kind)
    unmeasured = [c.name for c in CANDIDATES[op] if c.name != default and measured(op, c.name, kind) is None
                  and runs_on(c, kind) is None]  # candidates that cannot run here are not pending
    pending = f"; not measured yet on {kind}: {', '.join(unmeasured)}" if unmeasured else ""
    blocker = runs_on(candidate(op, "hwrun"), kind) if own is not None else None
    if own is not None and own.ratio >= OWN_MARGIN and blocker is None:
        return Choice(op, "hwrun", f"hwrun: hwrun's own, {_figure(own)}, >= the {OWN_MARGIN - 1:.0%} a kernel of "
                                   f"our own must gain{pending}")
    libraries = [m for c in CANDIDATES[op] if c.source in ("liger", "torch")
                 for m in [measured(op, c.name, kind)] if m is not None and m.ratio > 1.0
                 and runs_on(c, kind) is None]
    if libraries:
        best = max(libraries, key=lambda m: m.ratio)
        return Choice(op, best.impl, f"{best.impl}: {_figure(best)}{pending}")
    why = default_why
    if own is not None and own.ratio < OWN_MARGIN:
        why = (f"hwrun's own measured {own.ratio - 1:+.1%} over {own.baseline}, below the {OWN_MARGIN - 1:.0%} a "
               f"kernel of our own must gain ({own.source}); {default_why}")
    elif own is not None:
        why = f"hwrun's own measured {own.ratio - 1:+.1%} over {own.baseline} ({own.source}) but cannot run " \
              f"here: {blocker}; {default_why}"
    return Choice(op, default, f"{default}: {why}{pending}")


def explicit_choice(op: str, impl: str, kind: str, asked: str | None = None) -> Choice:
    """`impl` for `op`, asked for explicitly: checked to run on `kind` here (TrainingConfigError otherwise).
    `asked` is how the user spelled it when it was an older keyword (e.g. "loss_kernel='triton'")."""
    item = candidate(op, impl, asked)
    why_not = runs_on(item, kind)
    if why_not is not None:
        from hwrun.devices import platform

        runnable = [c.name for c in CANDIDATES[op] if runs_on(c, kind) is None]
        spelled = f"{asked} (kernels[{op!r}]={impl!r})" if asked else f"kernels[{op!r}]={impl!r}"
        raise TrainingConfigError(f"{spelled} cannot run on {platform(kind).display_name} ({kind}): {why_not}. "
                                  f"Fix: choose 'auto' or one of {', '.join(runnable)} for {op} there "
                                  f"(kernels={{{op!r}: ...}}, hwrun train --kernel {op}=...).")
    figure = measured(op, impl, kind)
    note = _figure(figure).replace(" end to end", "") if figure else f"not measured yet on {kind}"
    return Choice(op, impl, f"{impl}: asked for ({item.what}); {note}")


#: The older keywords of hwrun 0.1.0 (`train(loss_kernel=, swiglu_kernel=, rope_table=)`, `apply_fused_loss(kernel=)`)
#: and what their values are in kernels= names: 'triton' was hwrun's own kernel, 'torch' the torch form (which
#: kernels= calls 'inductor'; its 'torch' is torch's own op); rope_table=False was the model's own rotary module
#: compiled (kernels={'rope': 'inductor'}), rope_table=True the default ('auto').
OLD_KEYWORDS = {"loss_kernel": "cross_entropy", "swiglu_kernel": "swiglu", "rope_table": "rope"}
OLD_VALUES = {"auto": "auto", "triton": "hwrun", "torch": "inductor"}
#: Keywords whose values are not OLD_VALUES' names.
OLD_KEYWORD_VALUES: dict[str, dict] = {"rope_table": {True: "auto", False: "inductor"}}


def _old_value(keyword: str, value: object) -> str | None:
    """The kernels= name of `keyword`'s old `value`, or None (by type too: rope_table=1 is not rope_table=True)."""
    values = OLD_KEYWORD_VALUES.get(keyword, OLD_VALUES)
    return next((impl for old, impl in values.items() if type(old) is type(value) and old == value), None)


def _old_torch_note(op: str) -> str:
    """What the old 'torch' meant beside what kernels' 'torch' means for `op` (two different implementations)."""
    own = next((c for c in CANDIDATES[op] if c.name == "torch"), None)
    new = f"kernels[{op!r}]='torch' is another implementation: {own.what}" if own is not None else \
        f"kernels= has no 'torch' for {op} (torch has no own {op} op)"
    return f" The old 'torch' meant hwrun's torch form that inductor compiles, named 'inductor' now; {new}."


def from_old_keyword(keyword: str, value: object, op: str | None = None, stacklevel: int = 3,
                     replacement: str = "kernels={{{op!r}: {impl!r}}} (hwrun train --kernel {op}={impl})") -> str:
    """The kernels= name of `value`, given through the deprecated `keyword`, with a FutureWarning naming the
    replacement (`replacement`, formatted with op and impl); a value that was never valid, or names a deleted
    kernel, is a TrainingConfigError saying so. For the old value 'torch' the warning says that it is 'inductor'
    now, and what kernels' own 'torch' is."""
    op = op or OLD_KEYWORDS[keyword]
    impl = _old_value(keyword, value)
    if impl is None:
        values = OLD_KEYWORD_VALUES.get(keyword, OLD_VALUES)
        valid = [v for v, name in values.items() if (op, name) not in REMOVED]
        raise TrainingConfigError(f"{keyword}={value!r} is not one of {', '.join(map(repr, valid))}; {keyword} is "
                                  f"deprecated: use kernels={{{op!r}: IMPL}} with IMPL 'auto' or one of "
                                  f"{', '.join(c.name for c in CANDIDATES[op])}.")
    if impl != "auto":
        candidate(op, impl, f"{keyword}={value!r} (kernels[{op!r}]={impl!r})")  # a deleted kernel raises here
    note = _old_torch_note(op) if value == "torch" else ""
    if impl == "auto":
        note += f" ({keyword}={value!r} is the default: leaving both out does the same.)"
    warnings.warn(f"{keyword}={value!r} is deprecated and will be removed; use "
                  f"{replacement.format(op=op, impl=impl)} instead.{note}", FutureWarning, stacklevel=stacklevel)
    return impl


def check_kernels(kernels: Mapping[str, str] | None, old: Mapping[str, str] | None = None) -> dict[str, str]:
    """The explicit choices of a run, checked by name only (no device yet): `kernels` merged with the values of
    the deprecated keywords in `old` ({keyword: impl} of loss_kernel/swiglu_kernel/rope_table, already warned about and
    translated by `from_old_keyword`), which must not contradict it. Returns {op: impl} without 'auto'."""
    if kernels is None:
        kernels = {}
    if not isinstance(kernels, Mapping):
        raise TrainingConfigError(f"kernels={kernels!r} must be a dict such as {{'swiglu': 'liger'}} (ops: "
                                  f"{', '.join(OPS)}).")
    asks = {}
    for op, impl in kernels.items():
        if impl == "auto":
            if op not in CANDIDATES:
                candidate(op, impl)  # raises, naming the ops
            continue
        asks[op] = candidate(op, impl).name
    for keyword, impl in (old or {}).items():
        op = OLD_KEYWORDS[keyword]
        if impl == "auto":
            continue
        if op in asks and asks[op] != impl:
            raise TrainingConfigError(f"{keyword} asks for kernels[{op!r}]={impl!r} but kernels[{op!r}]="
                                      f"{asks[op]!r}; give kernels= alone ({keyword} is deprecated).")
        asks[op] = impl
    return asks


def resolve(kind: str, asks: Mapping[str, str], spelled: Mapping[str, str] | None = None) -> dict[str, Choice]:
    """Every op's choice on the platform `kind`: the explicit ones checked to run there, the rest by the rule.
    `spelled`: {op: how the user asked} for ops asked through a deprecated keyword."""
    spelled = spelled or {}
    return {op: explicit_choice(op, asks[op], kind, spelled.get(op)) if op in asks else auto_choice(op, kind)
            for op in OPS}


def choose(op: str, impl: str, kind: str) -> str:
    """`impl` of `op` for a patch called on its own: 'auto' is the rule's choice on `kind`, any other name is
    checked to be a candidate (not to run on `kind`: the tests run Triton kernels on the host through Triton's
    interpreter). The patches ask this rather than deciding themselves."""
    return auto_choice(op, kind).impl if impl == "auto" else candidate(op, impl).name
