"""Scaling benchmark (issue 37.3): tensor-parallel decode and FSDP training at 1, 2, 4, 8 ranks (as many as this
machine has), through hwrun's own paths: `hwrun.plan(tp=N)` -> `load` -> `generate` in N processes started by
`hwdist launch` (torchrun), and `hwrun train --fsdp` under `hwdist launch`.

    python tools/bench/scale.py --out DIR              # accelerators: a ~1.2B random Llama (bf16), offline
    python tools/bench/scale.py --out DIR --smoke      # tiny sizes, CPU ok (proves the script, not a result)
    python tools/bench/scale.py --out DIR --ranks 1    # world size 1 only: the baseline for scaling

Decode rows: per rank count, tokens/s (all prompts) and time per token (one decode step of the batch), median of
`--repeats` timed runs after a warm-up, at every rank count both hwrun's default (its engine on every rank over its
shards, the path `hwrun generate --tp N` runs; graphs where the device has them) and Transformers' generate on one
static batch of the shards (`--decode generate`, the tp path before the engine). Training rows (LoRA on an FSDP-sharded base by default, `--train-mode full` for every weight): tokens/s
from the `step N/M` lines' arrival times (after `--train-warmup` steps), global
tokens per step = batch x block x ranks, and scaling efficiency = tokens/s at N / (N x tokens/s at 1). When
`hwrun train` has no `--fsdp` the training part is skipped and the JSON says why.

Writes DIR/scale.json (device, versions, the command, every row, after each row) and DIR/scale.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

RANKS = (1, 2, 4, 8)
#: packages/*/src for the child processes too (`-m hwrun.cli` where hwstack is not installed, e.g. a lent GPU)
SOURCES = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))


def with_sources(env: dict) -> dict:
    """`env` with hwstack's source folders first on PYTHONPATH."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, (SOURCES, env.get("PYTHONPATH"))))}
STEP_LINE = re.compile(r"^step (\d+)/(\d+)\s")


# ------------------------------------------------------------------------------------------------------ workers

def decode_worker(args: argparse.Namespace) -> None:
    """One rank of the decode measurement (run under torchrun): plan with tp = WORLD_SIZE, load, warm, time."""
    import hwrun
    from decode import prompts_of
    from hwenv.platforms import runtime
    from hwrun.parallel.ranks import finish, is_leader

    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = hwrun.plan(args.model, device=args.device, dtype=args.dtype, tp=world)
    model, tokenizer = hwrun.load(plan)
    prompts = prompts_of(tokenizer, args.prompts, args.prompt_tokens, seed=0)
    rows = []
    # hwrun's default (its engine on every rank under tp, graphs where the device has them) at every rank count, and
    # Transformers' loop on one static batch beside it (the tp path before the engine ran there)
    paths = [("generate", "static"), ("auto", "auto")]
    for decode, batching in paths:
        options = dict(batching=batching, decode=decode, model=model, tokenizer=tokenizer)
        hwrun.generate(plan, prompts, 8, **options)  # warm-up: kernels, graphs, allocator
        runs = []
        for _ in range(args.repeats):
            runtime.synchronize(plan.accelerator.platform)
            start = time.perf_counter()
            result = hwrun.generate(plan, prompts, args.new_tokens, **options)
            runtime.synchronize(plan.accelerator.platform)
            seconds = time.perf_counter() - start
            runs.append((seconds, result.total_new_tokens, max(result.new_tokens)))
        seconds, total, steps = sorted(runs)[len(runs) // 2]
        rows.append({"ranks": world, "path": "transformers-loop" if decode == "generate" else "default",
                     "decode": result.decode,
                     "batching": result.batching, "prompts": len(prompts),
                     "new_tokens": total, "seconds": seconds, "tokens_per_second": total / seconds,
                     "ms_per_token": 1000 * seconds / steps, "runs": runs,
                     "reason": result.decode_reason})
    if is_leader():
        Path(args.worker_out).write_text(json.dumps({"rows": rows, "plan": plan.to_dict()}, default=str))
    if world > 1:
        finish()


# ------------------------------------------------------------------------------------------------- orchestrator

def versions() -> dict[str, str]:
    import hwenv

    names = ("torch", "transformers", "accelerate", "hwrun", "hwdist", "hwenv")
    return {name: hwenv.installed_version(name) or "?" for name in names} | {"python": platform.python_version()}


def rank_counts(accel, requested: str, heads: int, kv: int) -> list[int]:
    """The rank counts to run: `requested` (e.g. "1,2") or every one of 1/2/4/8 this machine has devices (cores on
    the host) for and that divides the heads."""
    from hwdist.launch import usable_cores

    have = accel.count if accel.platform.is_accelerator else usable_cores()
    wanted = [int(x) for x in requested.split(",")] if requested != "auto" else [n for n in RANKS if n <= have]
    return [n for n in wanted if heads % n == 0 and kv % n == 0]


def launch(script_args: list[str], nproc: int, kind: str, module: bool = False, script: str = __file__,
           timeout: float = 900, stream_lines=None) -> tuple[int, str, str]:
    """Run `script script_args` as `nproc` ranks through hwdist's launcher (torchrun --standalone), no shell."""
    import hwdist
    import hwenv
    from hwdist.launch import child_environment

    plan = hwdist.plan_launch(script, script_args, nproc_per_node=nproc, kind=kind, torchrun_args=["--standalone"],
                              module=module)
    env = child_environment(plan.env, selection=plan.selection)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env = with_sources(env)
    if not hwenv.get_platform(kind).is_accelerator and "OMP_NUM_THREADS" not in os.environ:
        from hwdist.launch import usable_cores

        env["OMP_NUM_THREADS"] = str(max(1, (usable_cores() - 1) // nproc))  # one core left to the host, the rest shared
    if stream_lines is None:
        done = subprocess.run(plan.argv, env=env, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    process = subprocess.Popen(plan.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    for line in process.stdout:
        out.append(line)
        stream_lines(line, time.perf_counter())
        if time.monotonic() > deadline:
            process.kill()
            break
    err = process.stderr.read() if process.stderr else ""
    return process.wait(timeout=60), "".join(out), err


def decode_rows(args, accel, ranks: list[int]) -> list[dict]:
    rows = []
    for n in ranks:
        out = Path(args.out) / f"decode-{n}.json"
        worker = ["--worker", "decode", "--worker-out", str(out), "--model", str(args.model), "--device",
                  args.device, "--dtype", args.dtype, "--prompts", str(args.prompts), "--prompt-tokens",
                  str(args.prompt_tokens), "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
        code, _stdout, stderr = launch(worker, n, accel.kind)
        if code != 0:
            rows.append({"ranks": n, "error": error_lines(stderr)})
            print(f"decode at {n} rank(s) failed:\n{error_lines(stderr)}", file=sys.stderr)
            continue
        for row in json.loads(out.read_text())["rows"]:
            rows.append(row)
            print(f"decode  ranks={n} {row['path']:>17} ({row['decode']}, {row['batching']}): "
                  f"{row['tokens_per_second']:9.1f} tokens/s, "
                  f"{row['ms_per_token']:7.2f} ms/token ({row['prompts']} prompts)", flush=True)
    return rows


def error_lines(stderr: str) -> str:
    """The ranks' own one-line errors (`hwrun: error: ...`) where there are some, else the end of stderr."""
    lines = [line for line in stderr.splitlines() if ": error:" in line or "Error:" in line]
    return "\n".join(lines[-5:]) if lines else stderr[-2000:]


def fsdp_available(accel, sharding: str = "fsdp") -> tuple[bool, str]:
    if sharding == "ddp":  # data parallel: every device kind, the CPU too (the smoke run of this part)
        return True, ""
    if not accel.platform.is_accelerator:
        return False, ("FSDP training runs on accelerators only (hwrun train --fsdp refuses a CPU plan: Accelerate "
                       "builds FSDP only for GPU/XPU/HPU process groups): the training part is skipped")
    done = subprocess.run([sys.executable, "-m", "hwrun.cli", "train", "--help"], capture_output=True, text=True,
                          timeout=120, env=with_sources(dict(os.environ)))
    if "--fsdp" in done.stdout:
        return True, ""
    return False, "hwrun train has no --fsdp flag in this checkout (issue 37.2 adds it): the training part is skipped"


def train_rows(args, accel, ranks: list[int]) -> list[dict]:
    data = Path(args.out) / "train.txt"
    if not data.exists():
        words = ("the king said unto them that the people of the land went up to the city and dwelt there "
                 "for many days and the lord spake").split()
        import random

        rng = random.Random(0)
        data.write_text("\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(args.train_lines)))
    rows = []
    base = None
    for n in ranks:
        output = Path(args.out) / f"train-{n}"
        arrivals: list[tuple[int, float]] = []

        def on_line(line: str, now: float, arrivals=arrivals) -> None:
            found = STEP_LINE.match(line.strip())
            if found:
                arrivals.append((int(found.group(1)), now))

        command = ["train", *(["--fsdp"] if args.train_sharding == "fsdp" else []), "--model", str(args.model), "--data", str(data), "--output", str(output),
                   "--max-steps", str(args.train_steps), "--batch-size", str(args.train_batch), "--block-size",
                   str(args.train_block), "--save-steps", str(10 * args.train_steps), "--device", args.device,
                   "--no-progress", "--no-compile", "--lr", "1e-5", *(["--lora"] if args.train_mode == "lora" else [])]
        code, stdout, stderr = launch(command, n, accel.kind, module=True, script="hwrun.cli",
                                      stream_lines=on_line)
        steady = [(s, t) for s, t in arrivals if s > args.train_warmup]
        if code != 0 or len(steady) < 2:
            rows.append({"ranks": n, "error": error_lines(stderr + stdout)})
            print(f"fsdp training at {n} rank(s) failed:\n{error_lines(stderr + stdout)}", file=sys.stderr)
            continue
        seconds = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
        tokens = args.train_batch * args.train_block * n
        row = {"ranks": n, "mode": args.train_mode, "sharding": args.train_sharding, "seconds_per_step": seconds, "tokens_per_step": tokens, "tokens_per_second": tokens / seconds,
               "steps_timed": steady[-1][0] - steady[0][0]}
        base = row["tokens_per_second"] if n == 1 else base
        row["scaling_efficiency"] = None if base is None else row["tokens_per_second"] / (n * base)
        rows.append(row)
        print(f"{args.train_sharding:<7} ranks={n}: {row['tokens_per_second']:9.1f} tokens/s, {seconds * 1000:8.1f} ms/step"
              + (f", efficiency {row['scaling_efficiency']:.2f}" if row["scaling_efficiency"] is not None else ""),
              flush=True)
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for kind, label in (("default", "hwrun's engine"), ("transformers-loop", "Transformers' generate")):
        decode = [r for r in result["decode"] if "error" not in r and r["path"] == kind]
        if decode:
            xs = [r["ranks"] for r in decode]
            axes[0].plot(xs, [r["tokens_per_second"] for r in decode], "o-", label=f"TP decode ({label})")
            axes[1].plot(xs, [r["ms_per_token"] for r in decode], "o-", label=f"TP decode ({label})")
    axes[0].set(title="decode tokens/s", xlabel="ranks (tensor parallel)", xscale="log", xticks=list(RANKS))
    axes[1].set(title="time per token (ms)", xlabel="ranks (tensor parallel)", xscale="log", xticks=list(RANKS))
    train = result["train"] if isinstance(result["train"], list) else []
    good = [r for r in train if "error" not in r]
    if good:
        sharding = good[0].get("sharding", "fsdp").upper()
        axes[2].plot([r["ranks"] for r in good], [r["tokens_per_second"] for r in good], "o-",
                     label=f"{sharding} tokens/s ({good[0].get('mode', 'lora')})")
        twin = axes[2].twinx()
        eff = [r for r in good if r.get("scaling_efficiency") is not None]
        twin.plot([r["ranks"] for r in eff], [r["scaling_efficiency"] for r in eff], "s--", color="C1",
                  label="efficiency")
        twin.set(ylim=(0, max([1.2] + [1.1 * r["scaling_efficiency"] for r in eff])), ylabel="scaling efficiency")
        twin.legend(loc="lower right", fontsize=8)
    else:
        import textwrap

        axes[2].text(0.5, 0.5, textwrap.fill(result.get("train_skipped") or "no training rows", 48), ha="center",
                     va="center", transform=axes[2].transAxes, fontsize=8)
    name = (good[0].get("sharding", "fsdp") if good else "fsdp").upper()
    axes[2].set(title=f"{name} training tokens/s", xlabel=f"ranks ({name})", xscale="log", xticks=list(RANKS))
    for ax in axes:
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    params = result["model"]["parameters"] or 0
    size = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
    fig.suptitle(f"{result['device']['name']} - {size}-parameter random Llama, {result['dtype']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="scale-out")
    parser.add_argument("--smoke", action="store_true", help="tiny model and counts (CPU ok)")
    parser.add_argument("--ranks", default="auto", help="rank counts, e.g. 1,2,4 (default: 1/2/4/8 as the machine has)")
    parser.add_argument("--model", default=None, help="a model folder (default: a random Llama written to OUT/model)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per decode batch (default 1; smoke 2)")
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--train-steps", type=int, default=None)
    parser.add_argument("--train-warmup", type=int, default=2, help="steps left out of the training rate")
    parser.add_argument("--train-batch", type=int, default=None)
    parser.add_argument("--train-block", type=int, default=None)
    parser.add_argument("--train-mode", choices=("lora", "full"), default="lora",
                        help="lora (default: FSDP shards the frozen base, only the adapter is saved, so the run stays "
                             "short) or full (every weight trains; the gathered model is saved at the end)")
    parser.add_argument("--train-sharding", choices=("fsdp", "ddp"), default="fsdp",
                        help="fsdp (default: hwrun train --fsdp) or ddp (plain data parallel; runs on CPU too)")
    parser.add_argument("--train-lines", type=int, default=1000, help="lines of generated text (the steps loop over it)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    smoke = args.smoke
    defaults = dict(prompts=(2, 1), prompt_tokens=(16, 64), new_tokens=(16, 128), train_steps=(6, 12),
                    train_batch=(2, 4), train_block=(64, 512))
    for name, (small, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if smoke else full)
    if args.worker == "decode":
        decode_worker(args)
        return 0

    import hwenv

    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accel = hwenv.detect() if args.device == "auto" else None
    if accel is None:
        import hwrun

        accel = hwrun.plan(device=args.device).accelerator
    import torch
    from decode import FULL, SMOKE, build_model

    sizes = SMOKE if smoke else FULL
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if accel.bf16 and accel.platform.is_accelerator
                                                     else "float32")
    args.dtype = dtype
    if args.model is None:
        args.model = out / "model"
        if not (args.model / "config.json").exists():
            t = time.perf_counter()
            # built on the device (seconds for ~1.2B parameters), saved as safetensors with hwrun.testing's tokenizer
            from hwrun.testing import build_tokenizer

            build_model(sizes, accel.device, getattr(torch, dtype)).save_pretrained(args.model, safe_serialization=True)
            build_tokenizer().save_pretrained(args.model)
            print(f"random Llama written to {args.model} in {time.perf_counter() - t:.1f}s", flush=True)
    config = json.loads((Path(args.model) / "config.json").read_text())
    from hwrun.model.source import config_parameters

    ranks = rank_counts(accel, args.ranks, config["num_attention_heads"], config.get("num_key_value_heads")
                        or config["num_attention_heads"])
    result = {"command": [sys.executable, *sys.argv], "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "device": {"kind": accel.kind, "count": accel.count, "name": accel.name, "names": list(accel.names)},
              "host": {"cores": os.cpu_count(), "machine": platform.machine()}, "versions": versions(),
              "model": {"path": str(args.model), "parameters": config_parameters(config), "sizes": sizes},
              "dtype": dtype, "ranks": ranks, "settings": {k: v for k, v in vars(args).items()
                                                           if k not in ("worker", "worker_out", "model")},
              "decode": [], "train": []}
    stamp(result, libraries=("hwdist",))  # UTC date, device_info, env, git beside its own keys
    path = out / "scale.json"

    def save() -> None:
        result["seconds"] = time.time() - started
        path.write_text(json.dumps(result, indent=2, default=str))

    result["decode"] = decode_rows(args, accel, ranks)
    save()
    if args.skip_train:
        result["train"], result["train_skipped"] = [], "--skip-train"
    else:
        available, why = fsdp_available(accel, args.train_sharding)
        if available:
            result["train"] = train_rows(args, accel, ranks)
        else:
            result["train"], result["train_skipped"] = [], why
            print(why, flush=True)
    save()
    plot(result, out / "scale.png")
    print(f"wrote {path} and {out / 'scale.png'} in {result['seconds']:.0f}s")
    failed = [r for r in result["decode"] + result["train"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
