# Facts: G13, G14
# Run: uv run python examples/compile_model.py [--backend aot_eager] [--cpu-tensors]
"""`torch.compile` on any device through hwcompile: `hpu_backend` on Gaudi with one warning, unchanged elsewhere.

G13: on Gaudi a `torch.compile` call with any backend but `hpu_backend`/`eager` (and every
`@torch.compile` in modelling code) is switched to `hpu_backend` and a warning is logged; this
covers inference and training. G14: `TrainingArguments(torch_compile=True)` uses
`torch_compile_backend="hpu_backend"` on Gaudi. The example compiles the shipped tiny model with
hwcompile.compile (default backend: the device's default, inductor off Gaudi; inductor takes
~15 s on a CPU, `--backend aot_eager` is quicker), checks the compiled logits against eager ones,
routes someone else's `torch.compile` call with patch_torch_compile(), and prints the
TrainingArguments keywords. `--cpu-tensors` keeps the model on the CPU even when the detected
accelerator is another one (for a simulated Gaudi: only the routing is real there).
"""

from __future__ import annotations

import argparse
import logging

import hwcompile
import hwenv


class WarningCount(logging.Handler):
    """Counts WARNING records of the logger it is attached to."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="backend to ask for (default: none, torch's default)")
    parser.add_argument("--cpu-tensors", action="store_true", help="keep the model on the CPU (simulated devices)")
    args = parser.parse_args(argv)

    import hwrun  # only for the path of the shipped tiny model
    import torch
    from transformers import AutoModelForCausalLM

    accel = hwenv.detect()
    warnings = WarningCount()
    logging.getLogger("hwcompile").addHandler(warnings)

    decision = hwcompile.route_backend(accel, args.backend)
    print(f"{accel.kind}: asked for {decision.requested!r}, compiling with {decision.backend!r} "
          f"(rerouted={decision.rerouted}): {decision.reason}")

    device = "cpu" if args.cpu_tensors else accel.device
    model = AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL).eval().to(device)
    ids = torch.tensor([[1, 200, 300, 400, 500, 600]], device=device)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = hwcompile.compile(model, backend=args.backend)(ids).logits
    diff = (compiled - eager).abs().max().item()
    print(f"compiled logits == eager logits: {diff < 1e-4} (max difference {diff:.2e})")
    print(f"hwcompile warnings on the compile path: {warnings.count}")

    # G13, other people's code: a torch.compile call with its own backend, routed while patched.
    calls = []

    def their_backend(graph_module, example_inputs):
        calls.append(len(example_inputs))
        return graph_module.forward

    with hwcompile.patch_torch_compile(accel) as patch:
        torch.compile(lambda x: torch.sin(x) * 2, backend=their_backend)(torch.ones(3))
    print(f"patch_torch_compile: active={patch.active}: {patch.reason}")
    print(f"their torch.compile(backend=their_backend) reached their backend: {bool(calls)}")
    print(f"hwcompile warnings in all: {warnings.count}")
    logging.getLogger("hwcompile").removeHandler(warnings)

    # G14: TrainingArguments keywords (checked against the real class).
    from transformers import TrainingArguments

    keywords = hwcompile.training_arguments(accel)
    training = TrainingArguments(output_dir="unused", report_to="none", use_cpu=accel.kind == "cpu", **keywords)
    print(f"training_arguments: {keywords} -> TrainingArguments.torch_compile_backend="
          f"{training.torch_compile_backend!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
