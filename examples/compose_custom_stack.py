# Facts: X6, G13
# Run: uv run python examples/compose_custom_stack.py [--steps 3] [--compile on --backend aot_eager]
"""Your own training loop with only hwenv, hwattn and hwcompile installed (no hwrun, no hwdist, no peft).

Plain PyTorch: forward, loss, backward, optimizer step on a tiny Llama built from a config, where
the three packages make the device decisions: hwenv.detect() the device and bf16 support,
hwattn.load_kwargs / resolve_attention the `attn_implementation` (X6: it applies to training
too), hwcompile.route_backend / compile the compile backend (G13: on Gaudi any backend becomes
`hpu_backend`, training included). `--compile auto` compiles on accelerators and not on a CPU,
where compile time would dominate a few steps; `--compile on --backend aot_eager` compiles
quickly on a CPU too. tests/test_compose_stack.py runs this in a fresh venv holding only the
three wheels plus torch and transformers.
"""

from __future__ import annotations

import argparse
import importlib.util
import math

import hwattn
import hwcompile
import hwenv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--backend", default=None, help="compile backend to ask for (default: the device's)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    missing = [name for name in ("hwrun", "hwdist", "peft") if importlib.util.find_spec(name) is None]
    print(f"installed: hwenv {hwenv.__version__}, hwattn {hwattn.__version__}, hwcompile {hwcompile.__version__}; "
          f"not installed: {', '.join(missing) or 'none'}")

    accel = hwenv.detect()
    dtype = torch.bfloat16 if accel.bf16 and accel.kind != "cpu" else torch.float32
    print(f"device: {accel.device} ({accel.name}), dtype {dtype}")

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256)
    choice = hwattn.resolve_attention(accel, args.attention, model_config=config)
    print(f"attention: {choice.implementation}: {choice.reason}")
    if choice.kernel_repo is not None:
        print(f"stopping: {choice.kernel_repo} is a hub kernel and this example never downloads")
        return 1
    kwargs = hwattn.load_kwargs(accel, args.attention, model_config=config)
    torch.manual_seed(0)
    # from_config builds random weights and takes no use_kernels (hub kernels are a from_pretrained step)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=kwargs["attn_implementation"])
    model = model.to(device=accel.device, dtype=dtype).train()

    compile_on = args.compile == "on" or (args.compile == "auto" and accel.kind not in ("cpu", "mps"))
    decision = hwcompile.route_backend(accel, args.backend)
    print(f"compile: {'on' if compile_on else 'off'}; backend {decision.backend!r}: {decision.reason}")
    step_model = hwcompile.compile(model, backend=args.backend, accel=accel) if compile_on else model

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (4, 32), generator=generator).to(accel.device)
    losses = []
    for step in range(1, args.steps + 1):
        loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.4f}")
    finite = all(math.isfinite(value) for value in losses)
    print(f"losses finite: {finite}; loss went down: {losses[-1] < losses[0]}")
    return 0 if finite else 1


if __name__ == "__main__":
    raise SystemExit(main())
