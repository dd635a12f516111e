"""Gaudi generations as data: each generation's facts, and `generation_of(device_name)`.

A new Gaudi is not refused bf16 or 4/8-bit just because its name is new: a name hwenv does
not know gets the newest known generation's rules, with `known=False` (doctor warns).

Names are what `torch.hpu.get_device_name()` returns: the Synapse device name
(`synDeviceGetName`, gaudi-pytorch-bridge 1.19 `backend/synapse_helpers/device.h`), i.e.
`"GAUDI"` (first generation; the bridge's `common/eager/utils.cpp` compares against it),
`"GAUDI2"`, `"GAUDI3"` (INTEL.md S8).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GaudiGeneration:
    """One Gaudi generation's facts. `known` is False when the name was not in the table.

    - `bf16`: every generation (FACTS.md G12).
    - `int64`: `PT_ENABLE_INT64_SUPPORT` supported (eager mode only; Gaudi2 or newer;
      bridge 1.19 `scripts/env_flags.yaml`, `common/eager/utils.cpp`).
    - `bnb_4bit`, `bnb_8bit`: bitsandbytes quantization, Gaudi 2 and Gaudi 3 (G10, G11).
    - `fp8`: FP8 inference/training, Gaudi 2 and Gaudi 3 (docs.habana.ai "Run Inference Using FP8").
    """

    name: str
    number: int
    display_name: str
    bf16: bool
    int64: bool
    bnb_4bit: bool
    bnb_8bit: bool
    fp8: bool
    known: bool = True
    device_name: str = ""

    def reason(self) -> str:
        """One sentence naming the generation and, for an unknown name, whose rules it gets."""
        if self.known:
            return f"{self.device_name or self.name} is {self.display_name}"
        return (f"{self.device_name!r} is not a Gaudi name hwenv knows ({', '.join(known_generation_names())}); "
                f"it gets the rules of the newest known generation, {self.display_name}")


#: Every known generation, oldest first. Add a row for a new generation; nothing else changes.
GAUDI_GENERATIONS: tuple[GaudiGeneration, ...] = (
    GaudiGeneration("GAUDI", 1, "Gaudi 1", bf16=True, int64=False, bnb_4bit=False, bnb_8bit=False, fp8=False),
    GaudiGeneration("GAUDI2", 2, "Gaudi 2", bf16=True, int64=True, bnb_4bit=True, bnb_8bit=True, fp8=True),
    GaudiGeneration("GAUDI3", 3, "Gaudi 3", bf16=True, int64=True, bnb_4bit=True, bnb_8bit=True, fp8=True),
)

_NAME = re.compile(r"^GAUDI(\d*)$")


def known_generation_names() -> tuple[str, ...]:
    """The device names in the table (`"GAUDI"`, `"GAUDI2"`, `"GAUDI3"`)."""
    return tuple(generation.name for generation in GAUDI_GENERATIONS)


def newest_generation() -> GaudiGeneration:
    """The newest known generation (the rules an unknown name gets)."""
    return max(GAUDI_GENERATIONS, key=lambda generation: generation.number)


def generation_of(device_name: str | None) -> GaudiGeneration:
    """The generation of a Gaudi named `device_name` (as `torch.hpu.get_device_name()` returns it).

    Matching ignores case and surrounding spaces. An unknown or empty name gets the newest
    known generation's facts with `known=False`.
    """
    text = (device_name or "").strip()
    match = _NAME.match(text.upper())
    if match:
        number = int(match.group(1) or "1")
        for generation in GAUDI_GENERATIONS:
            if generation.number == number:
                return dataclasses.replace(generation, device_name=text)
    return dataclasses.replace(newest_generation(), known=False, device_name=text)
