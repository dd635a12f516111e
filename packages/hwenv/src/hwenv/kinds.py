"""The accelerator kinds hwstack knows, in the one detection order used everywhere."""

from __future__ import annotations

from typing import Literal

Kind = Literal["hpu", "xpu", "cuda", "mps", "cpu"]

#: Detection order: Gaudi first (it is never present by accident), then Intel GPU, NVIDIA, Apple, CPU.
DETECTION_ORDER: tuple[str, ...] = ("hpu", "xpu", "cuda", "mps", "cpu")
KINDS: frozenset[str] = frozenset(DETECTION_ORDER)

#: The variable that restricts which devices of a kind a process sees.
VISIBLE_DEVICES_VARIABLE: dict[str, str | None] = {
    "xpu": "ZE_AFFINITY_MASK",
    "hpu": "HABANA_VISIBLE_MODULES",
    "cuda": "CUDA_VISIBLE_DEVICES",
    "mps": None,
    "cpu": None,
}

#: Human names used in reports and error messages.
KIND_NAMES: dict[str, str] = {
    "xpu": "Intel GPU (XPU)",
    "hpu": "Intel Gaudi (HPU)",
    "cuda": "NVIDIA GPU (CUDA)",
    "mps": "Apple GPU (MPS)",
    "cpu": "CPU",
}
