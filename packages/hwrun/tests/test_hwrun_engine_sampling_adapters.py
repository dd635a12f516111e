"""Per-request LoRA adapters in hwrun's engine (issue 36.4, engine side): adapters loaded once with PEFT, rows of
different adapters and of the base model decode in one step (PEFT's mixed-batch `adapter_names` on the model's own
forward), each equal to PEFT's own greedy generate with that adapter; what cannot serve them (the fused step, graphs,
a compile) is refused with the reason, an unknown adapter too; the slots backend passes a request's adapter."""

from __future__ import annotations

import hwrun
import pytest
import torch
from hwrun.errors import FastDecodeError
from hwrun.inference.decode import SamplingParams
from hwrun.inference.engine import EngineCore
from hwrun.serve.backend_slots import SlotsBackend
from hwrun.serve.engine import EngineRequest
from hwrun.serve.protocol import Sampling

TEXTS = ["The king said", "Once upon a time there was a little house", "It was"]


def _fresh_model():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    model, tokenizer = hwrun.load(plan)
    return model, tokenizer


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two LoRA adapters of the shipped model with random (non-zero) weights, saved as `hwrun train` saves them."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("adapters")
    folders = []
    for i, name in enumerate(("alpha", "beta")):
        torch.manual_seed(10 + i)
        base, _ = _fresh_model()
        config = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"],
                            init_lora_weights=False)
        peft = get_peft_model(base, config)
        peft.save_pretrained(root / name)
        folders.append((name, str(root / name)))
    return folders


def _reference(peft, ids, name, n):
    with torch.no_grad():
        out = peft.generate(input_ids=torch.tensor([ids]), adapter_names=[name], max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def test_rows_of_different_adapters_decode_together_as_peft_generates_each(adapters):
    model, tokenizer = _fresh_model()
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    engine = EngineCore(model, slots=4, max_cache_len=64, adapters=adapters, prefill_chunk=5)
    assert engine.step_name == "model" and not engine.use_graphs
    asked = [("a", ids[0], "alpha"), ("b", ids[1], "beta"), ("base", ids[2], None), ("a2", ids[2], "alpha")]
    for request_id, prompt, adapter in asked:
        engine.add(request_id, prompt, max_new_tokens=6, eos_token_id=None, adapter=adapter,
                   sampling=SamplingParams(repetition_penalty=1.0))
    tokens: dict = {}
    while engine.active:
        for event in engine.step():
            tokens.setdefault(event.request_id, []).append(event.token_id)
    peft = engine.adapters.model
    for request_id, prompt, adapter in asked:
        assert tokens[request_id] == _reference(peft, prompt, adapter or "__base__", 6), request_id
    assert tokens["a"] != _reference(peft, ids[0], "__base__", 6)  # the adapter changes the answer


def test_what_cannot_serve_adapters_is_refused_with_the_reason(adapters):
    model, tokenizer = _fresh_model()
    for kwargs, named in ((dict(step="fused"), "step='fused'"), (dict(use_graphs=True), "use_graphs=True"),
                          (dict(compile_backend="inductor"), "compile_backend='inductor'")):
        with pytest.raises(FastDecodeError, match=named) as caught:
            EngineCore(model, slots=2, max_cache_len=32, adapters=adapters, **kwargs)
        assert "mixed-batch" in str(caught.value)
    engine = EngineCore(model, slots=2, max_cache_len=32, adapters=adapters[:1])
    with pytest.raises(FastDecodeError, match="adapter='beta' is not loaded"):
        engine.add("x", [1, 2], max_new_tokens=2, adapter="beta")
    plain = EngineCore(_fresh_model()[0], slots=2, max_cache_len=32)
    with pytest.raises(FastDecodeError, match="loaded no LoRA adapters"):
        plain.add("x", [1, 2], max_new_tokens=2, adapter="alpha")
    backend = SlotsBackend(engine, sampling_class=SamplingParams)
    assert set(backend.refuses) == {"structured"}  # built without a tokenizer: no grammars
    assert SlotsBackend(engine, sampling_class=SamplingParams, tokenizer=tokenizer).refuses == {}
    assert "is not loaded here" in backend.refusal(EngineRequest("r", (1,), 2, Sampling(), adapter="beta"))
    assert "--lora" in SlotsBackend(plain, sampling_class=SamplingParams).refusal(
        EngineRequest("r", (1,), 2, Sampling(), adapter="alpha"))
    backend.add(EngineRequest("r", tuple(tokenizer("It was")["input_ids"]), 3, Sampling(temperature=0.0),
                              adapter="alpha"))
    events = []
    while engine.active:
        events += backend.step()
    tokens = [t for e in events for t in e.token_ids]
    assert tokens == _reference(engine.adapters.model, tokenizer("It was")["input_ids"], "alpha", 3)
