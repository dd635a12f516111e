"""Any family through graph decode: the static graph decoder runs the model's own forward over a StaticCache
where the fused Llama-family step does not apply, and its greedy tokens equal `model.generate`'s; generate()
picks the graph decoders for those families instead of refusing: the static one for a static batch, the slot
decoder's model step for continuous batching (tests/test_hwrun_decode_slots_families.py has the rest)."""

from __future__ import annotations

import hwrun
import pytest
import torch
from hwrun.errors import GenerateError
from hwrun.inference.decode.fused_step import fused_step_support
from hwrun.inference.decode.static import GraphDecoder
from hwrun.testing.families import build_tiny_family

FAMILIES = ("gpt2", "qwen3", "phi3", "gpt_neox", "mistral")
PROMPTS = ["The king said", "Once upon a time there was a little house", "It was"]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    first = build_tiny_family(FAMILIES[0], root / FAMILIES[0])
    dirs = {FAMILIES[0]: first}
    for name in FAMILIES[1:]:
        dirs[name] = build_tiny_family(name, root / name, tokenizer_source=first)
    dirs["gemma3_text"] = build_tiny_family("gemma3_text", root / "gemma3_text", tokenizer_source=first)
    return dirs


def _until_eos(row, eos):
    return row[: row.index(eos) + 1] if eos in row else row


def _reference(model, ids, n, eos):
    """Greedy `model.generate` per prompt (unpadded), cut after the first EOS."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return [_until_eos(row, eos) for row in out[:, ids.shape[1]:].tolist()]


@pytest.mark.parametrize("family", FAMILIES)
def test_static_graph_decoder_runs_the_models_own_forward(family_dirs, family):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(family_dirs[family], local_files_only=True).eval()
    eos = model.generation_config.eos_token_id
    ids = torch.randint(3, 300, (3, 7), generator=torch.Generator().manual_seed(4))
    decoder = GraphDecoder(model, batch_size=3, max_cache_len=48)  # step="auto"
    assert (decoder.fused is None) == (fused_step_support(model) is not None)
    out = [_until_eos(row, eos) for row in decoder.generate(ids, 16, eos_token_id=None).tolist()]
    assert out == _reference(model, ids, 16, eos)


@pytest.mark.parametrize("family", ["gpt2", "qwen3", "phi3"])
def test_generate_graph_decode_on_other_families(family_dirs, family):
    plan = hwrun.plan(str(family_dirs[family]), device="cpu")
    model, tokenizer = hwrun.load(plan)
    result = hwrun.generate(plan, PROMPTS, 12, decode="graphs", batching="static", model=model, tokenizer=tokenizer)
    assert result.decode == "graphs" and result.batching == "static"
    assert "the model's own forward over a StaticCache" in result.decode_reason
    expected = [_reference(model, tokenizer(p, return_tensors="pt")["input_ids"], 12, tokenizer.eos_token_id)[0]
                for p in PROMPTS]
    assert result.token_ids == expected
    # several prompts with batching auto (continuous here) or continuous: the slot decoder's model step runs them
    for batching in ("auto", "continuous"):
        both = hwrun.generate(plan, PROMPTS, 12, decode="graphs", batching=batching, model=model, tokenizer=tokenizer)
        assert both.decode == "graphs" and both.batching == "continuous"
        assert "step: the model's own forward over a per-row slot cache" in both.decode_reason
        assert both.token_ids == expected


def test_the_llama_family_keeps_the_fused_step():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    result = hwrun.generate(plan, PROMPTS[0], 6, decode="graphs", model=model, tokenizer=tokenizer)
    assert "step: the fused Llama-family step" in result.decode_reason


def test_a_window_shorter_than_the_cache_is_refused_or_falls_back(family_dirs):
    plan = hwrun.plan(str(family_dirs["gemma3_text"]), device="cpu")
    model, tokenizer = hwrun.load(plan)
    with pytest.raises(GenerateError, match="sliding-window attention \\(window 16\\) shorter than max_cache_len=256"):
        hwrun.generate(plan, PROMPTS[0], 4, decode="graphs", model=model, tokenizer=tokenizer)
    mistral = hwrun.plan(str(family_dirs["mistral"]), device="cpu")  # window 4096 covers the cache: allowed
    model, tokenizer = hwrun.load(mistral)
    assert hwrun.generate(mistral, PROMPTS[0], 4, decode="graphs", model=model, tokenizer=tokenizer).decode == "graphs"
