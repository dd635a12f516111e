# Facts: X11
# Run: uv run python examples/continuous_batching.py [--max-new-tokens 16] [--plan-only]
"""Many prompts at once with Transformers' continuous batching, chosen by hwrun, and checked against a static batch.

X11: continuous batching supports XPU graphs and asynchronous batching on Intel GPUs and decides by
itself whether to use them. hwrun picks continuous batching for several prompts where it runs
(cuda, xpu, cpu), says why, sizes the paged cache from the workload, and on XPU leaves
`use_cuda_graph` / `use_async_batching` unset so Transformers decides (printed below as None); on
CUDA it turns both on (measured faster on an H200), on this CPU machine both are off (eager). Greedy output must equal one static `model.generate` batch.
`--plan-only` prints the decisions without loading (e.g. under a simulated XPU or Gaudi).
"""

from __future__ import annotations

import argparse

import hwrun

PROMPTS = ["The king said", "Once upon a time", "Alice was beginning", "And the LORD spake"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--plan-only", action="store_true", help="print the decisions and stop (nothing loads)")
    args = parser.parse_args(argv)

    plan = hwrun.plan()
    choice = hwrun.choose_batching(plan, len(PROMPTS))
    print(f"device {plan.device}: batching={choice.mode}: {choice.reason}")
    if choice.mode == "continuous":
        from hwrun.inference.batching import continuous_config

        # Only the graph / async fields are shown; prompt lengths matter just for the CPU cache size.
        config = continuous_config(plan, [8] * len(PROMPTS), args.max_new_tokens)
        who = ("None: Transformers decides (X11)" if config.use_cuda_graph is None
               else f"set by hwrun: graphs over a workload-sized paged cache on {plan.accelerator.kind}"
               if config.use_cuda_graph else f"set by hwrun: no accelerator graphs on {plan.accelerator.kind}")
        print(f"ContinuousBatchingConfig: use_cuda_graph={config.use_cuda_graph} "
              f"use_async_batching={config.use_async_batching} ({who})")
    if args.plan_only:
        return 0

    model, tokenizer = hwrun.load(plan)
    continuous = hwrun.generate(plan, PROMPTS, max_new_tokens=args.max_new_tokens, model=model, tokenizer=tokenizer)
    static = hwrun.generate(plan, PROMPTS, max_new_tokens=args.max_new_tokens, batching="static",
                            model=model, tokenizer=tokenizer)
    for prompt, text in zip(PROMPTS, continuous.texts, strict=True):
        print(f"{prompt!r} -> {text!r}")
    print(f"{continuous.batching}: {continuous.total_new_tokens} tokens, {continuous.tokens_per_second:.1f} tokens/s; "
          f"{static.batching}: {static.total_new_tokens} tokens, {static.tokens_per_second:.1f} tokens/s")
    same = continuous.token_ids == static.token_ids
    print(f"continuous == static: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
