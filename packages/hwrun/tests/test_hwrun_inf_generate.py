"""generate(): greedy tokens agree across attention (sdpa/eager), batching (static/continuous) and the
graph-decode step loop; bad inputs fail before loading; results carry counts, timing and reasons."""

from __future__ import annotations

import dataclasses

import hwrun
import pytest
from hwrun.errors import GenerateError

PROMPTS = ["The king said", "Once upon a time there was a little house", "It was"]


@pytest.fixture(scope="module")
def tiny():
    """The model shipped inside hwrun (the default of `hwrun generate`)."""
    return hwrun.DEFAULT_MODEL


@pytest.fixture(scope="module")
def loaded(tiny):
    plan = hwrun.plan(tiny, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return plan, model, tokenizer


def _reference(model, tokenizer, prompt, n):
    """Plain Transformers greedy decoding of one unpadded prompt."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    row = out[0, ids.shape[1]:].tolist()
    eos = tokenizer.eos_token_id
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.mark.facts("X10")
def test_one_prompt_result(loaded):
    plan, model, tokenizer = loaded
    assert plan.model == hwrun.DEFAULT_MODEL and plan.reasons["model"].startswith("the tiny model")
    result = hwrun.generate(plan, "The king said", 8, model=model, tokenizer=tokenizer)
    assert result.batching == "static" and "one prompt" in result.batching_reason
    assert result.token_ids[0] == _reference(model, tokenizer, "The king said", 8)
    assert result.new_tokens == [len(result.token_ids[0])] and 0 < result.new_tokens[0] <= 8
    assert result.text == tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
    assert result.seconds > 0 and result.tokens_per_second == pytest.approx(result.total_new_tokens / result.seconds)


@pytest.mark.facts("X6")
def test_sdpa_and_eager_give_the_same_greedy_tokens(tiny):
    outputs = {}
    for attention in ("sdpa", "eager"):
        plan = hwrun.plan(tiny, device="cpu", attention=attention)
        assert plan.attention.implementation == attention
        model, tokenizer = hwrun.load(plan)
        assert model.config._attn_implementation == attention
        outputs[attention] = hwrun.generate(plan, PROMPTS, 12, batching="static", model=model,
                                            tokenizer=tokenizer).token_ids
    assert outputs["sdpa"] == outputs["eager"]


@pytest.mark.facts("X11")
def test_continuous_and_static_batching_agree(loaded):
    plan, model, tokenizer = loaded
    static = hwrun.generate(plan, PROMPTS, 12, batching="static", model=model, tokenizer=tokenizer)
    auto = hwrun.generate(plan, PROMPTS, 12, model=model, tokenizer=tokenizer)
    assert static.batching == "static"
    assert auto.batching == "continuous" and "3 prompts" in auto.batching_reason
    assert auto.token_ids == static.token_ids
    assert static.token_ids == [_reference(model, tokenizer, p, 12) for p in PROMPTS]
    assert static.prompt_tokens == auto.prompt_tokens == [len(tokenizer(p)["input_ids"]) for p in PROMPTS]


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_graph_decode_step_loop_equals_model_generate(loaded, caplog, batching):
    plan, model, tokenizer = loaded
    result = hwrun.generate(plan, PROMPTS, 12, decode="graphs", batching=batching, model=model, tokenizer=tokenizer)
    assert result.decode == "graphs" and result.batching == batching
    assert result.token_ids == [_reference(model, tokenizer, p, 12) for p in PROMPTS]
    assert any("runs eagerly" in r.message for r in caplog.records)


def test_graph_decode_with_many_prompts_is_continuous_over_slots(loaded):
    plan, model, tokenizer = loaded
    result = hwrun.generate(plan, PROMPTS, 12, decode="graphs", model=model, tokenizer=tokenizer)
    assert result.batching == "continuous" and "hwrun's engine" in result.decode_reason


def test_graph_decoder_direct_and_reused(loaded):
    import torch
    from hwrun.errors import FastDecodeError
    from hwrun.inference.decode.static import GraphDecoder

    _, model, tokenizer = loaded
    decoder = GraphDecoder(model, batch_size=1, max_cache_len=40)
    for prompt in PROMPTS:  # one decoder, several prompt lengths
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = decoder.generate(ids, 20, eos_token_id=None)
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        assert out[0].tolist() == ref[0, ids.shape[1]:].tolist()
    with pytest.raises(FastDecodeError, match="exceeds max_cache_len"):
        decoder.generate(ids, 40)
    with pytest.raises(FastDecodeError, match="CUDA"):
        GraphDecoder(model, max_cache_len=8, use_graphs=True)


def test_streaming_prints_the_continuation(loaded, capsys):
    plan, model, tokenizer = loaded
    result = hwrun.generate(plan, "The king said", 6, stream=True, model=model, tokenizer=tokenizer)
    assert result.batching == "static"
    printed = capsys.readouterr().out
    assert printed.strip() and printed.strip() in result.text.strip() + "\n"


def test_sampling_with_seed_is_reproducible(loaded):
    plan, model, tokenizer = loaded
    kwargs = dict(do_sample=True, temperature=0.9, top_p=0.95, seed=3, model=model, tokenizer=tokenizer)
    first = hwrun.generate(plan, "The king said", 8, **kwargs)
    again = hwrun.generate(plan, "The king said", 8, **kwargs)
    assert first.token_ids == again.token_ids and first.decode == "generate"


@pytest.mark.parametrize("prompts, n, match", [
    ("The king", 0, "max_new_tokens=0"),
    ("The king", -3, "max_new_tokens=-3"),
    ("The king", 2.5, "max_new_tokens=2.5"),
    ([], 5, "empty"),
    ([""], 5, "empty"),
    (["ok", "   "], 5, "prompts\\[1\\]"),
    ([3], 5, "not a string"),
])
def test_bad_generate_inputs_fail_before_loading(prompts, n, match):
    # plan=None would load the default model: raising first proves the check runs before anything loads.
    with pytest.raises(GenerateError, match=match) as info:
        hwrun.generate(None, prompts, n)
    assert isinstance(info.value, ValueError)


def test_bad_modes_are_rejected(loaded):
    plan, model, tokenizer = loaded
    with pytest.raises(GenerateError, match="batching='fast'"):
        hwrun.generate(plan, "hi", 2, batching="fast", model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match="decode="):
        hwrun.generate(plan, "hi", 2, decode="turbo", model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match="decode='graphs' cannot run: bitsandbytes weights"):
        hwrun.generate(dataclasses.replace(plan, quantization="4bit"), "hi", 2, decode="graphs", do_sample=True,
                       model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match="streams one prompt"):
        hwrun.generate(plan, ["a", "b"], 2, stream=True, batching="static", model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match="streaming"):
        hwrun.generate(plan, ["a", "b"], 2, stream=True, batching="continuous", model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match=r"prompts\[1\] holds a lone surrogate \(U\+D800 at position 5\)"):
        hwrun.generate(plan, ["fine", "half \ud800 a pair"], 2, model=model, tokenizer=tokenizer)
    with pytest.raises(GenerateError, match="both model"):
        hwrun.generate(plan, "hi", 2, model=model)
    with pytest.raises(GenerateError, match="temperature"):
        hwrun.generate(plan, "hi", 2, do_sample=True, temperature=0, model=model, tokenizer=tokenizer)


@pytest.mark.facts("G9")
def test_batching_choice_on_other_devices(fake_gaudi, tiny):
    fake_gaudi(8)
    plan = hwrun.plan(tiny)
    choice = hwrun.choose_batching(plan, 8)
    assert choice.mode == "static" and "hpu" in choice.reason
    with pytest.raises(GenerateError, match="cannot run here"):
        hwrun.choose_batching(plan, 8, "continuous")


def test_pipeline_places_the_model_by_the_plan(loaded):
    plan, _, _ = loaded
    pipe = hwrun.pipeline("text-generation", plan)
    assert pipe.model.device.type == "cpu" and str(pipe.model.dtype) == "torch.float32"
    out = pipe("The king said", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("The king said")
    with pytest.raises(hwrun.PlanError, match="device"):
        hwrun.pipeline("text-generation", plan, device="cpu")


def test_continuous_failure_inside_the_model_falls_back_to_static_on_auto_only(loaded, monkeypatch):
    """generate_batch can fail in a model's own code (transformers 5.25's GPT-NeoX): `auto` runs one
    static batch and says why; an explicit `continuous` raises."""
    import importlib

    from hwrun.errors import ContinuousBatchingError

    plan, model, tokenizer = loaded
    generate_module = importlib.import_module("hwrun.inference.generate")

    static = hwrun.generate(plan, PROMPTS, max_new_tokens=4, batching="static", model=model, tokenizer=tokenizer)
    monkeypatch.setattr(generate_module, "_continuous",
                        lambda *a, **k: (_ for _ in ()).throw(ContinuousBatchingError(
                            "continuous batching failed for 3 prompt(s): boom; use batching='static'.")))
    result = hwrun.generate(plan, PROMPTS, max_new_tokens=4, model=model, tokenizer=tokenizer)
    assert result.batching == "static" and result.token_ids == static.token_ids
    assert result.batching_reason == ("3 prompts, but Transformers' continuous batching failed for 3 prompt(s): "
                                      "boom: one left-padded batch")
    assert result.decode_reason.startswith("model.generate ")
    with pytest.raises(ContinuousBatchingError, match="boom"):
        hwrun.generate(plan, PROMPTS, max_new_tokens=4, batching="continuous", model=model, tokenizer=tokenizer)


# ---- bounds before any work (issue 27 point 5) ---------------------------------------------------

def _no_load(monkeypatch):
    """Make loading fail loudly: an error raised first proves the check ran before anything loaded."""
    import importlib

    load_module = importlib.import_module("hwrun.model.load")
    monkeypatch.setattr(load_module, "load", lambda *a, **k: pytest.fail("the model was loaded"))


@pytest.mark.parametrize("values, match", [
    (dict(temperature=-1.0), "temperature=-1.0 must be a number >= 0"),
    (dict(top_p=0.0), "top_p=0.0 must be in \\(0, 1\\]"),
    (dict(top_p=1.5, do_sample=True), "top_p=1.5"),
    (dict(top_k=-1), "top_k=-1 must be an integer >= 0"),
    (dict(top_k=3.5, do_sample=True), "top_k=3.5"),
    (dict(seed="42"), "seed='42' must be an integer or None"),
    (dict(seed=1.5, do_sample=True), "seed=1.5"),
    (dict(do_sample="yes"), "do_sample='yes' must be True or False"),
])
def test_invalid_sampling_values_fail_before_loading(tiny, values, match, monkeypatch):
    _no_load(monkeypatch)
    plan = hwrun.plan(tiny, device="cpu")
    with pytest.raises(GenerateError, match=match):
        hwrun.generate(plan, "The king", 4, **values)


def test_max_new_tokens_has_a_ceiling_the_user_can_set(tiny, loaded, monkeypatch):
    plan, model, tokenizer = loaded
    _no_load(monkeypatch)
    monkeypatch.delenv("HWRUN_MAX_NEW_TOKENS_LIMIT", raising=False)
    with pytest.raises(GenerateError, match="max_new_tokens=100000000 exceeds the limit of 32768 new tokens per "
                                            "prompt; pass max_new_tokens_limit= \\(or set HWRUN_MAX_NEW_TOKENS_LIMIT"):
        hwrun.generate(plan, "The king", 100_000_000)
    with pytest.raises(GenerateError, match="max_new_tokens=9 exceeds the limit of 8"):
        hwrun.generate(plan, "The king", 9, max_new_tokens_limit=8)
    monkeypatch.setenv("HWRUN_MAX_NEW_TOKENS_LIMIT", "5")
    with pytest.raises(GenerateError, match="max_new_tokens=6 exceeds the limit of 5"):
        hwrun.generate(plan, "The king", 6)
    assert hwrun.generate(plan, "The king", 5, model=model, tokenizer=tokenizer).new_tokens[0] <= 5
    assert hwrun.generate(plan, "The king", 6, max_new_tokens_limit=6, model=model, tokenizer=tokenizer)  # arg wins
    monkeypatch.setenv("HWRUN_MAX_NEW_TOKENS_LIMIT", "lots")
    with pytest.raises(GenerateError, match="HWRUN_MAX_NEW_TOKENS_LIMIT='lots' is not an integer"):
        hwrun.generate(plan, "The king", 6)
    with pytest.raises(GenerateError, match="max_new_tokens_limit=0 must be a positive integer"):
        hwrun.generate(plan, "The king", 6, max_new_tokens_limit=0)


def test_generation_must_fit_the_models_context(tiny, loaded, monkeypatch):
    plan, model, tokenizer = loaded
    assert model.config.max_position_embeddings == 512
    monkeypatch.delenv("HWRUN_MAX_NEW_TOKENS_LIMIT", raising=False)
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1))
    with pytest.raises(GenerateError, match="does not fit the model's context of 512 positions .* at most 511"):
        _no_load(monkeypatch)
        hwrun.generate(plan, "The king", 600)  # from config.json, before loading
    long_prompt = " ".join(["king"] * 600)
    with pytest.raises(GenerateError, match="prompt 1 has \\d+ tokens, more than the model's context of 512"):
        hwrun.generate(plan, ["The king", long_prompt], 4, model=model, tokenizer=tokenizer)
    length = len(tokenizer("The king said")["input_ids"])
    with pytest.raises(GenerateError, match=f"prompt 0: {length} tokens \\+ max_new_tokens 510 = {length + 510} "
                                            f"exceeds the model's context of 512 .* max_new_tokens <= {512 - length}"):
        hwrun.generate(plan, "The king said", 510, model=model, tokenizer=tokenizer)
    assert calls == []  # nothing generated


def test_context_length_reads_configs_and_dicts():
    from hwrun.inference.limits import context_length
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    assert context_length({"max_position_embeddings": 4096}) == 4096
    assert context_length({"n_positions": 1024}) == 1024  # GPT-2's spelling
    assert context_length({"text_config": {"max_position_embeddings": 8192}, "max_position_embeddings": 5}) == 8192
    assert context_length({"model_type": "bloom"}) is None and context_length(None) is None
    assert context_length(GPT2Config(n_positions=300)) == 300
    assert context_length(LlamaConfig(max_position_embeddings=77)) == 77
    assert context_length(BloomConfig()) is None  # ALiBi: no position limit to check
