"""`hwenv doctor`: what is here, what is wrong, and how to fix each problem.

Unlike `accelerate env`, it reports Gaudi too, and explains why
`transformers.is_torch_hpu_available()` can be False with a Gaudi present (G5).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from . import gaudi
from .accelerator import OVERRIDE_VARIABLE, Accelerator, detect
from .affinity import MASK_VARIABLE, PCI_ORDER_VARIABLE, parse_affinity_mask
from .errors import HwenvError
from .kinds import DETECTION_ORDER, KIND_NAMES
from .probes import ProbeResult, run_probe
from .versions import GAUDI_MIN_ACCELERATE, accelerate_sees_gaudi, format_version, library_versions

#: Variables that, exported in a shell, silently steer every later run (X4, G6).
LEAKY_VARIABLES = (MASK_VARIABLE, gaudi.MODULES_VARIABLE, gaudi.DEVICES_VARIABLE, "CUDA_VISIBLE_DEVICES")
REPORTED_VARIABLES = (
    OVERRIDE_VARIABLE, MASK_VARIABLE, PCI_ORDER_VARIABLE, gaudi.MODULES_VARIABLE, gaudi.DEVICES_VARIABLE,
    gaudi.INT64_VARIABLE, gaudi.LAZY_MODE_VARIABLE, "CUDA_VISIBLE_DEVICES",
)


@dataclass(frozen=True)
class Problem:
    """One thing that is wrong or risky, with the fix."""

    code: str
    severity: str  # "error" | "warning"
    message: str
    fix: str


@dataclass(frozen=True)
class Report:
    """The doctor's findings: the accelerator (or the error detecting it), probes, versions, problems."""

    accelerator: Accelerator | None
    detection_error: str | None
    probes: tuple[ProbeResult, ...]
    versions: dict[str, str | None]
    environment: dict[str, str]
    platform: str
    notes: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = field(default=())

    def to_dict(self) -> dict:
        """JSON-ready form (`hwenv doctor --json`)."""
        return {
            "accelerator": self.accelerator.to_dict() if self.accelerator else None,
            "detection_error": self.detection_error,
            "probes": [
                {**asdict(p), "names": list(p.names), "memory": list(p.memory),
                 "capability": list(p.capability) if p.capability else None}
                for p in self.probes
            ],
            "versions": self.versions,
            "environment": self.environment,
            "platform": self.platform,
            "notes": list(self.notes),
            "problems": [asdict(p) for p in self.problems],
            "ok": not any(p.severity == "error" for p in self.problems),
        }

    def render(self) -> str:
        """The human-readable report."""
        lines = ["hwenv doctor", ""]
        if self.accelerator:
            acc = self.accelerator
            lines.append(f"Accelerator: {acc.name}  kind={acc.kind} count={acc.count} device={acc.device} ({acc.source})")
            for index, name in enumerate(acc.names):
                mem = f", {acc.memory[index] / 2**30:.1f} GiB" if index < len(acc.memory) else ""
                lines.append(f"  [{index}] {name}{mem}")
            lines.append(f"  bf16: {'yes' if acc.bf16 else 'no' if acc.bf16 is False else 'unknown'}")
        else:
            lines.append(f"Accelerator: could not be detected: {self.detection_error}")
        lines += ["", "Probes:"]
        for probe in self.probes:
            state = f"available, {probe.count} device(s)" if probe.available else f"not available: {probe.reason}"
            lines.append(f"  {probe.kind:<5} {state}")
        lines += ["", "Versions:"]
        lines += [f"  {name:<20} {version or 'not installed'}" for name, version in self.versions.items()]
        lines += ["", f"Platform: {self.platform}", "", "Environment:"]
        if self.environment:
            lines += [f"  {key}={value}" for key, value in self.environment.items()]
        else:
            lines.append("  (no device-selection variables set)")
        if self.notes:
            lines += ["", "Notes:"] + [f"  - {note}" for note in self.notes]
        lines += ["", "Problems:" if self.problems else "Problems: none"]
        for problem in self.problems:
            lines.append(f"  [{problem.severity}] {problem.code}: {problem.message}")
            lines.append(f"      fix: {problem.fix}")
        return "\n".join(lines)


def _plugin_importable() -> bool:
    """Whether `habana_frameworks` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec("habana_frameworks") is not None
    except (ImportError, ValueError):
        return False


def _problems(acc: Accelerator | None, probes: dict[str, ProbeResult], env: Mapping[str, str]) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    notes: list[str] = []
    hpu, xpu = probes["hpu"], probes["xpu"]
    plugin_present = _plugin_importable()
    if plugin_present and not accelerate_sees_gaudi():
        acc_version = library_versions().get("accelerate")
        problems.append(Problem(
            "accelerate-too-old-for-gaudi", "error",
            f"Accelerate {acc_version or '(not installed)'} is older than {format_version(GAUDI_MIN_ACCELERATE)}: "
            f"transformers.is_torch_hpu_available() returns False even with a Gaudi present (G3, G5).",
            f"pip install 'accelerate>={format_version(GAUDI_MIN_ACCELERATE)}'",
        ))
    if acc is not None and acc.kind == "hpu":
        if env.get(gaudi.INT64_VARIABLE) != "1":
            problems.append(Problem(
                "int64-disabled", "error",
                f"{gaudi.INT64_VARIABLE} is {repr(env[gaudi.INT64_VARIABLE]) if gaudi.INT64_VARIABLE in env else 'not set'}: "
                f"Transformers uses int64 token ids, "
                f"which Gaudi rejects unless int64 support is on (G4).",
                f"run with {gaudi.INT64_VARIABLE}=1 (hwenv exec and hwenv env set it for you)",
            ))
        lazy = env.get(gaudi.LAZY_MODE_VARIABLE)
        if lazy == "1":
            notes.append(f"Gaudi execution mode: lazy ({gaudi.LAZY_MODE_VARIABLE}=1). torch.compile needs eager mode.")
            problems.append(Problem(
                "lazy-mode-blocks-compile", "warning",
                f"{gaudi.LAZY_MODE_VARIABLE}=1 selects lazy mode; torch.compile (hpu_backend) needs eager mode (G2, G13).",
                f"run with {gaudi.LAZY_MODE_VARIABLE}=0 to use torch.compile, or do not compile",
            ))
        else:
            notes.append(
                f"Gaudi execution mode: eager ({gaudi.LAZY_MODE_VARIABLE}={lazy!r}); ops run when called (G2), "
                f"torch.compile routes to hpu_backend."
            )
    for variable in LEAKY_VARIABLES:
        if variable in env:
            problems.append(Problem(
                "exported-selection", "warning",
                f"{variable}={env[variable]!r} is set in this shell: every later run inherits it and may use "
                f"the wrong devices (X4, G6).",
                f"unset {variable}; set it for one command only: hwenv exec --devices {env[variable]} -- CMD",
            ))
    if MASK_VARIABLE in env:
        try:
            parse_affinity_mask(env[MASK_VARIABLE], xpu.count if xpu.available else None)
        except HwenvError as error:
            problems.append(Problem("invalid-affinity-mask", "error", str(error), f"fix or unset {MASK_VARIABLE}"))
        if env.get(PCI_ORDER_VARIABLE) != "1":
            problems.append(Problem(
                "unstable-xpu-order", "warning",
                f"{MASK_VARIABLE} is set without {PCI_ORDER_VARIABLE}=1: the mask's order does not set enumeration "
                f"order, which may change between runs (X5).",
                f"also set {PCI_ORDER_VARIABLE}=1 (hwenv exec does)",
            ))
    if acc is not None and acc.kind in ("xpu", "cuda") and acc.bf16 is False:
        problems.append(Problem(
            "bf16-unsupported", "warning",
            f"{acc.name} {acc.names[0] if acc.names else ''} does not support bf16: TrainingArguments(bf16=True) "
            f"raises ValueError (X17).",
            "train in fp32 or fp16; hwrun picks fp32 here by itself",
        ))
    if not xpu.available and shutil.which("xpu-smi") and "no XPU backend" in xpu.reason:
        problems.append(Problem(
            "torch-without-xpu", "error",
            "xpu-smi is installed (an Intel GPU driver is here) but this torch build has no XPU backend (X1, X2).",
            'pip install "transformers[torch]" --extra-index-url https://download.pytorch.org/whl/xpu',
        ))
    if not hpu.available and shutil.which("hl-smi") and not plugin_present:
        problems.append(Problem(
            "torch-without-hpu", "error",
            "hl-smi is installed (a Gaudi driver is here) but habana_frameworks is not importable (G3).",
            gaudi.PLUGIN_INSTALL_HINT,
        ))
    return problems, notes


def diagnose(environ: Mapping[str, str] | None = None) -> Report:
    """Probe every kind and return the `Report`; never raises for a broken stack."""
    env = dict(os.environ if environ is None else environ)
    probes = {kind: run_probe(kind) for kind in DETECTION_ORDER}
    acc: Accelerator | None
    try:
        acc = detect(env)
        error = None
    except HwenvError as exc:
        acc, error = None, str(exc)
    problems, notes = _problems(acc, probes, env)
    if error is not None:
        problems.insert(0, Problem("detection-failed", "error", error, f"unset {OVERRIDE_VARIABLE} or install that device's stack"))
    available = [kind for kind, probe in probes.items() if probe.available and kind != "cpu"]
    if len(available) > 1:
        notes.append(
            f"More than one accelerator kind is usable ({', '.join(available)}); {available[0]} wins by the "
            f"detection order {' > '.join(DETECTION_ORDER)}. Set {OVERRIDE_VARIABLE} to choose."
        )
    return Report(
        accelerator=acc,
        detection_error=error,
        probes=tuple(probes.values()),
        versions=library_versions(),
        environment={k: env[k] for k in REPORTED_VARIABLES if k in env},
        platform=f"{platform.system()} {platform.release()} {platform.machine()}, Python {platform.python_version()}",
        notes=tuple(notes),
        problems=tuple(problems),
    )


__all__ = ["Problem", "Report", "diagnose", "KIND_NAMES"]
