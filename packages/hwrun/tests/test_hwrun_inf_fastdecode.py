"""hwrun's own decode loops on CPU (where they run eagerly): the fused Llama step, the static graph
decoder and the slot-based continuous decoder give exactly `model.generate`'s greedy tokens; what
they cannot run is refused with the reason; compile options and the continuous-batching config."""

from __future__ import annotations

import re

import hwrun
import pytest
import torch
from hwrun.errors import FastDecodeError
from hwrun.inference.decode.fused_step import FusedLlamaStep, fused_step_support
from hwrun.inference.decode.static import GraphDecoder
from hwrun.inference.engine import EngineCore
from hwrun.inference.engine.graphs import compile_step

PROMPTS = ["The king said", "Once upon a time there was a little house", "It was", "The queen",
           "By the river the people of the town walked", "A"]


@pytest.fixture(scope="module")
def loaded():
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    return hwrun.load(plan)


def _reference(model, ids, n):
    """Plain greedy `generate` of one unpadded prompt, exactly n tokens (no EOS stop)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def _random_model(model_type, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=96, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)  # peaked logits: greedy ties cannot flip between kernels
    return model


@pytest.fixture(scope="module")
def qwen2():
    """Qwen2: q/k/v projections with biases (fused into one bias), GQA 4/2."""
    return _random_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def test_fused_step_applies_to_llama_family_only(loaded, qwen2):
    model, _ = loaded
    assert fused_step_support(model) is None and fused_step_support(qwen2) is None
    gpt2 = _random_model("gpt2", n_embd=32, n_layer=1, n_head=2, n_positions=64)
    assert "gpt2" in fused_step_support(gpt2)
    with pytest.raises(FastDecodeError, match="step='fused' cannot run GPT2LMHeadModel: model_type 'gpt2'"):
        GraphDecoder(gpt2, max_cache_len=32, step="fused")
    with pytest.raises(FastDecodeError, match="step='fused' cannot run GPT2LMHeadModel: model_type 'gpt2'"):
        EngineCore(gpt2, slots=2, max_cache_len=32, step="fused")
    assert EngineCore(gpt2, slots=2, max_cache_len=32).step_name == "model"  # issue 26 point 3
    with pytest.raises(FastDecodeError, match="step='quick' is not a decode step"):
        GraphDecoder(model, max_cache_len=32, step="quick")


@pytest.mark.parametrize("step", ["fused", "model"])
def test_graph_decoder_batch_equals_generate(qwen2, step):
    ids = torch.randint(1, 96, (3, 7), generator=torch.Generator().manual_seed(3))
    decoder = GraphDecoder(qwen2, batch_size=3, max_cache_len=40, step=step)
    assert (decoder.fused is not None) == (step == "fused") and decoder.step_reason.startswith(step)
    out = decoder.generate(ids, 20, eos_token_id=None)
    with torch.no_grad():
        ref = qwen2.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                             do_sample=False, pad_token_id=0)
    assert out.tolist() == ref[:, 7:].tolist()


def test_fused_step_shares_the_models_weights_and_keeps_their_values(qwen2):
    before = {k: v.clone() for k, v in qwen2.state_dict().items()}
    step = FusedLlamaStep(qwen2, batch_size=1, max_cache_len=16)
    layer = qwen2.model.layers[0].self_attn
    assert step.layers[0]["qkv"].shape[0] == layer.q_proj.out_features + 2 * layer.k_proj.out_features
    assert step.layers[0]["qkv_bias"] is not None
    assert step.extra_bytes == 0
    assert step.fused_bytes == sum(4 * (w["qkv"].numel() + w["gate_up"].numel()) for w in step.layers)
    assert list(qwen2.state_dict()) == list(before)
    assert all(torch.equal(before[k], v) for k, v in qwen2.state_dict().items())


def test_slot_decoder_refills_slots_and_matches_generate_per_prompt(loaded):
    model, tokenizer = loaded
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    budgets = [12, 5, 20, 1, 9, 15]
    # 2 slots for 6 requests, prefill groups of at most 16 padded tokens: requests start while others run
    decoder = EngineCore(model, slots=2, max_cache_len=64, check_every=4, prefill_tokens=16)
    out = decoder.generate(ids, budgets, eos_token_id=None)
    assert out == [_reference(model, i, b) for i, b in zip(ids, budgets, strict=True)]
    assert decoder.prefills >= 4  # slots were refilled, not one big batch
    assert decoder.steps < sum(budgets)  # steps ran several requests at once


def test_slot_decoder_stops_each_request_at_its_eos(loaded):
    model, tokenizer = loaded
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    free = [_reference(model, i, 10) for i in ids]
    eos = free[0][3]  # a token the first request produces 4th: it must stop there, with it
    out = EngineCore(model, slots=3, max_cache_len=64).generate(ids, 10, eos_token_id=eos)
    for row, full in zip(out, free, strict=True):
        expected = full[: full.index(eos) + 1] if eos in full else full
        assert row == expected
    assert len(out[0]) == 4


def test_slot_decoder_bad_inputs(loaded):
    model, _ = loaded
    decoder = EngineCore(model, slots=2, max_cache_len=16)
    with pytest.raises(FastDecodeError, match="empty"):
        decoder.generate([], 4)
    with pytest.raises(FastDecodeError, match="prompts\\[1\\] is empty"):
        decoder.generate([[1, 2], []], 4)
    with pytest.raises(FastDecodeError, match="prompt 0: length 10 \\+ max_new_tokens 7 exceeds max_cache_len=16"):
        decoder.generate([[5] * 10], 7)
    with pytest.raises(FastDecodeError, match="max_new_tokens=0"):
        decoder.generate([[5]], 0)
    with pytest.raises(FastDecodeError, match="2 max_new_tokens for 1 prompts"):
        decoder.generate([[5]], [1, 2])
    with pytest.raises(FastDecodeError, match="slots=0|batch_size=0"):
        EngineCore(model, slots=0, max_cache_len=16)
    with pytest.raises(FastDecodeError, match="CUDA"):
        EngineCore(model, slots=1, max_cache_len=16, use_graphs=True)


def test_compile_step_tunes_only_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)

    def step():
        return None

    assert compile_step(step, None, None, True) is step and not calls
    compile_step(step, "inductor", None)
    compile_step(step, "inductor", None, True)
    compile_step(step, "inductor", "reduce-overhead", True)  # a mode excludes options
    assert [c["options"] for c in calls] == [None, {"coordinate_descent_tuning": True}, None]
    assert all(c["dynamic"] is False for c in calls) and calls[2]["mode"] == "reduce-overhead"


@pytest.mark.parametrize("kind", ["cuda", "xpu", "cpu"])
def test_continuous_config_is_sized_from_the_workload(kind):
    from hwrun.inference.batching import ACCELERATOR_PAGE_SIZE, HOST_PAGE_SIZE, workload_cb_config

    config = workload_cb_config(kind, [100, 30, 250], 50)
    accelerator = kind != "cpu"
    page = ACCELERATOR_PAGE_SIZE if accelerator else HOST_PAGE_SIZE
    assert config.page_size == page
    assert config.num_blocks == -(-300 // page) * 3 + 4  # the longest request's pages for each, plus 4
    assert config.max_batch_tokens == 383
    expected = {"cuda": True, "xpu": None, "cpu": False}[kind]  # xpu: Transformers decides (X11)
    assert config.use_cuda_graph is expected and config.use_async_batching is expected


def test_compiled_slot_step_writes_the_cache_in_place(qwen2):
    """Inductor (here its CPU code) updates the K/V block pool where it is: no copy of the whole pool per step.
    The per-row write through a flattened view was functionalised into one (~1 ms/step at 64 rows, H200). (The
    step does copy the rows' blocks it attends over: the gather of paged KV, a "clone" in its kernel's name.)"""
    import torch._dynamo
    from torch._inductor.utils import run_and_get_code

    prompts = [[1, 2, 3], [4, 5], [6]]
    eager = EngineCore(qwen2, slots=3, max_cache_len=32).generate(prompts, 6, eos_token_id=None)
    torch._dynamo.reset()
    decoder = EngineCore(qwen2, slots=3, max_cache_len=32, compile_backend="inductor")
    out, codes = run_and_get_code(decoder.generate, prompts, 6, eos_token_id=None)
    torch._dynamo.reset()
    assert out == eager
    code = "\n".join(codes)
    assert "index_put" in code  # the per-row K/V write, fused into the step's kernels
    pool = tuple(decoder.kv.keys[0].shape)
    allocated = re.findall(r"empty_strided_\w+\(\(([0-9, ]+)\)", code)
    assert allocated and all(tuple(int(n) for n in shape.split(",") if n.strip()) != pool for shape in allocated), (
        "a kernel copies the whole block pool before writing it")


def test_model_step_passes_the_cache_under_the_releases_own_keyword(qwen2):
    """`cache` on transformers 5.25 (past_key_values warns there), `past_key_values` before: no warning."""
    import inspect
    import warnings

    from hwrun.inference.engine.steps import cache_keyword

    keyword = cache_keyword(qwen2)
    assert keyword in inspect.signature(type(qwen2).forward).parameters
    decoder = GraphDecoder(qwen2, batch_size=1, max_cache_len=24, step="model")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*deprecated", category=FutureWarning)
        decoder.generate(torch.tensor([[3, 5, 7]]), 4, eos_token_id=None)
