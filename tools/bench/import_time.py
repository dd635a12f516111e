"""Import and start-up cost of hwenv beside bare Python, measured side by side in one run.

Each command runs as a fresh process, interleaved, N times (default 15); the report gives the
median wall time of each and the difference over `python -c pass` (issue goal: `import hwenv`
<= 15 ms over bare Python; `hwenv --help` imports no torch).

    uv run python tools/bench/import_time.py --out docs/benchmarks \
        --compare-src /tmp/old/packages/hwenv/src --compare-label "0.1.0"   # git archive of the old tree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import hwenv": [sys.executable, "-c", "import hwenv"],
    "hwenv.get_platform('xpu')": [sys.executable, "-c",
                                  "import sys, hwenv; hwenv.get_platform('xpu'); assert 'torch' not in sys.modules"],
    "hwenv --help": [sys.executable, "-m", "hwenv.cli", "--help"],
}


def _time(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def _env_for(name: str) -> dict[str, str] | None:
    """The older hwenv (--compare-src) is imported from its own src folder, ahead of the installed one."""
    if not name.startswith("import hwenv (") or COMPARE_SRC is None:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join([COMPARE_SRC, os.environ.get("PYTHONPATH", "")])}


COMPARE_SRC: str | None = None


def measure(repeats: int) -> dict[str, list[float]]:
    """Interleaved wall times (seconds) of every command, `repeats` runs each."""
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for name, argv in COMMANDS.items():  # one warm-up each (page cache, .pyc)
        _time(argv, _env_for(name))
    for _ in range(repeats):
        for name, argv in COMMANDS.items():
            samples[name].append(_time(argv, _env_for(name)))
    return samples


def report(samples: dict[str, list[float]]) -> dict:
    """Medians in ms and the cost over bare Python."""
    base = statistics.median(samples["python -c pass"]) * 1e3
    rows = {}
    for name, values in samples.items():
        median = statistics.median(values) * 1e3
        rows[name] = {"median_ms": round(median, 2), "min_ms": round(min(values) * 1e3, 2),
                      "max_ms": round(max(values) * 1e3, 2), "over_bare_ms": round(median - base, 2)}
    return {"python": sys.version.split()[0], "repeats": len(samples["python -c pass"]), "rows": rows}


def plot(result: dict, path: Path) -> None:
    """A bar chart of the medians."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["rows"])
    medians = [result["rows"][n]["median_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(names, medians, color=["#999"] + ["#2a6"] * (len(names) - 1))
    ax.set_xlabel(f"wall time, ms (median of {result['repeats']} interleaved runs)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, help="folder for import_time.{json,md,png}")
    parser.add_argument("--compare-src", help="an older hwenv's src folder, timed beside (e.g. from git archive)")
    parser.add_argument("--compare-label", default="older", help="its name in the table")
    args = parser.parse_args(argv)
    global COMPARE_SRC
    if args.compare_src:
        COMPARE_SRC = str(Path(args.compare_src).resolve())
        COMMANDS[f"import hwenv ({args.compare_label})"] = [sys.executable, "-c", "import hwenv"]
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be >= 1")
    result = report(measure(args.repeats))
    lines = ["| command | median ms | min | max | over `python -c pass` |", "|---|---:|---:|---:|---:|"]
    for name, row in result["rows"].items():
        lines.append(f"| `{name}` | {row['median_ms']} | {row['min_ms']} | {row['max_ms']} | {row['over_bare_ms']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "import_time.json").write_text(json.dumps(result, indent=2) + "\n")
        plot(result, args.out / "import_time.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
