# Facts: X6, X7, X8
# Run: uv run python examples/choose_attention.py [--attention sdpa]
"""Which `attn_implementation` to load a model with on this device, and why (hwattn).

X6: the default is SDPA; with torch >= 2.8, SDPA on XPU runs grouped-query attention without
repeating the key/value heads. X7: `flash_attention_2` on XPU is the hub kernel
`kernels-community/flash-attn2`. X8: FlashAttention-3/4 run only on NVIDIA GPUs.
The decisions are printed for this machine and, for comparison, for three others described by
an `hwenv.Accelerator`. Then the shipped tiny model is loaded with this machine's decision and
run once. The weights stay on the CPU in this example (it is about attention, not placement),
so it runs anywhere; hub kernels are never downloaded by it.
"""

from __future__ import annotations

import argparse

import hwattn
import hwenv

REQUESTS = ("auto", "flash_attention_2", "flash_attention_3", "flash_attention_4")
OTHER_MACHINES = {
    "XPU, torch 2.8": hwenv.Accelerator("xpu", torch_version="2.8.0"),
    "XPU, torch 2.7": hwenv.Accelerator("xpu", torch_version="2.7.0"),
    "CUDA sm 9.0 (H100/H200)": hwenv.Accelerator("cuda", capability=(9, 0)),
}


def describe(accel: hwenv.Accelerator, requested: str, model_config) -> str:
    """One line: the implementation chosen for `requested` (with GQA answer), or the error."""
    try:
        choice = hwattn.resolve_attention(accel, requested, model_config=model_config)
    except hwattn.HwattnError as error:
        return f"{type(error).__name__}: {error}"
    return f"{choice.implementation} (gqa_native={choice.gqa_native})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", default="auto", help="what to load the model with (default: auto)")
    args = parser.parse_args(argv)

    import hwrun  # only for the path of the shipped tiny model
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hwrun.DEFAULT_MODEL)
    accel = hwenv.detect()
    print(f"this machine: {accel.kind} ({accel.device})")
    for requested in REQUESTS:
        print(f"  {requested:<18} -> {describe(accel, requested, config)}")
    for label, other in OTHER_MACHINES.items():
        print(f"{label}:")
        for requested in REQUESTS:
            print(f"  {requested:<18} -> {describe(other, requested, config)}")

    choice = hwattn.resolve_attention(accel, args.attention, model_config=config)
    print(f"chosen for loading: {choice.implementation}: {choice.reason}")
    if choice.kernel_repo is not None:
        print(f"not loading: from_pretrained would download the hub kernel {choice.kernel_repo}; "
              "this example never downloads (see hub_kernels.py)")
        return 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = hwattn.load_kwargs(accel, args.attention, model_config=config)
    print(f"from_pretrained keywords: {kwargs}")
    model = AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
    inputs = tokenizer("The king said", return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    print(f"loaded with attn_implementation={model.config._attn_implementation}; "
          f"logits {tuple(logits.shape)}, finite={bool(torch.isfinite(logits).all())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
