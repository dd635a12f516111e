"""Transformers' continuous batching runs outside inference mode (issue 26 point 2: its loop thread updates
tensors its warm-up created; on CUDA an inference tensor there raised). Checked for real on the H200 by
tests/gpu/test_gpu_accelerator.py::test_transformers_continuous_batching_through_hwrun."""

from __future__ import annotations

import importlib

import hwrun
import torch

generate_module = importlib.import_module("hwrun.inference.generate")  # the module, not hwrun.generate() (issue 26)


def test_generate_batch_is_called_under_no_grad_not_inference_mode(monkeypatch):
    seen = {}
    original = generate_module._continuous

    def spy(*args, **kwargs):
        seen["inference_mode"] = torch.is_inference_mode_enabled()
        seen["grad"] = torch.is_grad_enabled()
        return original(*args, **kwargs)

    monkeypatch.setattr(generate_module, "_continuous", spy)
    plan = hwrun.plan(device="cpu")
    prompts = ["The king said", "Once upon a time there was", "In the beginning"]
    result = hwrun.generate(plan, prompts, max_new_tokens=6, batching="continuous", decode="generate")
    assert result.batching == "continuous"
    assert seen == {"inference_mode": False, "grad": False}
    static = hwrun.generate(plan, prompts, max_new_tokens=6, batching="static", decode="generate")
    assert result.token_ids == static.token_ids
