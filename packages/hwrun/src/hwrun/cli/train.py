"""`hwrun train`: fine-tune a model on a text/JSONL file or a folder of .txt files from the command
line (LoRA, QLoRA or full), with a progress bar, loss logging, checkpoints and a loss-curve PNG."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from .main import TORCH_THREADS_HELP

logger = logging.getLogger(__name__)

def data_size(text: str) -> int:
    """`--max-data-size`: bytes, or a number with K, M, G or T (powers of 1024), e.g. 512M, 16G (the size grammar of
    `hwdist bench --sizes`, parsed by the same function)."""
    from hwdist.errors import HwdistError
    from hwdist.sizes import parse_size

    try:
        return parse_size(text)
    except HwdistError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def kernel_choice(text: str) -> tuple[str, str]:
    """`--kernel OP=IMPL` (e.g. swiglu=liger): one op's implementation, checked by train() before any work."""
    op, sep, impl = text.partition("=")
    if not sep or not op.strip() or not impl.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not OP=IMPL (e.g. swiglu=liger, cross_entropy=hwrun)")
    return op.strip(), impl.strip()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `train` subcommand on `hwrun`'s subparsers (called by hwrun.cli)."""
    p = subparsers.add_parser(
        "train", help="fine-tune MODEL on --data (LoRA, 4-bit QLoRA or full) with resumable checkpoints",
        description="Fine-tune with Transformers' Trainer on this device (bf16 and torch.compile where the "
                    "device has them). Checkpoints go to OUTPUT/checkpoint-N (written atomically), the final "
                    "adapter or model to OUTPUT itself, so `hwrun generate --model OUTPUT` loads it. SIGTERM or "
                    "Ctrl-C saves a checkpoint and stops; --resume continues from the newest complete one.")
    p.add_argument("--data", required=True,
                   help="text file, folder of .txt, JSONL/JSON/Parquet/CSV file (rows with \"messages\", "
                        "\"prompt\"+\"completion\" or \"text\"), or a datasets Hub id")
    p.add_argument("--text-field", default=None, metavar="NAME", help="the column holding plain text (default: text)")
    p.add_argument("--messages-field", default=None, metavar="NAME",
                   help="the column holding chats, lists of {role, content} (default: messages)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template for models whose tokenizer has none (hwrun ships "
                        "hwrun/data/chat_template.jinja)")
    p.add_argument("--no-packing", action="store_true",
                   help="chat/instruction data: one example per block instead of packing several (each with its "
                        "own positions)")
    p.add_argument("--model", default=None, help="base model folder or Hub id (default: the shipped tiny model)")
    p.add_argument("--output", default="hwrun-train", help="output folder (default: hwrun-train)")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (PEFT) instead of every weight")
    p.add_argument("--qlora", action="store_true", help="LoRA on a 4-bit bitsandbytes base (X15, G11)")
    p.add_argument("--quantize", default=None, metavar="METHOD",
                   help="LoRA on a base quantized on load with METHOD: int8-weight-only (torchao), bnb-4bit (= --qlora); "
                        "a method hwrun does not train through (int4-weight-only, int8-dynamic, float8, ...) is "
                        "refused before load with the reason (hwrun's README: the quantization table's train column)")
    p.add_argument("--merge", action="store_true", help="save LoRA merged into the base weights")
    p.add_argument("--lora-r", type=int, default=None, help="LoRA rank (default 16; needs --lora or --qlora)")
    p.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (default 32; needs --lora or --qlora)")
    p.add_argument("--lora-targets", default=None,
                   help="comma-separated module names, or all-linear (default: PEFT's mapping for the "
                        "architecture, else all-linear)")
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (default: --epochs over the data)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the data when --max-steps is not given")
    p.add_argument("--lr", type=float, default=2e-4, help="learning rate (default 2e-4)")
    p.add_argument("--batch-size", type=int, default=8, help="blocks per device per step (default 8)")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps (default 1)")
    p.add_argument("--block-size", type=int, default=512, help="tokens per packed block (default 512)")
    p.add_argument("--save-steps", type=int, default=100, help="checkpoint every N steps (default 100)")
    p.add_argument("--lr-scheduler", default=None, metavar="NAME",
                   help="learning-rate schedule: linear (default), constant, cosine, ... (Transformers' names)")
    p.add_argument("--seed", type=int, default=42)
    sharding = p.add_mutually_exclusive_group()
    sharding.add_argument("--fsdp", action="store_true",
                          help="shard parameters, gradients and optimizer state over the processes with FSDP2 "
                               "(Accelerate); start one process per device with `hwdist launch --nproc-per-node N "
                               "-m hwrun.cli train ...` (alone: one process). Checkpoints are sharded and resume at another "
                               "process count; the final model is one safetensors file (or the adapter)")
    sharding.add_argument("--deepspeed", default=None, metavar="STAGE",
                          help="DeepSpeed ZeRO: zero2 (optimizer state and gradients sharded), zero3 (parameters too), "
                               "or a DeepSpeed JSON config file")
    p.add_argument("--fsdp-checkpoint", default=None, metavar="KIND",
                   help="with --fsdp: sharded (default: each process writes its shard of the weights and optimizer "
                        "state, torch.distributed.checkpoint files; nothing gathered) or full (gathered on rank 0: the "
                        "model or adapter as safetensors, the optimizer state as one file). Both resume at another "
                        "process count")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --output whose checksums verify (start fresh if none)")
    p.add_argument("--overwrite", action="store_true",
                   help="use an --output folder holding files hwrun did not write (they are never replaced or "
                        "deleted), and let a fresh start replace an earlier run's files there")
    p.add_argument("--on-nonfinite", choices=("stop", "skip", "ignore"), default="stop",
                   help="a NaN/inf loss or weight: stop before saving anything (default), skip that step's update, "
                        "or ignore it")
    p.add_argument("--max-data-size", type=data_size, default=None, metavar="SIZE",
                   help="read at most this much training data, e.g. 512M, 16G (default 4G)")
    p.add_argument("--kernel", type=kernel_choice, action="append", default=None, metavar="OP=IMPL",
                   help="implementation of one training op (repeatable): OP is cross_entropy, swiglu, rmsnorm or "
                        "rope; IMPL auto (the measured default for the device), hwrun, inductor, liger (CUDA/ROCm/"
                        "XPU, pip install hwrun[liger]) or torch (torch's own op). The choices are printed after "
                        "training when --kernel is given; -v prints every op's choice and its reason")
    p.add_argument("--device", default="auto", help="auto (detect) or cpu, cuda, xpu, hpu, mps")
    p.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    p.add_argument("--attention", default="auto", help="auto, sdpa, eager, flash_attention_2, ...")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on for accelerators, off on CPU)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code")
    p.add_argument("--torch-threads", type=int, default=None, metavar="N", help=TORCH_THREADS_HELP)
    p.add_argument("--eval-fraction", type=float, default=0.0, metavar="F",
                   help="hold out this share of the packed blocks (the last ones, e.g. 0.1) and report the eval loss "
                        "on them (in the output, loss.png and the TensorBoard logs)")
    p.add_argument("--eval-steps", type=int, default=None, metavar="N",
                   help="evaluate every N steps (default: --save-steps, or a fifth of --max-steps if smaller)")
    p.add_argument("--report-to", default=None, metavar="NAME[,NAME]",
                   help="log to these trackers through Transformers (tensorboard, wandb, mlflow, trackio, ...) "
                        "instead of hwrun's own TensorBoard event files in OUTPUT/hwrun-tensorboard/; none: neither")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (loss lines only)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars: neither the Hub download's (shown by default) nor the training bar")
    p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log every decision; print the traceback with an error (same as hwrun -v)")
    p.set_defaults(func=run_train)
    return p


def run_train(args: argparse.Namespace) -> int:
    """Carry out `hwrun train` for parsed `args`; returns the exit status. Under a launcher only rank 0 prints (the
    plan, the loss lines and the summary once, not once per process); errors still reach every rank's stderr."""
    import contextlib
    import os

    if os.environ.get("RANK", "0").strip() in ("", "0"):
        return _run_train(args)
    with open(os.devnull, "w", encoding="utf-8") as quiet, contextlib.redirect_stdout(quiet):
        return _run_train(args)


def _run_train(args: argparse.Namespace) -> int:
    import sys

    from ..training import (
        DEFAULT_MAX_DATA_BYTES,
        LoraSettings,
        TrainingConfigError,
        train,
        train_plan,
    )
    from .main import torch_threads_set
    from .quiet import note_plan

    if args.torch_threads is not None and args.torch_threads < 1:
        raise TrainingConfigError(f"--torch-threads {args.torch_threads} must be an integer >= 1 (leave it out to let "
                                  "hwrun decide).")

    _check_fsdp_checkpoint(args)
    _hub_progress(args.quiet)  # before planning: plan() downloads a Hub model
    report = _report_to(args.report_to)
    run_plan = train_plan(args.model, device=args.device, dtype=args.dtype, attention=args.attention,
                          compile=args.compile, quantization=args.quantize, trust_remote_code=args.trust_remote_code)
    note_plan(run_plan)
    print(run_plan.render(), flush=True)
    lora = None
    given = [f"--{name.replace('_', '-')}" for name in ("lora_r", "lora_alpha", "lora_targets")
             if getattr(args, name) is not None]
    if given and not (args.lora or args.qlora):
        raise TrainingConfigError(
            f"{', '.join(given)} given without --lora or --qlora: this run would be full fine-tuning of "
            "every weight and ignore them. Fix: add --lora (or --qlora), or drop those options."
        )
    if args.lora or args.qlora:
        targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()) if args.lora_targets else None
        given_numbers = {"r": args.lora_r, "alpha": args.lora_alpha}  # None: LoraSettings' own default
        lora = LoraSettings(target_modules=targets, **{k: v for k, v in given_numbers.items() if v is not None})
    kernels = dict(args.kernel or ())
    if len(kernels) != len(args.kernel or ()):
        raise TrainingConfigError(f"--kernel names an op twice ({', '.join(f'{o}={i}' for o, i in args.kernel)}); "
                                  "give each op once.")
    # the `step N/M  loss X` lines always; on a terminal a bar of steps under them (hwrun.training.progress),
    # in place of Transformers' bar, which printed every log as a dict
    from ..training.progress import StepBar

    bar = None if args.no_progress or args.quiet or not sys.stderr.isatty() else StepBar()
    overrides = _sharding_overrides(run_plan, args)
    if args.lr_scheduler is not None:
        overrides["lr_scheduler_type"] = args.lr_scheduler
    if report is not None:
        overrides["report_to"] = report
    try:
        with torch_threads_set(run_plan, args.torch_threads):  # hwrun generate's and serve's rule (hwrun plan's row)
            result = train(
                run_plan, args.data, kernels=kernels or None, lora=lora, qlora=args.qlora, epochs=args.epochs,
                max_steps=args.max_steps, lr=args.lr, batch_size=args.batch_size, grad_accum=args.grad_accum,
                seed=args.seed, output_dir=args.output, resume="auto" if args.resume else False,
                block_size=args.block_size, merge=args.merge, save_steps=args.save_steps,
                echo=bar.write if bar is not None else _print_line, callbacks=[bar] if bar is not None else [],
                overwrite=args.overwrite, on_nonfinite=args.on_nonfinite,
                max_data_bytes=args.max_data_size or DEFAULT_MAX_DATA_BYTES,
                text_field=args.text_field, messages_field=args.messages_field, chat_template=args.chat_template,
                packing=not args.no_packing, eval_fraction=args.eval_fraction, eval_steps=args.eval_steps,
                disable_tqdm=True,  # a TrainingArguments keyword: Transformers' own bar and its dict lines off
                **overrides,
            )
    finally:
        import hwdist

        hwdist.shutdown(adopted=True)  # the command ends here: destroy the group Trainer started, if any
    if result.already_finished:
        print(f"nothing to do: {result.reasons['resume']}")
        return 0
    if result.resumed_from:
        print(f"resumed from {result.resumed_from}")
    for key in ("bad rows", "kept", "plot", "nonfinite"):
        if key in result.reasons:
            print(f"note: {result.reasons[key]}")
    chosen = {key.removeprefix("kernel "): why for key, why in result.reasons.items() if key.startswith("kernel ")}
    if chosen and (args.kernel or getattr(args, "verbose", False)):  # the default choices: with -v (and their why)
        print("kernels: " + ", ".join(f"{op}={_impl_of(why)}" for op, why in chosen.items()))
        if getattr(args, "verbose", False):
            for op, why in chosen.items():
                print(f"  {op}: {why}")
    last = f"{result.losses[-1][1]:.4f}" if result.losses else "n/a"
    if result.interrupted:
        print(f"stopped by {result.interrupted} at step {result.global_step} (loss {last}); checkpoint saved in "
              f"{result.output_dir}. Continue with: hwrun train --data {args.data} --output {args.output} --resume ...")
        return 0
    kind = "merged model" if result.merged else ("LoRA adapter" if result.lora else "model")
    print(f"done: {result.global_step} steps, final loss {last}; {kind} saved in {result.output_dir}")
    if result.eval_losses:
        step, loss = result.eval_losses[-1]
        print(f"eval loss {loss:.4f} at step {step} ({result.reasons.get('eval', 'held-out split')})")
    if result.loss_plot:
        print(f"loss curve: {result.loss_plot}")
    from ..training.events import EVENTS_DIR

    if (Path(result.output_dir) / EVENTS_DIR).is_dir() and report is None:
        print(f"TensorBoard logs: {Path(result.output_dir) / EVENTS_DIR} (tensorboard --logdir {result.output_dir})")
    quantized = f" --quantize {args.quantize}" if args.quantize and result.lora and not result.merged else ""
    print(f'generate with: hwrun generate --model {result.output_dir}{quantized} "Once upon a time"')
    return 0


def _hub_progress(quiet: bool) -> None:
    """Hub download progress bars on (a first download can be several GB), off with --quiet. Transformers' own bars
    (weight loading) stay off; HF_HUB_DISABLE_PROGRESS_BARS=1 set by the user still wins (huggingface_hub warns)."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    if quiet:
        disable_progress_bars()
    else:
        enable_progress_bars()


def _report_to(text: str | None) -> list[str] | None:
    """`--report-to`: the trackers named, each one Transformers can use here (installed), checked before any work."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["none"]:
        return ["none"]
    from transformers.integrations import get_available_reporting_integrations

    from ..training import TrainingConfigError

    available = get_available_reporting_integrations()
    missing = [name for name in names if name not in available]
    if not names or missing:
        raise TrainingConfigError(
            f"--report-to {text!r}: {', '.join(missing) or 'no name'} cannot be used here (installed trackers: "
            f"{', '.join(available) or 'none'}). Fix: install it (e.g. pip install tensorboard), pick one of those, "
            "or leave --report-to out for hwrun's own TensorBoard event files.")
    return names


def _check_fsdp_checkpoint(args: argparse.Namespace) -> None:
    """`--fsdp-checkpoint`: a kind hwrun knows, and only with --fsdp; checked before the plan (which may download)."""
    if args.fsdp_checkpoint is None:
        return
    from ..training.sharding import fsdp_checkpoint_kind

    fsdp_checkpoint_kind(args.fsdp_checkpoint, "--fsdp-checkpoint {value}")
    if not args.fsdp:
        from ..training import TrainingConfigError

        raise TrainingConfigError(f"--fsdp-checkpoint {args.fsdp_checkpoint} without --fsdp: it picks the kind of FSDP "
                                  "checkpoint. Fix: add --fsdp, or drop --fsdp-checkpoint.")


def _sharding_overrides(run_plan: Any, args: argparse.Namespace) -> dict[str, Any]:
    """`--fsdp` / `--deepspeed`: their TrainingArguments keywords. Run alone (no torchrun, `hwdist launch` or
    `accelerate launch` around it) the command forms a process group of one, as `torchrun --nproc-per-node 1` would
    (Trainer runs FSDP and DeepSpeed only in a process group): that is how a sharded checkpoint resumes on one device."""
    if not args.fsdp and args.deepspeed is None:
        return {}
    from ..training.arguments import is_distributed_launch
    from ..training.sharding import DEFAULT_FSDP_CHECKPOINT, deepspeed_overrides, fsdp_overrides

    overrides, why = (fsdp_overrides(run_plan, args.fsdp_checkpoint or DEFAULT_FSDP_CHECKPOINT) if args.fsdp else
                      deepspeed_overrides(run_plan, args.deepspeed))
    logger.info("%s", why)
    if not is_distributed_launch():
        import os
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        single = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        for name, value in single.items():
            os.environ.setdefault(name, value)
        flag = "--fsdp" if args.fsdp else f"--deepspeed {args.deepspeed}"
        print(f"note: {flag} in one process (no launcher): a process group of 1 on 127.0.0.1:{port}; for several "
              "devices start it with hwdist launch --nproc-per-node N", flush=True)
    return overrides


def _print_line(line: str) -> None:
    print(line, flush=True)


def _impl_of(why: str) -> str:
    """The implementation a kernel reason names (every reason of hwrun.training.kernel_policy starts with it and
    a colon), with " (not applied)" when the run could not apply it."""
    impl = why.split(":", 1)[0]
    return f"{impl} (not applied)" if "(not applied:" in why else impl
