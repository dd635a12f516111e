"""Training-time model patches (fused loss, fused projections, SwiGLU, RoPE table), each explicit,
idempotent and reversible; `record.py` holds the `ModelPatch` record they return."""
