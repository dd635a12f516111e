"""Import and start-up cost of hwenv, hwdist and hwrun beside bare Python, measured side by side in one run.

Each command runs as a fresh process, interleaved, N times (default 15); the report gives the
median wall time of each and the difference over `python -c pass` (issue 29 goals: `import hwenv`
<= 15 ms over bare Python; `hwenv --help`, `hwdist --help` and `hwrun --help` import no torch and take <= 300 ms).
Every command also asserts, in its own process, that torch was not imported.

    uv run python tools/bench/import_time.py --out docs/benchmarks \
        --compare-tree /tmp/old --compare-label "before"   # git archive COMMIT | tar -x -C /tmp/old
    (--compare-src FOLDER times an older hwenv's src folder alone, as "import hwenv (LABEL)")
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import stamp  # noqa: E402

#: Runs `main(["--help"])` of a CLI module and fails when torch was imported on the way.
_HELP = ("import sys, contextlib, io, {module} as cli\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    try:\n        cli.main(['--help'])\n    except SystemExit:\n        pass\n"
         "assert 'torch' not in sys.modules")
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import hwenv": [sys.executable, "-c", "import hwenv"],
    "hwenv.get_platform('xpu')": [sys.executable, "-c",
                                  "import sys, hwenv; hwenv.get_platform('xpu'); assert 'torch' not in sys.modules"],
    "hwenv --help": [sys.executable, "-c", _HELP.format(module="hwenv.cli")],
    "import hwdist": [sys.executable, "-c", "import sys, hwdist; assert 'torch' not in sys.modules"],
    "hwdist --help": [sys.executable, "-c", _HELP.format(module="hwdist.cli")],
    "import hwrun": [sys.executable, "-c", "import sys, hwrun; assert 'torch' not in sys.modules"],
    "hwrun --help": [sys.executable, "-c", _HELP.format(module="hwrun.cli.main")],
}


def _time(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def _env_for(name: str) -> dict[str, str] | None:
    """Older trees (--compare-src, --compare-tree) are imported from their own src folders, ahead of the installed."""
    folders = COMPARE_PATHS.get(name)
    if not folders:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*folders, os.environ.get("PYTHONPATH", "")])}


#: Command name -> src folders put first on PYTHONPATH for it (the older trees timed beside).
COMPARE_PATHS: dict[str, list[str]] = {}


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
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1))
    colors = ["#999" if n == "python -c pass" else "#c84" if n.endswith(")") and " (" in n else "#2a6" for n in names]
    ax.barh(names, medians, color=colors)  # grey: bare Python; orange: an older tree timed beside
    ax.set_xlabel(f"wall time, ms (median of {result['repeats']} interleaved runs)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, help="folder for import_time.{json,md,png}")
    parser.add_argument("--compare-src", help="an older hwenv's src folder, timed beside (e.g. from git archive)")
    parser.add_argument("--compare-tree", help="an older checkout's root (git archive COMMIT | tar -x): its hwenv "
                        "and hwdist are timed beside (import hwenv, hwenv --help, hwdist --help)")
    parser.add_argument("--compare-label", default="older", help="its name in the table")
    parser.add_argument("--compare-src-label", help="the --compare-src tree's name (default: --compare-label)")
    args = parser.parse_args(argv)
    if args.compare_src:
        name = f"import hwenv ({args.compare_src_label or args.compare_label})"
        COMMANDS[name] = [sys.executable, "-c", "import hwenv"]
        COMPARE_PATHS[name] = [str(Path(args.compare_src).resolve())]
    if args.compare_tree:
        root = Path(args.compare_tree).resolve()
        folders = [str(root / "packages" / package / "src") for package in ("hwenv", "hwdist")]
        for name in ("import hwenv", "hwenv --help", "hwdist --help"):
            label = f"{name} ({args.compare_label})"
            COMMANDS[label] = COMMANDS[name]
            COMPARE_PATHS[label] = folders
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
        stamp(result, argv, libraries=("hwenv", "hwdist"), accelerator=False)  # the host: imports run on the CPU
        (args.out / "import_time.json").write_text(json.dumps(result, indent=2) + "\n")
        plot(result, args.out / "import_time.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
