# Facts: X15, G10, G11
# Run: uv run python examples/qlora_finetune.py [--max-steps 3] [--output DIR] [--plan-only]
"""QLoRA: load the base model in 4-bit with bitsandbytes and train LoRA adapters with PEFT (hwrun.train).

X15, G11: a model that does not fit the device's memory is fine-tuned as 4-bit NF4 weights plus
LoRA adapters. G10: bitsandbytes quantizes on Gaudi 2 and Gaudi 3, and with no device_map the
model goes to the current Gaudi. On this CPU machine the path is real, not simulated:
bitsandbytes 0.50 has a CPU backend, so the shipped tiny model is loaded in 4-bit and a few
LoRA steps run (slowly; a smoke test). Where bitsandbytes has no backend (a first-generation
Gaudi, Apple MPS) hwrun refuses before loading and says what works instead; the decisions for
such machines are printed first, without their hardware. `--plan-only` stops after them.
On CPUs with AVX512-BF16, importing bitsandbytes tries to fetch its own Hub kernel
(kernels-community/quantization-bitsandbytes) and falls back to its CPU code when it cannot;
run with HF_HUB_OFFLINE=1 to keep it offline.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import hwenv
import hwrun

OTHER_MACHINES = {
    "Gaudi 2 (8 devices)": hwenv.Accelerator("hpu", 8, names=("GAUDI2",) * 8),
    "first-generation Gaudi": hwenv.Accelerator("hpu", 8, names=("GAUDI",) * 8),
    "Apple GPU (mps)": hwenv.Accelerator("mps"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--output", default=None, help="output folder (default: a new temporary folder)")
    parser.add_argument("--plan-only", action="store_true", help="print the decisions and stop (nothing loads)")
    args = parser.parse_args(argv)

    from hwrun.training import QLoRAUnsupportedError, train_plan

    for label, accel in OTHER_MACHINES.items():
        try:
            other = hwrun.plan(device=accel, quantization="4bit")
            print(f"{label}: 4bit ok, device_map={other.device_map}: {other.reasons['quantization']}")
        except hwrun.QuantizationError as error:
            print(f"{label}: refused: {error}")

    try:
        plan = train_plan(quantization="4bit")
    except hwrun.QuantizationError as error:
        print(f"this machine: refused: {error}")
        return 0
    print(f"this machine: {plan.device} device_map={plan.device_map} compute dtype {plan.dtype}: "
          f"{plan.reasons['quantization']}")
    if args.plan_only:
        return 0

    model, _ = hwrun.load(plan)
    layers = [name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"]
    print(f"loaded in 4-bit: {len(layers)} bitsandbytes Linear4bit layers, e.g. {layers[0]}")
    del model

    output = args.output or tempfile.mkdtemp(prefix="hwstack-qlora-")
    data = os.path.join(hwrun.DEFAULT_MODEL, "sample_train.txt")
    try:
        result = hwrun.train(plan, data, qlora=True, max_steps=args.max_steps, batch_size=2, block_size=32,
                             output_dir=output, resume=False, save_steps=10_000, plot=False)
    except QLoRAUnsupportedError as error:
        print(f"refused: {error}")
        return 1
    for key, reason in result.reasons.items():
        print(f"{key}: {reason}")
    print("losses: " + ", ".join(f"step {step} {loss:.3f}" for step, loss in result.losses))
    print(f"adapter saved in {output}: {sorted(os.listdir(output))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
