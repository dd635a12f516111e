# Facts: X18, G15, G16
# Run: uv run hwdist launch --nproc-per-node 2 examples/distributed_train.py [--max-steps 3] [--output DIR]
"""Data-parallel LoRA fine-tuning, one process per device, launched by `hwdist launch` (torchrun underneath).

X18: Intel GPUs use the `xccl` collective backend, one process per XPU (`torchrun
--nproc_per_node=2 train.py`). G15: Gaudi uses HCCL, which Transformers picks by itself or with
`ddp_backend="hccl"`. G16: after choosing devices, launch one process per Gaudi; without a count
`hwdist launch` starts one per selected device, as `accelerate launch` does. Each rank runs
hwrun.train (Trainer, DDP); afterwards the ranks compare a checksum of their trained LoRA weights
with hwdist.all_gather_object, and must agree; then every rank destroys the group
(hwdist.shutdown(adopted=True)), as a script under torchrun should. On this CPU machine the
backend is gloo and the two processes share the CPU. `--plan-only` prints the backend and launch decisions for this
machine and two others without starting anything (no launcher needed).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import hwdist
import hwenv

SCRIPT = "examples/distributed_train.py"


def show_plan() -> None:
    """Backend and launch line here (G16: as many processes as devices), and for two other machines."""
    accel = hwenv.detect()
    choice = hwdist.backend_for(accel)
    print(f"this machine: {accel.kind} x{accel.count}: backend {choice.name}, ddp_backend={choice.ddp_backend}: "
          f"{choice.reason}")
    argv, env = hwdist.launch_command(SCRIPT)
    print(f"  hwdist launch {SCRIPT} -> {' '.join(argv[1:])} env={env}")
    for kind, devices in (("xpu", "0,1"), ("hpu", "4,5")):
        other = hwdist.backend_for(hwenv.Accelerator(kind, 8))
        argv, env = hwdist.launch_command(SCRIPT, kind=kind, devices=devices)
        print(f"{kind} devices {devices}: backend {other.name}, ddp_backend={other.ddp_backend}")
        print(f"  hwdist launch --kind {kind} --devices {devices} {SCRIPT} -> {' '.join(argv[1:])} env={env}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--output", default=None, help="output folder, the same for every rank, new or "
                        "empty (default: one per launch under the temporary folder)")
    parser.add_argument("--plan-only", action="store_true", help="print the decisions and stop")
    args = parser.parse_args(argv)
    if args.plan_only:
        show_plan()
        return 0

    import hwrun
    from transformers import TrainerCallback

    # one folder per launch, the same on every rank: the ranks share their parent, the launcher
    output = args.output or os.path.join(tempfile.gettempdir(),
                                         f"hwstack-ddp-{os.environ.get('MASTER_PORT', 'single')}-{os.getppid()}")
    seen = {}

    class Checksum(TrainerCallback):
        """Keeps what Trainer used (world size, ddp_backend) and a checksum of the trained weights."""

        def on_train_end(self, args, state, control, model=None, **kwargs):
            trained = [p.detach().double().sum().item() for p in model.parameters() if p.requires_grad]
            seen.update(world=args.world_size, ddp_backend=args.ddp_backend, checksum=sum(trained),
                        parallel_mode=str(args.parallel_mode))

    plan = hwrun.plan()
    data = os.path.join(hwrun.DEFAULT_MODEL, "sample_train.txt")
    result = hwrun.train(plan, data, lora=True, max_steps=args.max_steps, lr=3e-3, batch_size=2, block_size=32,
                         output_dir=output, resume=False, save_steps=10_000, plot=False, disable_tqdm=True,
                         callbacks=[Checksum()])

    ctx = hwdist.init()  # adopts the process group Trainer started (or starts a world of 1)
    try:
        everyone = hwdist.all_gather_object((ctx.rank, seen["checksum"], result.global_step))
    finally:
        hwdist.shutdown(adopted=True)  # the script ends here: destroy Trainer's group on every rank
    if ctx.is_main:
        print(f"backend {ctx.backend}, world size {ctx.world_size} (Trainer: world_size={seen['world']}, "
              f"ddp_backend={seen['ddp_backend']}, {seen['parallel_mode']})")
        for rank, checksum, steps in everyone:
            print(f"  rank {rank}: {steps} steps, LoRA weight checksum {checksum:.10f}")
        agree = len({checksum for _, checksum, _ in everyone}) == 1
        print(f"ranks agree: {agree}")
        if not agree:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
