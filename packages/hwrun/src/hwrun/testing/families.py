"""Tiny random models of common decoder families, built from their Transformers config classes and
saved like Hub models (config.json, model.safetensors, tokenizer), for the family test matrix.

`build_tiny_family(name, directory)` writes one; `FAMILIES` lists them. Every family shares one
byte-level BPE tokenizer (hwrun.testing's), so each config's vocabulary is made to match it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Dimensions every tiny family shares (names as most Transformers configs spell them).
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, LAYERS, POSITIONS = 32, 4, 2, 8, 64, 2, 256

_LLAMA_LIKE: dict[str, Any] = {
    "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": POSITIONS,
}


@dataclass(frozen=True)
class Family:
    """One decoder family: its Transformers config class, model type, and the tiny settings."""

    name: str
    config_class: str
    model_type: str
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""


FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("llama", "LlamaConfig", "llama", dict(_LLAMA_LIKE)),
    Family("qwen2", "Qwen2Config", "qwen2", dict(_LLAMA_LIKE)),
    Family("qwen3", "Qwen3Config", "qwen3", {**_LLAMA_LIKE, "head_dim": HEAD_DIM}),
    Family("mistral", "MistralConfig", "mistral", {**_LLAMA_LIKE, "head_dim": HEAD_DIM}),
    Family("gemma", "GemmaConfig", "gemma", {**_LLAMA_LIKE, "head_dim": HEAD_DIM}),
    Family("gemma2", "Gemma2Config", "gemma2", {**_LLAMA_LIKE, "head_dim": HEAD_DIM, "sliding_window": 16},
           "no sdpa in the model class: eager attention"),
    Family("gemma3_text", "Gemma3TextConfig", "gemma3_text",
           {**_LLAMA_LIKE, "head_dim": HEAD_DIM, "sliding_window": 16, "layer_types": ["sliding_attention",
                                                                                       "full_attention"]}),
    Family("phi3", "Phi3Config", "phi3", dict(_LLAMA_LIKE)),
    Family("mixtral", "MixtralConfig", "mixtral",
           {**_LLAMA_LIKE, "head_dim": HEAD_DIM, "num_local_experts": 4, "num_experts_per_tok": 2}),
    Family("qwen3_moe", "Qwen3MoeConfig", "qwen3_moe",
           {**_LLAMA_LIKE, "head_dim": HEAD_DIM, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": INTERMEDIATE // 2}),
    Family("olmo2", "Olmo2Config", "olmo2", dict(_LLAMA_LIKE)),
    Family("stablelm", "StableLmConfig", "stablelm", dict(_LLAMA_LIKE)),
    Family("phi", "PhiConfig", "phi", dict(_LLAMA_LIKE)),
    Family("gpt2", "GPT2Config", "gpt2",
           {"n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "n_positions": POSITIONS}),
    Family("gpt_neox", "GPTNeoXConfig", "gpt_neox",
           {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "intermediate_size": INTERMEDIATE, "max_position_embeddings": POSITIONS}),
    Family("falcon", "FalconConfig", "falcon",
           {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "max_position_embeddings": POSITIONS}),
    Family("bloom", "BloomConfig", "bloom", {"hidden_size": HIDDEN, "n_layer": LAYERS, "n_head": HEADS},
           "no sdpa in the model class: eager attention"),
)}


def build_tiny_family(name: str, directory: str | Path, *, tokenizer_source: str | Path | None = None,
                      seed: int = 0) -> Path:
    """Save a random tiny `FAMILIES[name]` causal LM into `directory` with hwrun.testing's tokenizer
    (copied from `tokenizer_source`, a folder holding one, else built); returns the path."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from . import build_tokenizer

    family = FAMILIES[name]
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = (AutoTokenizer.from_pretrained(tokenizer_source) if tokenizer_source is not None
                 else build_tokenizer())
    tokenizer.save_pretrained(path)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = getattr(transformers, family.config_class)(
        vocab_size=len(tokenizer), tie_word_embeddings=False, **ids, **family.settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Larger-than-default weights give peaked logits, so greedy ties cannot flip between two paths.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(path, safe_serialization=True)
    return path
