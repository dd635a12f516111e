"""Wall time of the command lines' start-up (issue 40 point 3), this tree beside an older one, with the load.

Each command runs as a user types it (`uv run --no-sync hwrun plan`, ...), interleaved with the same command of
the older tree (`git archive COMMIT packages | tar -x -C DIR`, imported first through PYTHONPATH), N times
each (default 3); every run records its wall time and the 1-minute load average when it started, since on a
shared 2-core machine the load moves the figures more than anything else. `python -X importtime` of `hwrun plan`
and `hwenv doctor` (once per tree) gives what the imports cost: the sum over top-level imports and the
cumulative time of the heavy modules.

    git archive c1cc4ca packages | tar -x -C /tmp/before
    uv run python tools/bench/startup.py --before /tmp/before --before-label c1cc4ca --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

COMMANDS: dict[str, list[str]] = {
    "hwrun plan": ["hwrun", "plan"],
    "hwenv doctor": ["hwenv", "doctor"],
    "hwrun --help": ["hwrun", "--help"],
    "hwrun plan --help": ["hwrun", "plan", "--help"],
    "hwrun generate --help": ["hwrun", "generate", "--help"],
    "hwrun train --help": ["hwrun", "train", "--help"],
    "hwrun serve --help": ["hwrun", "serve", "--help"],
    "hwrun chat --help": ["hwrun", "chat", "--help"],
    "hwenv doctor --help": ["hwenv", "doctor", "--help"],
    "hwdist --help": ["hwdist", "--help"],
}
#: Commands whose imports are broken down with `python -X importtime` (module form of the same command).
IMPORTTIME = {"hwrun plan": ["-m", "hwrun.cli", "plan"], "hwenv doctor": ["-c", "import sys; from hwenv.cli import "
                                                                       "main; sys.exit(main(['doctor']))"]}
HEAVY = ("torch", "transformers", "transformers.modeling_utils", "peft", "accelerate", "deepspeed", "hwattn", "hwrun")
PACKAGES = ("hwenv", "hwattn", "hwcompile", "hwdist", "hwrun")


def tree_env(tree: Path | None) -> dict[str, str]:
    """The environment that runs `tree`'s packages (None: this checkout, as installed)."""
    env = dict(os.environ)
    if tree is not None:
        folders = [str(tree / "packages" / p / "src") for p in PACKAGES]
        env["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def timed(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(["uv", "run", "--no-sync", *argv], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return {"seconds": round(seconds, 3), "load": round(load, 2)}


def import_costs(args: list[str], env: dict[str, str]) -> dict[str, float]:
    """ms: all top-level imports together, and each HEAVY module's cumulative time (0 when not imported)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    total, heavy, top = 0, dict.fromkeys(HEAVY, 0.0), dict.fromkeys(HEAVY, 0)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if not cumulative.strip().isdigit():
            continue
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        module = name.strip()
        if depth == 0:
            total += int(cumulative)
            for package in HEAVY:  # a package imported from inside a function may show only its submodules at
                if module.startswith(package + "."):  # depth 0 (torch from hwenv's probes): their sum stands in
                    top[package] += int(cumulative)
        if module in heavy and heavy[module] == 0:
            heavy[module] = round(int(cumulative) / 1e3, 1)
    for package in HEAVY:
        heavy[package] = heavy[package] or round(top[package] / 1e3, 1)
    return {"imports_total_ms": round(total / 1e3, 1), **{f"{m}_ms": v for m, v in heavy.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an older tree's root (git archive COMMIT packages | tar -x)")
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="folder for import_time.commands.json")
    parser.add_argument("--imports-only", action="store_true", help="only the -X importtime breakdown")
    args = parser.parse_args(argv)
    trees = {"after": None, **({args.before_label: args.before.resolve()} if args.before else {})}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {name: {t: [] for t in trees} for name in COMMANDS}
    for _ in range(0 if args.imports_only else args.repeats):
        for name, command in COMMANDS.items():
            for label, tree in trees.items():
                runs[name][label].append(timed(command, tree_env(tree)))
                print(f"{name} ({label}): {runs[name][label][-1]}", file=sys.stderr, flush=True)
    imports = {name: {label: import_costs(a, tree_env(tree)) for label, tree in trees.items()}
               for name, a in IMPORTTIME.items()}
    result = {"machine": f"{platform.processor() or platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}",
              "runs": runs, "imports": imports}
    stamp(result, argv, libraries=("hwenv", "hwdist"), accelerator=False)  # start-up runs on the host CPU
    lines = ["| command | tree | runs: s (load) | median s |", "|---|---|---|---:|"]
    for name, by_tree in runs.items():
        for label, samples in by_tree.items():
            if not samples:
                continue
            cells = ", ".join(f"{s['seconds']:.2f} ({s['load']:.1f})" for s in samples)
            lines.append(f"| `{name}` | {label} | {cells} | {statistics.median(s['seconds'] for s in samples):.2f} |")
    print("\n".join(lines))
    for name, by_tree in imports.items():
        for label, costs in by_tree.items():
            print(f"{name} ({label}) importtime: {costs}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "import_time.commands.json"
        if args.imports_only and path.is_file():  # keep the wall times measured before, replace the breakdown
            result = {**json.loads(path.read_text()), "imports": imports, "imports_date": result["date"],
                      "imports_command": result["command"]}
        path.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
