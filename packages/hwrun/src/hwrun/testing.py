"""Test helpers: a tiny random Llama (GQA) with a real byte-level BPE tokenizer, saved like a Hub model.

Used by hwrun's tests (and handy for yours): `build_tiny_model(dir)` writes config.json,
model.safetensors, tokenizer.json and generation_config.json in about a second, with no network.
"""

from __future__ import annotations

from pathlib import Path

_CORPUS = (
    "The king said to the queen that the castle was cold. The queen said the king should build a fire. "
    "Once upon a time there was a little house by the river, and the people of the town walked there. "
    "It was the best of times, it was the worst of times, it was the age of wisdom and of foolishness."
)


def build_tiny_model(directory: str | Path, *, seed: int = 0, vocab_size: int = 320, hidden_size: int = 64,
                     layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Path:
    """Save a random tiny LlamaForCausalLM and its tokenizer into `directory`; returns the path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.save_pretrained(path)
    config = LlamaConfig(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=len(tokenizer),
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Larger-than-default weights give peaked, well-separated logits, so greedy ties cannot flip.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    return path


def launch_cpu_workers(script: str | Path, *args: str, nproc: int = 2, timeout: float = 300) -> object:
    """Run `script args...` as `nproc` CPU processes (gloo) through `hwdist launch` on a free port.

    A clean environment for the children: no inherited rank variables, one OpenMP thread each,
    `HWENV_DEVICE=cpu`. Returns the finished `subprocess.CompletedProcess` (text output captured);
    no shell is involved.
    """
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", HWENV_DEVICE="cpu")
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "hwdist", "launch", "--kind", "cpu", "--nproc-per-node", str(nproc),
            "--master-port", str(port), str(script), *map(str, args)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
