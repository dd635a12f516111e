"""Which implementation `train()` runs for each of four training ops, decided by measurement.

For cross-entropy, SwiGLU, RMSNorm and RoPE the candidates are hwrun's own (a Triton kernel or, for RoPE, the
cos/sin table), Liger's kernels (the optional extra `hwrun[liger]`), torch's own op where torch has one, and
the torch form that inductor compiles. The rule for `kernels="auto"` (per op, per device):

1. hwrun's own where it was measured end to end at least `OWN_MARGIN` (2 %) ahead on that device: a kernel
   of our own is code to keep, so it has to pay for itself;
2. otherwise a library's (Liger, torch's own op) where it was measured ahead of the torch form there;
3. otherwise the op's default (`UNMEASURED_DEFAULT`): the torch form, or for RoPE the table.

`MEASUREMENTS` holds every end-to-end ratio with its source (docs/benchmarks/train.md) and, where a figure
was not measured on the candidate alone, its caveat. A kernel that was never measured on a device is never
chosen by "auto"; the reason says "not measured yet", and `tools/bench/train.py --configs ...` (the command
in docs/benchmarks/train.md, "Kernel policy") measures it.

The RoPE table is the one exception, and it is not a kernel: it is a lookup of the model's own rotary values
for the block's positions, computed once instead of in every layer, with no code specific to a device. On
CUDA it is chosen by the rule from the one figure there is, measured together with the fused projections
(+2.4 % to +3.2 % on an H200; the table's own share is not measured, and the reason says so). Elsewhere it
is the default because it is a table rather than a kernel, and each reason says that too.

Explicit choices (`train(kernels={"swiglu": "liger"})`) are checked here before any work: a name that is not
a candidate, a library that is not installed, a device the candidate does not run on.
"""

from __future__ import annotations

import importlib.util
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
    """One implementation of an op: who wrote it (`source`: hwrun, liger, torch or inductor) and what it is."""

    op: str
    name: str
    source: str
    what: str


CANDIDATES: dict[str, tuple[Candidate, ...]] = {
    "cross_entropy": (
        Candidate("cross_entropy", "hwrun", "hwrun", "hwrun's chunked linear + cross-entropy with its Triton "
                  "chunk kernel (patches.ce_kernel)"),
        Candidate("cross_entropy", "inductor", "inductor", "hwrun's chunked linear + cross-entropy, each chunk in "
                  "the torch form that torch.compile fuses (eager: in place)"),
        Candidate("cross_entropy", "liger", "liger", "Liger's fused linear cross-entropy "
                  "(LigerFusedLinearCrossEntropyFunction)"),
        Candidate("cross_entropy", "torch", "torch", "torch's own chunked torch.nn.functional.linear_cross_entropy "
                  "(where torch has it)"),
    ),
    "swiglu": (
        Candidate("swiglu", "hwrun", "hwrun", "hwrun's Triton SwiGLU backward on the fused gate/up output "
                  "(patches.swiglu_kernel)"),
        Candidate("swiglu", "inductor", "inductor", "SwiGLU on the fused gate/up output, backward in torch, "
                  "compiled by inductor"),
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
                  "where rope_table applies)"),
    ),
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
    Measurement("swiglu", "hwrun", "inductor", "cuda", 88_821 / 87_213,
                "docs/benchmarks/train.md, 2026-12-04: hwrun 88,821 vs hwrun_torch_swiglu 87,213 tokens/s"),
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


def candidate(op: str, name: str) -> Candidate:
    """The candidate `name` of `op` (a TrainingConfigError naming the valid ones otherwise)."""
    if op not in CANDIDATES:
        raise TrainingConfigError(f"kernels: {op!r} is not an op hwrun chooses a kernel for; the ops are "
                                  f"{', '.join(OPS)}.")
    for item in CANDIDATES[op]:
        if item.name == name:
            return item
    names = ", ".join(c.name for c in CANDIDATES[op])
    raise TrainingConfigError(f"kernels[{op!r}]={name!r} is not an implementation of {op}; choose 'auto' or one of "
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
    if item.source == "hwrun" and item.op in ("cross_entropy", "swiglu"):
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


def own_blocker(op: str, kind: str) -> str | None:
    """None when hwrun's own `op` can run as the default on `kind` here, else why not."""
    from hwrun.devices import row

    from .patches.fused_loss import TRITON_KERNELS

    why = runs_on(candidate(op, "hwrun"), kind)
    if why is None and op in ("cross_entropy", "swiglu"):
        usable, row_why = row(TRITON_KERNELS, kind, (False, f"hwrun has no Triton row for the device kind {kind!r}"))
        why = None if usable else f"hwrun's Triton kernels are not used on {kind}: {row_why}"
    return why


def auto_choice(op: str, kind: str) -> Choice:
    """What `kernels="auto"` runs for `op` on `kind`, by the module's rule, with the figures that decided.
    Every reason starts with the implementation's name and a colon."""
    default, default_why = UNMEASURED_DEFAULT[op]
    own = measured(op, "hwrun", kind)
    unmeasured = [c.name for c in CANDIDATES[op] if c.name != default and measured(op, c.name, kind) is None
                  and runs_on(c, kind) is None]  # candidates that cannot run here are not pending
    pending = f"; not measured yet on {kind}: {', '.join(unmeasured)}" if unmeasured else ""
    blocker = own_blocker(op, kind) if own is not None else None
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


#: The older keywords' values per kernel-policy name ('hwrun' is 'triton', 'inductor' is 'torch').
LEGACY_NAMES = {"hwrun": "triton", "inductor": "torch"}
LEGACY_KEYWORDS = {"cross_entropy": "loss_kernel", "swiglu": "swiglu_kernel"}


def explicit_choice(op: str, impl: str, kind: str, spelled: str | None = None) -> Choice:
    """`impl` for `op`, asked for explicitly: checked to run on `kind` here (TrainingConfigError otherwise).
    `spelled` is how the user asked when it was an older keyword (e.g. "loss_kernel='triton'"): the error
    names it, and the fix is given in that keyword's values."""
    item = candidate(op, impl)
    why_not = runs_on(item, kind)
    if why_not is not None:
        from hwrun.devices import platform

        runnable = [c.name for c in CANDIDATES[op] if runs_on(c, kind) is None]
        where = f"{platform(kind).display_name} ({kind})"
        if spelled is not None:
            keyword = LEGACY_KEYWORDS[op]
            values = [f"'{LEGACY_NAMES[name]}'" for name in runnable if name in LEGACY_NAMES]
            raise TrainingConfigError(f"{spelled} (kernels[{op!r}]={impl!r}) cannot run on {where}: {why_not}. "
                                      f"Fix: use {keyword}={' or '.join([*values, repr('auto')])}, or kernels="
                                      f"{{{op!r}: ...}} with one of {', '.join(runnable)}.")
        raise TrainingConfigError(f"kernels[{op!r}]={impl!r} cannot run on {where}: "
                                  f"{why_not}. Fix: choose 'auto' or one of {', '.join(runnable)} for {op} there.")
    figure = measured(op, impl, kind)
    note = _figure(figure).replace(" end to end", "") if figure else f"not measured yet on {kind}"
    return Choice(op, impl, f"{impl}: asked for ({item.what}); {note}")


def legacy_asks(loss_kernel: str, swiglu_kernel: str) -> dict[str, str]:
    """The old keywords as kernel choices: loss_kernel/swiglu_kernel 'triton' is hwrun's kernel, 'torch' the
    torch form under inductor, 'auto' no choice."""
    mapping = {value: name for name, value in LEGACY_NAMES.items()}
    asks = {}
    if loss_kernel != "auto":
        asks["cross_entropy"] = mapping[loss_kernel]
    if swiglu_kernel != "auto":
        asks["swiglu"] = mapping[swiglu_kernel]
    return asks


def legacy_spellings(loss_kernel: str = "auto", swiglu_kernel: str = "auto") -> dict[str, str]:
    """{op: "loss_kernel='triton'"} for each op asked for through an older keyword (for error messages)."""
    given = {"cross_entropy": loss_kernel, "swiglu": swiglu_kernel}
    return {op: f"{LEGACY_KEYWORDS[op]}={given[op]!r}" for op in legacy_asks(loss_kernel, swiglu_kernel)}


def check_kernels(kernels: Mapping[str, str] | None, loss_kernel: str = "auto",
                  swiglu_kernel: str = "auto") -> dict[str, str]:
    """The explicit choices of a run, checked by name only (no device yet): `kernels` merged with the old
    `loss_kernel`/`swiglu_kernel` keywords, which must not contradict it. Returns {op: impl} without 'auto'."""
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
    spellings = legacy_spellings(loss_kernel, swiglu_kernel)
    for op, impl in legacy_asks(loss_kernel, swiglu_kernel).items():
        if op in asks and asks[op] != impl:
            raise TrainingConfigError(f"{spellings[op]} asks for kernels[{op!r}]={impl!r} but kernels[{op!r}]="
                                      f"{asks[op]!r}; give one of them (kernels= is the newer spelling).")
        asks[op] = impl
    return asks


def resolve(kind: str, asks: Mapping[str, str], spelled: Mapping[str, str] | None = None) -> dict[str, Choice]:
    """Every op's choice on the platform `kind`: the explicit ones checked to run there, the rest by the rule.
    `spelled`: {op: how the user asked} for ops asked through an older keyword (see `legacy_spellings`)."""
    spelled = spelled or {}
    return {op: explicit_choice(op, asks[op], kind, spelled.get(op)) if op in asks else auto_choice(op, kind)
            for op in OPS}


def policy_rows(kinds: tuple[str, ...] = ("cuda", "xpu", "rocm", "hpu", "mps", "cpu")) -> list[dict[str, str]]:
    """The policy as table rows (op, candidate, per-kind measured ratio or 'not measured', chosen defaults), for
    docs/benchmarks/train.md's "Kernel policy" table."""
    rows = []
    for op in OPS:
        for item in CANDIDATES[op]:
            cells = {}
            for kind in kinds:
                figure = measured(op, item.name, kind)
                cells[kind] = f"{figure.ratio - 1:+.1%} vs {figure.baseline}" if figure else "not measured"
            rows.append({"op": op, "candidate": item.name, **cells})
    return rows
