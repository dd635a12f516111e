"""Real tiny Llama models (MHA and GQA) loaded on CPU with every implementation resolve_attention returns there."""

from __future__ import annotations

import hwattn
import pytest
import torch
from hwattn import load_kwargs, resolve_attention
from hwenv import Accelerator

CPU = Accelerator("cpu")
CONFIGS = {"gqa": 2, "mha": 4}  # num_key_value_heads with 4 query heads


def cpu_implementations() -> dict[str, str]:
    """{implementation: one request that yields it} over every name hwattn accepts, on CPU, fallback=True."""
    requests = [*hwattn.valid_names(), *hwattn.FLASH_KERNEL_REPO.values()]
    found: dict[str, str] = {}
    for request in requests:
        try:
            choice = resolve_attention(CPU, request, fallback=True)
        except hwattn.HwattnError:
            continue
        found.setdefault(choice.implementation, request)
    return found


FAST = ("eager", "sdpa")


def test_cpu_implementations_are_what_the_rules_say():
    # names hwstack's own training patches register in Transformers' attention registry ("hwattn_causal_sdpa",
    # while a patch is held in another test of this worker) are not Transformers' implementations
    found = {name for name in cpu_implementations() if not name.startswith("hwattn_")}
    assert found == {"sdpa", "eager", "flex_attention", "paged|eager"}


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, make_config):
    from transformers import LlamaForCausalLM

    paths = {}
    for name, kv_heads in CONFIGS.items():
        torch.manual_seed(0)
        model = LlamaForCausalLM(make_config(num_key_value_heads=kv_heads))
        paths[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(paths[name])
    return paths


def _inputs():
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: exercises the masked (repeat-KV) SDPA path
    return ids, mask


def _logits(path, kwargs):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, **kwargs).eval()
    assert model.config._attn_implementation == kwargs["attn_implementation"]
    ids, mask = _inputs()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        unpadded = model(input_ids=ids[1:]).logits  # no mask: the native-GQA SDPA path on CPU
    return padded, unpadded


@pytest.mark.facts("X6")
@pytest.mark.parametrize("model", list(CONFIGS))
def test_fast_implementations_give_the_same_logits(saved_models, model):
    found = cpu_implementations()
    reference = _logits(saved_models[model], load_kwargs(CPU, "eager"))
    for implementation in FAST:
        kwargs = load_kwargs(CPU, found[implementation], fallback=True)
        assert kwargs == {"attn_implementation": implementation, "use_kernels": False}
        padded, unpadded = _logits(saved_models[model], kwargs)
        assert (padded[0, 3:] - reference[0][0, 3:]).abs().max() < 1e-4
        assert (padded[1] - reference[0][1]).abs().max() < 1e-4
        assert (unpadded - reference[1]).abs().max() < 1e-4


@pytest.mark.facts("X6")
def test_flash_request_with_fallback_loads_sdpa_on_cpu(saved_models):
    kwargs = load_kwargs(CPU, "flash_attention_2", fallback=True)
    reference = _logits(saved_models["gqa"], load_kwargs(CPU, "auto"))
    fallback = _logits(saved_models["gqa"], kwargs)
    assert kwargs == {"attn_implementation": "sdpa", "use_kernels": False}
    assert torch.equal(fallback[1], reference[1])


@pytest.mark.slow
def test_flex_attention_gives_the_same_logits(saved_models):
    """flex_attention compiles its kernel on CPU first (tens of seconds)."""
    kwargs = load_kwargs(CPU, "flex_attention")
    padded, unpadded = _logits(saved_models["gqa"], kwargs)
    reference = _logits(saved_models["gqa"], load_kwargs(CPU, "eager"))
    assert (padded[0, 3:] - reference[0][0, 3:]).abs().max() < 1e-4
    assert (unpadded - reference[1]).abs().max() < 1e-4


@pytest.mark.slow
def test_paged_eager_generates_what_eager_generates(saved_models):
    """paged|eager serves continuous batching only; its greedy tokens equal eager's."""
    from transformers import GenerationConfig, LlamaForCausalLM

    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    config = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
    paged = LlamaForCausalLM.from_pretrained(saved_models["gqa"], **load_kwargs(CPU, "paged|eager")).eval()
    batched = paged.generate_batch(prompts, generation_config=config)
    eager = LlamaForCausalLM.from_pretrained(saved_models["gqa"], **load_kwargs(CPU, "eager")).eval()
    for index, prompt in enumerate(prompts):
        want = eager.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()
        assert batched[f"req_{index}"].generated_tokens == want
