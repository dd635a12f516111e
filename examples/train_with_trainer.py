# Facts: X16, X17, G12
# Run: uv run python examples/train_with_trainer.py [--max-steps 3] [--bf16] [--output DIR] [--plan-only]
"""Fine-tune with Transformers' Trainer and no device setting: TrainingArguments finds the device (hwrun.train).

X16: `print(TrainingArguments(output_dir=..., bf16=True).device)` prints `xpu:0` on one Intel GPU;
Trainer needs no device setting. X17: TrainingArguments checks bf16 with
`torch.xpu.is_bf16_supported()` — the default call, which torch answers True on *every* available
XPU (emulated bf16 counts: torch/xpu/__init__.py), so on an integrated GPU without native bf16
Transformers accepts bf16=True and runs it emulated. G12: on Gaudi the device is `hpu` and every
Gaudi supports bf16. The example prints the seed's own TrainingArguments line next to hwrun's
(which reads native bf16 with `including_emulation=False` and refuses it before anything loads),
then trains LoRA for a few steps on the shipped tiny model. On this CPU machine the device is
`cpu` and training runs in float32 (`--bf16` asks for bf16 anyway: CPUs run it, slowly);
`--plan-only` stops before the model loads, e.g. to see an XPU or Gaudi machine's decisions.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import hwrun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--bf16", action="store_true", help="ask for bf16 whatever the plan says (X17)")
    parser.add_argument("--output", default=None, help="output folder (default: a new temporary folder)")
    parser.add_argument("--plan-only", action="store_true", help="print the decisions and stop (nothing loads)")
    args = parser.parse_args(argv)

    from hwrun.training import TrainingConfigError, train_plan
    from transformers import TrainingArguments

    output = args.output or tempfile.mkdtemp(prefix="hwstack-train-")
    plan = train_plan()
    bf16 = True if args.bf16 else plan.dtype == "bfloat16"
    print(f"plan: {plan.accelerator.name} ({plan.device}), bf16 supported={plan.accelerator.bf16}, "
          f"dtype={plan.dtype}")

    # X16 / X17, the seed's own line (use_cpu on a CPU-only machine, where Trainer would otherwise look for a GPU).
    try:
        seed_args = TrainingArguments(output_dir=output, bf16=bf16, report_to="none",
                                      use_cpu=plan.accelerator.kind == "cpu")
        print(f"TrainingArguments(output_dir=..., bf16={bf16}).device = {seed_args.device}")
    except ValueError as error:
        print(f"TrainingArguments(bf16={bf16}) raised ValueError: {error}")

    try:
        args_ours = hwrun.training_arguments(plan, output, **({"bf16": True} if args.bf16 else {}))
    except TrainingConfigError as error:
        print(f"hwrun refused before loading: {error}")
        return 0
    print(f"hwrun.training_arguments: device={args_ours.device} bf16={args_ours.bf16} "
          f"optim={getattr(args_ours.optim, 'value', args_ours.optim)} torch_compile={args_ours.torch_compile}")
    if args.plan_only:
        return 0

    data = os.path.join(hwrun.DEFAULT_MODEL, "sample_train.txt")
    overrides = {"bf16": True} if args.bf16 else {}
    result = hwrun.train(plan, data, lora=True, max_steps=args.max_steps, batch_size=4, block_size=64,
                         output_dir=output, resume=False, save_steps=10_000, plot=False, **overrides)
    print("losses: " + ", ".join(f"step {step} {loss:.3f}" for step, loss in result.losses))
    print(f"trained {result.global_step} steps, no device set by us; adapter in {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
