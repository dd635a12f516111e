"""`Accelerator`, the frozen description of the device a run will use, and `detect()`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from .errors import AcceleratorFieldError, DeviceOverrideError, PlatformConflictError, PlatformError
from .platforms import Platform, get_platform, kinds, platforms
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
    bf16_source: str = field(default="", compare=False)
    memory_source: str = field(default="", compare=False)
    #: bf16 is not native but runs emulated, and the stack accepts it (torch.xpu.is_bf16_supported() is True,
    #: so TrainingArguments(bf16=True) runs): usable when asked for, slow, and said so.
    bf16_emulated: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise AcceleratorFieldError(f"Accelerator kind {self.kind!r} is {type(self.kind).__name__}, not a string; pass one of "
                                        f"{', '.join(kinds())}.")
        try:
            get_platform(self.kind)
        except PlatformError:
            raise DeviceOverrideError(
                f"Unknown accelerator kind {self.kind!r}; valid kinds are {', '.join(kinds())}."
            ) from None
        # a str count ('2' from an environment variable or a CLI) would fail below as a TypeError, or compare as text
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 0:
            raise AcceleratorFieldError(
                f"Accelerator count {self.count!r} ({type(self.count).__name__}) must be an int >= 0, the number of "
                f"devices; convert it first, e.g. Accelerator({self.kind!r}, count=int(text)).")
        if self.bf16 not in (True, False, None) or isinstance(self.bf16, int) and not isinstance(self.bf16, bool):
            raise AcceleratorFieldError(f"Accelerator bf16 {self.bf16!r} must be True, False or None (unknown).")

    @property
    def platform(self) -> Platform:
        """This kind's `Platform`: every device fact other packages ask."""
        return get_platform(self.kind)

    @property
    def device_type(self) -> str:
        """The torch device type: `xpu`, `cuda` (NVIDIA and ROCm), `hpu`, `mps`, `cpu`."""
        return self.platform.device_type

    @property
    def device(self) -> str:
        """The torch device string of the first device: `xpu:0`, `cuda:0`, `hpu`, `mps`, `cpu`."""
        return self.platform.device

    @property
    def name(self) -> str:
        """A human name of the kind, e.g. `Intel GPU (XPU)`."""
        return self.platform.display_name

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
        bf16_source=result.bf16_source,
        memory_source=result.memory_source,
        bf16_emulated=result.bf16_emulated,
    )


def detect(environ: Mapping[str, str] | None = None) -> Accelerator:
    """The accelerator this process will use.

    `HWENV_DEVICE` (like DeepSpeed's `DS_ACCELERATOR`) picks a registered kind and is validated:
    an unknown kind, or a kind that is not usable here, is a `DeviceOverrideError`. Without it,
    every registered platform is probed; exactly one accelerator may claim the machine (two is a
    `PlatformConflictError` naming both, as in vLLM), and the CPU is the fallback. Why each
    other kind was not chosen is kept in `reasons`.
    """
    env = os.environ if environ is None else environ
    override = env.get(OVERRIDE_VARIABLE, "").strip()
    if override:
        kind = override.lower()
        try:
            platform = get_platform(kind)
        except PlatformError:
            raise DeviceOverrideError(
                f"{OVERRIDE_VARIABLE}={override!r} is not an accelerator kind hwenv knows; "
                f"use one of {', '.join(kinds())}, or unset it to detect."
            ) from None
        result = run_probe(kind)
        if not result.available:
            raise DeviceOverrideError(
                f"{OVERRIDE_VARIABLE}={override!r} asks for {platform.display_name}, but it is not usable here: "
                f"{result.reason}. Unset {OVERRIDE_VARIABLE} to detect, or install that device's stack."
            )
        return _from_probe(result, OVERRIDE_VARIABLE, ())
    results = {p.kind: run_probe(p.kind) for p in platforms()}
    return choose(results)


def choose(results: Mapping[str, ProbeResult]) -> Accelerator:
    """The accelerator among probe `results` (kind -> result): the one claiming accelerator, else CPU."""
    claiming = [kind for kind, result in results.items() if result.available and get_platform(kind).is_accelerator]
    if len(claiming) > 1:
        listed = " and ".join(f"{get_platform(k).display_name} ({k}, {results[k].count} device(s))" for k in claiming)
        raise PlatformConflictError(
            f"Two accelerator platforms claim this machine: {listed}. Set {OVERRIDE_VARIABLE} to one of "
            f"{', '.join(claiming)} to choose."
        )
    chosen = claiming[0] if claiming else next(
        kind for kind, result in results.items() if result.available and not get_platform(kind).is_accelerator
    )
    reasons = tuple(f"{kind}: {result.reason}" for kind, result in results.items() if not result.available)
    return _from_probe(results[chosen], "detected", reasons)
