"""`hwenv doctor`: what is here, what is wrong, and how to fix each problem.

Unlike `accelerate env`, it reports Gaudi too, and explains why
`transformers.is_torch_hpu_available()` can be False with a Gaudi present (G5).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from .. import gaudi
from ..accelerator import OVERRIDE_VARIABLE, Accelerator, choose, detect
from ..affinity import MASK_VARIABLE, PCI_ORDER_VARIABLE
from ..errors import HwenvError
from ..platforms import ENTRY_POINT_GROUP, origin_of, platforms, plugin_errors
from ..probes import ProbeResult, run_probe
from ..versions import library_versions
from .common import Problem, common_checks
from .gaudi_checks import gaudi_checks
from .hub_kernel_checks import hub_kernel_checks
from .selection_checks import selection_checks
from .xpu_checks import xpu_checks

REPORTED_VARIABLES = (
    OVERRIDE_VARIABLE, MASK_VARIABLE, PCI_ORDER_VARIABLE, gaudi.MODULES_VARIABLE, gaudi.DEVICES_VARIABLE,
    gaudi.INT64_VARIABLE, gaudi.LAZY_MODE_VARIABLE, "HLS_MODULE_ID", "ZE_FLAT_DEVICE_HIERARCHY",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZES_ENABLE_SYSMAN", "USE_HUB_KERNELS",
    "HF_HUB_OFFLINE",
)


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


#: The checks, one per area; each returns (problems, notes).
CHECKS = (gaudi_checks, xpu_checks, selection_checks, common_checks, hub_kernel_checks)


def _problems(acc, probes, env):
    problems: list[Problem] = []
    notes: list[str] = []
    for check in CHECKS:
        found, said = check(acc, probes, env)
        problems += found
        notes += said
    return problems, notes


def diagnose(environ: Mapping[str, str] | None = None) -> Report:
    """Probe every kind and return the `Report`; never raises for a broken stack."""
    env = dict(os.environ if environ is None else environ)
    probes = {p.kind: run_probe(p.kind) for p in platforms()}
    acc: Accelerator | None
    try:
        acc = detect(env) if env.get(OVERRIDE_VARIABLE, "").strip() else choose(probes)
        error = None
    except HwenvError as exc:
        acc, error = None, str(exc)
    problems, notes = _problems(acc, probes, env)
    if error is not None:
        problems.insert(0, Problem("detection-failed", "error", error, f"set or unset {OVERRIDE_VARIABLE}, or install that device's stack"))
    for kind in probes:
        if not origin_of(kind).startswith("built-in"):
            notes.append(f"Platform {kind!r} comes from {origin_of(kind)}.")
    for message in plugin_errors():
        problems.append(Problem(
            "platform-plugin-failed", "warning", message,
            f"fix or uninstall the distribution that provides it (entry-point group {ENTRY_POINT_GROUP!r})",
        ))
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


__all__ = ["CHECKS", "Problem", "Report", "diagnose"]
