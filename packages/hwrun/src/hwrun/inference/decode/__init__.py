"""Graph decoders: the static-cache decoder (`static.py`), the slot decoder for many prompts and its
step-wise API (`slots.py`), sampling on the device (`sampling.py`) and the fused Llama-family step
(`fused_step.py`). `SamplingParams` and `TokenEvent` are importable from here."""

from .sampling import SamplingParams
from .slots import TokenEvent

__all__ = ["SamplingParams", "TokenEvent"]
