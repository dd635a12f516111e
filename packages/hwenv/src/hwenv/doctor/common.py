"""What every doctor check shares: `Problem`, and the checks that are about no one device."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..accelerator import Accelerator
from ..affinity import MASK_VARIABLE
from ..gaudi import DEVICES_VARIABLE, MODULES_VARIABLE
from ..probes import ProbeResult

#: Variables that, exported in a shell, silently steer every later run (X4, G6).
LEAKY_VARIABLES = (MASK_VARIABLE, MODULES_VARIABLE, DEVICES_VARIABLE, "CUDA_VISIBLE_DEVICES")

Checks = tuple[list["Problem"], list[str]]


@dataclass(frozen=True)
class Problem:
    """One thing that is wrong or risky, with the fix."""

    code: str
    severity: str  # "error" | "warning"
    message: str
    fix: str



def common_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """Selections exported in the shell, and bf16 on a GPU that lacks it."""
    problems: list[Problem] = []
    for variable in LEAKY_VARIABLES:
        if variable in env:
            problems.append(Problem(
                "exported-selection", "warning",
                f"{variable}={env[variable]!r} is set in this shell: every later run inherits it and may use "
                f"the wrong devices (X4, G6).",
                f"unset {variable}; set it for one command only: hwenv exec --devices {env[variable]} -- CMD",
            ))
    if acc is not None and acc.platform.is_accelerator and acc.bf16 is False and acc.bf16_emulated:
        problems.append(Problem(
            "bf16-emulated", "warning",
            f"{acc.name} {acc.names[0] if acc.names else ''} runs bf16 emulated, not natively "
            f"({acc.bf16_source or 'as its stack reports it'}): torch's default is_bf16_supported() says yes, so "
            f"TrainingArguments(bf16=True) and hwrun's dtype='bfloat16' run, slowly (X17).",
            "use fp32 for speed (hwrun's dtype='auto' picks it here), or keep bf16 for its memory saving knowing it "
            "is emulated",
        ))
    elif acc is not None and acc.platform.is_accelerator and acc.bf16 is False:
        problems.append(Problem(
            "bf16-unsupported", "warning",
            f"{acc.name} {acc.names[0] if acc.names else ''} has no bf16 "
            f"({acc.bf16_source or 'as its stack reports it'}): TrainingArguments(bf16=True) raises ValueError "
            f"where the stack's check says no (X17).",
            "train in fp32 or fp16; hwrun picks fp32 here by itself",
        ))
    return problems, []
