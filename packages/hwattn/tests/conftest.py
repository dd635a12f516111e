"""Shared helpers for hwattn's tests: tiny model configs and a clean fallback log per test."""

from __future__ import annotations

import pytest


def tiny_llama_config(num_key_value_heads: int = 2, **overrides):
    """A tiny Llama config (4 query heads; 2 KV heads = GQA by default)."""
    from transformers import LlamaConfig

    values = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=num_key_value_heads, vocab_size=256, max_position_embeddings=64)
    values.update(overrides)
    return LlamaConfig(**values)


@pytest.fixture(autouse=True)
def _fresh_fallback_log():
    """Each test starts with no fallback logged yet (the log-once set is process-wide)."""
    from hwattn import resolve

    saved = set(resolve._logged_fallbacks)
    resolve._logged_fallbacks.clear()
    yield
    resolve._logged_fallbacks.clear()
    resolve._logged_fallbacks.update(saved)


@pytest.fixture(scope="session")
def tiny_config():
    return tiny_llama_config()


@pytest.fixture(scope="session")
def make_config():
    """Factory fixture for tiny Llama configs (tests cannot import conftest under importlib mode)."""
    return tiny_llama_config
