"""Tensor parallelism on CPU with gloo at world size 2 (issue 37.3): `tp=2` greedy tokens through hwrun's engine on
every rank (`generate()`'s default on a tensor-parallel plan) equal `tp=1` for five families (Llama, Qwen2 and Mistral
with grouped-query attention, Qwen3-MoE and Mixtral with experts), sampling equal on both ranks (seeded, and unseeded
with rank 0's seed), a rank called with other arguments refused on every rank, and `hwrun generate --tp 2` starting
its own ranks and printing once. Tiny random models saved as safetensors in a temporary folder; every process bounded
by a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import hwrun
import pytest
from hwrun.testing import launch_cpu_workers
from hwrun.testing.families import build_tiny_family

pytestmark = pytest.mark.slow

FAMILIES = ("llama", "qwen2", "mistral", "qwen3_moe", "mixtral")
PROMPTS = ["The king said", "Once upon a time there was"]
NEW_TOKENS = 10

WORKER = textwrap.dedent('''
    import json, sys
    import hwrun
    from hwrun.errors import RankDivergenceError
    from hwrun.parallel.ranks import finish, rank

    out, prompts, models = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
    result = {}
    for path in models:
        plan = hwrun.plan(path, device="cpu", tp=2)
        model, tokenizer = hwrun.load(plan)
        options = dict(model=model, tokenizer=tokenizer)  # the default: hwrun's engine on every rank
        greedy = hwrun.generate(plan, prompts, NEW_TOKENS, **options)  # compares the ranks' tokens itself
        sampled = hwrun.generate(plan, prompts[:1], NEW_TOKENS, do_sample=True, seed=7, **options)
        result[path] = {"greedy": greedy.token_ids, "sampled": sampled.token_ids,
                        "runs": [[r.decode, r.batching, r.decode_reason] for r in (greedy, sampled)],
                        "weight": tuple(model.model.layers[0].self_attn.q_proj.weight.to_local().shape)}
        if path == models[0] and len(prompts) > 1:
            unseeded = hwrun.generate(plan, prompts[:1] * 2, NEW_TOKENS, do_sample=True, **options)  # rank 0's draw
            result["unseeded"] = unseeded.token_ids
            try:  # a rank whose call differs from rank 0's: refused on every rank before a forward
                hwrun.generate(plan, prompts[rank()], NEW_TOKENS, **options)
            except RankDivergenceError as error:
                result["refused"] = str(error)
    with open(f"{out}/rank{rank()}.json", "w") as handle:
        json.dump(result, handle)
    finish()
''').replace("NEW_TOKENS", str(NEW_TOKENS))


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-families")
    first = build_tiny_family(FAMILIES[0], root / FAMILIES[0])
    paths = {FAMILIES[0]: first}
    for name in FAMILIES[1:]:
        paths[name] = build_tiny_family(name, root / name, tokenizer_source=first)
    return paths


def test_tp2_greedy_equals_tp1_for_five_families(families, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = launch_cpu_workers(script, str(tmp_path), json.dumps(PROMPTS), *map(str, families.values()), timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    unseeded = ranks[0]["unseeded"]  # the same on both ranks; each of the two equal prompts samples on its own
    assert unseeded == ranks[1]["unseeded"] and len(unseeded[0]) > 0 and unseeded[0] != unseeded[1]
    for rank in ranks:
        assert "rank 1 called generate() with prompts=['Once upon a time there was']" in rank["refused"]
    for name, path in families.items():
        plan = hwrun.plan(str(path), device="cpu")
        alone = hwrun.generate(plan, PROMPTS, NEW_TOKENS, batching="static", decode="generate")
        got = [rank[str(path)] for rank in ranks]
        assert got[0]["greedy"] == got[1]["greedy"] == alone.token_ids, name
        assert got[0]["sampled"] == got[1]["sampled"] and len(got[0]["sampled"][0]) > 0, name
        for decode, batching, reason in got[0]["runs"]:  # hwrun's engine ran, on the model's own forward
            assert (decode, batching) == ("graphs", "continuous"), (name, reason)
            assert "every rank runs hwrun's engine (EngineCore.generate)" in reason and "eager steps" in reason, name
            assert "step: the model's own forward over a per-row slot cache (step='model' given)" in reason, name
        assert got[0]["weight"] == [16, 32], name  # each rank holds 2 of the 4 query heads (head dim 8) of width 32


def test_cli_generate_tp2_starts_its_ranks_and_prints_once(families):
    path = str(families["qwen2"])
    env = dict(os.environ, HWENV_DEVICE="cpu")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "hwrun.cli", "generate", "--model", path, "--tp", "2", "--json",
                           "--max-new-tokens", str(NEW_TOKENS), PROMPTS[0]],
                          env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout)  # one JSON document: rank 0 alone prints
    alone = hwrun.generate(hwrun.plan(path, device="cpu"), PROMPTS[0], NEW_TOKENS, batching="static",
                           decode="generate")
    assert printed["token_ids"] == alone.token_ids
    assert (printed["decode"], printed["batching"]) == ("graphs", "continuous")  # hwrun's engine on every rank
    assert printed["decode_reason"].startswith("tensor parallel (tp=2): every rank runs hwrun's engine")
    assert "tp=2 x cpu" in done.stderr and "decode: graphs]" in done.stderr


def test_tp4_greedy_equals_tp1(tmp_path):
    """World size 4 on the 2-core machine (small: one family, 4 KV heads so that 4 divides them)."""
    import transformers
    from hwrun.testing import build_tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tokenizer()
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=128, tie_word_embeddings=False, **ids)
    import torch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(**ids)
    path = tmp_path / "llama4"
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace('tp=2', 'tp=4'))
    done = launch_cpu_workers(script, str(tmp_path), json.dumps(PROMPTS[:1]), str(path), nproc=4, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())[str(path)] for r in range(4)]
    alone = hwrun.generate(hwrun.plan(str(path), device="cpu"), PROMPTS[:1], NEW_TOKENS, batching="static",
                           decode="generate")
    assert all(rank["greedy"] == alone.token_ids for rank in ranks)
    assert all(run[:2] == ["graphs", "continuous"] for rank in ranks for run in rank["runs"])  # hwrun's engine
    assert ranks[0]["weight"] == [8, 32]  # one of the 4 query heads (head dim 8) per rank
