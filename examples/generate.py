# Facts: X9, X10, G9
# Run: uv run python examples/generate.py [--max-new-tokens 20] [--dtype bfloat16] [--plan-only]
"""Generate text on whatever device is here: the plan first (device, dtype, device_map, each with why), then text.

X9: `device_map="xpu"` loads on one Intel GPU, `"auto"` splits a model that does not fit one XPU
across the selected XPUs; `pipeline()` with no device picks the XPU. X10: `model.generate(**inputs,
max_new_tokens=50, do_sample=False)` with the inputs moved to `model.device`, in bfloat16 on XPU.
G9: `device_map="hpu"` on Gaudi. hwrun.plan decides all of this before anything loads; the text
is then generated three ways that must agree token for token: hwrun.generate, the seed's own
`model.generate` call, and hwrun.pipeline. On this CPU machine the plan says cpu/float32 (pass
--dtype bfloat16 for the seed's precision); `--plan-only` prints the plan and stops, which is
also how to see the decisions for an XPU or Gaudi machine without its hardware.
"""

from __future__ import annotations

import argparse

import hwrun

PROMPT = "The king said"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local folder or Hub id (default: the shipped tiny model)")
    parser.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--plan-only", action="store_true", help="print the plan and stop (nothing loads)")
    args = parser.parse_args(argv)

    plan = hwrun.plan(args.model, dtype=args.dtype)
    print(plan.render())
    print(f"plan: device={plan.device} dtype={plan.dtype} device_map={plan.device_map} env={plan.env}")
    if args.plan_only:
        return 0

    model, tokenizer = hwrun.load(plan)
    print(f"loaded on {model.device} in {model.dtype}")
    ours = hwrun.generate(plan, PROMPT, max_new_tokens=args.max_new_tokens, model=model, tokenizer=tokenizer)
    print(f"hwrun.generate: {PROMPT!r} -> {ours.text!r} ({ours.batching}: {ours.batching_reason})")

    # X10, the seed's call: inputs moved to model.device, greedy.
    import torch

    inputs = tokenizer(PROMPT, return_tensors="pt").to(model.device)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    seed_ids = out[0, inputs["input_ids"].shape[1]:].tolist()
    print(f"model.generate: {PROMPT!r} -> {tokenizer.decode(seed_ids, skip_special_tokens=True)!r}")
    same = seed_ids[: len(ours.token_ids[0])] == ours.token_ids[0]
    print(f"hwrun.generate == model.generate: {same}")

    # X9 / G9: a pipeline with no device of its own; the plan placed the model.
    pipe = hwrun.pipeline("text-generation", plan=plan)
    piped = pipe(PROMPT, max_new_tokens=args.max_new_tokens, do_sample=False, return_full_text=False)
    print(f"hwrun.pipeline (device {pipe.device}): {PROMPT!r} -> {piped[0]['generated_text']!r}")
    print(f"pipeline == hwrun.generate: {piped[0]['generated_text'] == ours.text}")
    return 0 if same and piped[0]["generated_text"] == ours.text else 1


if __name__ == "__main__":
    raise SystemExit(main())
