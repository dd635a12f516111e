"""`Accelerator`, the frozen description of the device a run will use, and `detect()`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from .errors import DeviceOverrideError
from .kinds import DETECTION_ORDER, KIND_NAMES, KINDS
from .probes import ProbeResult, run_probe
from .versions import installed_version

OVERRIDE_VARIABLE = "HWENV_DEVICE"


@dataclass(frozen=True)
class Accelerator:
    """Which accelerator a run uses: kind, how many, names, bf16, memory and the versions that matter.

    Build one directly for decisions about a machine you are not on (`Accelerator("xpu", 4)`),
    or call `detect()` for this one.
    """

    kind: str
    count: int = 1
    names: tuple[str, ...] = ()
    bf16: bool | None = True
    memory: tuple[int, ...] = ()
    capability: tuple[int, int] | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    accelerate_version: str | None = None
    source: str = "given"
    reasons: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DeviceOverrideError(
                f"Unknown accelerator kind {self.kind!r}; valid kinds are {', '.join(DETECTION_ORDER)}."
            )
        if self.count < 0:
            raise DeviceOverrideError(f"Accelerator count must be >= 0, got {self.count}.")

    @property
    def device(self) -> str:
        """The torch device string of the first device: `xpu:0`, `cuda:0`, `hpu`, `mps`, `cpu`."""
        if self.kind in ("xpu", "cuda"):
            return f"{self.kind}:0"
        return self.kind

    @property
    def name(self) -> str:
        """A human name of the kind, e.g. `Intel GPU (XPU)`."""
        return KIND_NAMES[self.kind]

    @property
    def memory_per_device(self) -> int | None:
        """Smallest device memory in bytes, or None when unknown."""
        return min(self.memory) if self.memory else None

    def to_dict(self) -> dict:
        """A JSON-ready dict of every field plus `device`."""
        data = asdict(self)
        data["device"] = self.device
        data["names"] = list(self.names)
        data["memory"] = list(self.memory)
        data["reasons"] = list(self.reasons)
        data["capability"] = list(self.capability) if self.capability else None
        return data


def _from_probe(result: ProbeResult, source: str, reasons: tuple[str, ...]) -> Accelerator:
    return Accelerator(
        kind=result.kind,
        count=result.count,
        names=result.names,
        bf16=result.bf16,
        memory=result.memory,
        capability=result.capability,
        torch_version=installed_version("torch"),
        transformers_version=installed_version("transformers"),
        accelerate_version=installed_version("accelerate"),
        source=source,
        reasons=reasons,
    )


def detect(environ: Mapping[str, str] | None = None) -> Accelerator:
    """The accelerator this process will use.

    `HWENV_DEVICE` (like DeepSpeed's `DS_ACCELERATOR`) picks a kind and is validated: an
    unknown kind, or a kind that is not usable here, is a `DeviceOverrideError`. Without it,
    the first usable kind in `hpu -> xpu -> cuda -> mps -> cpu` wins; why each earlier kind
    was skipped is kept in `reasons`.
    """
    env = os.environ if environ is None else environ
    override = env.get(OVERRIDE_VARIABLE, "").strip()
    if override:
        kind = override.lower()
        if kind not in KINDS:
            raise DeviceOverrideError(
                f"{OVERRIDE_VARIABLE}={override!r} is not an accelerator kind hwenv knows; "
                f"use one of {', '.join(DETECTION_ORDER)}, or unset it to detect."
            )
        result = run_probe(kind)
        if not result.available:
            raise DeviceOverrideError(
                f"{OVERRIDE_VARIABLE}={override!r} asks for {KIND_NAMES[kind]}, but it is not usable here: "
                f"{result.reason}. Unset {OVERRIDE_VARIABLE} to detect, or install that device's stack."
            )
        return _from_probe(result, OVERRIDE_VARIABLE, ())
    reasons: list[str] = []
    for kind in DETECTION_ORDER:
        result = run_probe(kind)
        if result.available:
            return _from_probe(result, "detected", tuple(reasons))
        reasons.append(f"{kind}: {result.reason}")
    raise AssertionError("unreachable: the CPU probe is always available")
