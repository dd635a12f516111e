"""Graph decoders: the static-cache decoder (`static.py`), the slot decoder for many prompts
(`slots.py`) and the fused Llama-family step (`fused_step.py`)."""
