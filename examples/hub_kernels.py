# Facts: X12, X13
# Run: uv run python examples/hub_kernels.py [--device xpu|cuda|hpu|cpu]
"""Which layers `use_kernels=True` would replace with Hub kernels, for inference and for training, and the
`from_pretrained` keywords that ask for them; nothing is downloaded.

X12: `use_kernels=True` replaces supported layers with Hub kernels on Intel GPUs as on NVIDIA GPUs;
which layers is the installed Transformers' default mapping (`hwattn.default_kernels`): 5.22-5.24
map activations, RMSNorm and rotary embeddings on XPU for inference, 5.25 drops the XPU RMSNorm
default and maps rotary embeddings for training too. X13: the kernels follow `model.train()` /
`model.eval()`, and a `KernelConfig` with the device key `"xpu"` chooses kernels yourself.
hwattn.kernel_plan reads the same mapping tables `kernels.kernelize` reads, without loading a
kernel. `--device` plans for another machine (default: this one). Loading a kernel needs the Hub
or a local checkout: with `HF_HUB_OFFLINE=1` the example tries one and prints why it cannot load
and what to do; otherwise it only prints that advice (it never downloads).
"""

from __future__ import annotations

import argparse
import os

import hwattn
import hwenv

MAPPING = {"RMSNorm": {"xpu": "kernels-community/rmsnorm:RMSNorm",
                       "cuda": "kernels-community/liger-kernels:LigerRMSNorm"}}


def show(plan: hwattn.KernelPlan) -> None:
    """The plan's headline and one line per layer kind (the model repeats them per decoder layer)."""
    print(f"  {plan.device} ({plan.mode}): used={plan.used}: {plan.reason}")
    seen = set()
    for layer in plan.replaced + plan.unchanged:
        if layer.layer in seen:
            continue
        seen.add(layer.layer)
        why = "" if layer.reason == plan.reason else f" ({layer.reason})"
        target = f"<- {layer.repo}:{layer.repo_layer} [{layer.source}]" if layer.replaced else f"keeps PyTorch{why}"
        print(f"    {layer.layer:<15} {target}")
    print(f"    {len(plan.replaced)} of {len(plan.replaced) + len(plan.unchanged)} layers replaced")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (this machine) or a kind to plan for: xpu, cuda, hpu, cpu")
    args = parser.parse_args(argv)

    import hwrun  # only for the path of the shipped tiny model
    from transformers import AutoModelForCausalLM

    accel = hwenv.detect() if args.device == "auto" else hwenv.Accelerator(args.device)
    model = AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL)  # on CPU; kernels are not loaded
    print(f"kernels library usable: {hwattn.kernels_available()}")

    print("X12: Transformers' own mapping, inference (from_pretrained returns eval mode):")
    show(hwattn.kernel_plan(model.eval(), accel))
    print("X13: the same model after model.train():")
    show(hwattn.kernel_plan(model.train(), accel))
    model.eval()

    print(f"X13: your own KernelConfig, device keys {', '.join(hwattn.device_keys())}:")
    try:
        config = hwattn.kernel_mapping(MAPPING, model=model)
        print(f"  KernelConfig.kernel_mapping = {config.kernel_mapping}")
        show(hwattn.kernel_plan(model, accel, MAPPING))
        kwargs = hwattn.load_kwargs(accel, "sdpa", mapping=MAPPING)
        narrowed = kwargs["kernel_config"].kernel_mapping if "kernel_config" in kwargs else None
        print(f"  from_pretrained keywords: use_kernels={kwargs.get('use_kernels')} kernel_config={narrowed}")
    except hwattn.HwattnError as error:
        print(f"  {type(error).__name__}: {error}")
    try:
        hwattn.kernel_mapping({"RMSNorm": {"gpu": MAPPING["RMSNorm"]["xpu"]}})
    except hwattn.KernelMappingError as error:
        print(f"  a wrong device key is refused: {error}")

    repo = MAPPING["RMSNorm"]["xpu"].split(":")[0]
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        try:
            hwattn.load_kernel(repo)
            print(f"{repo} loaded from the local Hub cache")
        except hwattn.KernelUnavailableError as error:
            print(f"no Hub: {error}")
    else:
        print(f"not loading {repo} (this example never downloads). {hwattn.local_kernel_hint(repo)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
