"""The static-batch graph decoder (`static.py`) and the pieces hwrun's engine (hwrun.inference.engine) steps with:
sampling on the device (`sampling.py`), the fused Llama-family step (`fused_step.py`) and the per-row slot cache of
the model's own forward (`slot_cache.py`). `SamplingParams` is importable from here."""

from .sampling import SamplingParams

__all__ = ["SamplingParams"]
