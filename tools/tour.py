"""Run the README's "5-minute tour" for real and write what it printed into README.md (issue 40 point 4).

Every output block of the tour lies between `<!-- tour:NAME -->` and `<!-- /tour:NAME -->` in README.md and is
written only by this script: the commands as typed (`$ uv run ...`), what they printed (stdout and stderr in the
order they came), and a caption with the wall time and the load average when each command started. The
`machine` block says where and when the tour ran (date, processor, cores, memory, OS, Python). The text between
the blocks is prose and is edited by hand. The loss curve of the tour's training run is copied to
docs/tour/loss.png, which the tour shows.

The commands run in a scratch folder (so `--output ft` writes nowhere in the checkout) holding a link to
`packages/`, with `UV_PROJECT` pointing at this workspace, so each command line is exactly the README's.
`UV_NO_SYNC=1` is set unless `--sync` is given: in a shared checkout the tour should not re-sync the
environment; on a fresh clone `--sync` runs `uv run` as a new user does. The environment is otherwise the
caller's (OMP_NUM_THREADS, if set, is named in the caption: it changes hwrun's thread choice).

Two outputs are shortened, each saying so in its caption: `hwrun train` prints the plan table first (the tour
shows it one step earlier) and a loss line per step (steps 1, 2, every tenth and the last are kept).

    uv run python tools/tour.py              # run the tour, rewrite README.md's blocks and docs/tour/loss.png
    uv run python tools/tour.py --print      # run it and print the blocks instead of writing anything
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LOSS_FIGURE = Path("docs/tour/loss.png")  # relative to the repository root (and to README.md)
DATA = "packages/hwrun/src/hwrun/models/tiny-llama/sample_train.txt"
#: A command may not run longer than this (seconds); the tour stops with its output so far.
TIMEOUT = 900


@dataclass(frozen=True)
class Step:
    """One block of the tour: its marker name and the commands it runs, in order."""

    name: str
    commands: tuple[str, ...]
    language: str = "console"


STEPS: tuple[Step, ...] = (
    Step("doctor", ("uv run hwenv doctor",)),
    Step("plan", ("uv run hwrun plan",)),
    Step("generate", ('uv run hwrun generate "The king said" --max-new-tokens 30',)),
    Step("train", (f"uv run hwrun train --data {DATA} --lora --max-steps 30 --lr 3e-3 --output ft",
                   'uv run hwrun generate --model ft "Once upon a time" --max-new-tokens 25')),
    Step("launch", ("uv run hwdist launch --kind xpu --devices 0,2 --dry-run train.py --lora",)),
)


@dataclass
class Ran:
    """One command's output and how long it took."""

    command: str
    output: str
    seconds: float
    load: float
    returncode: int
    notes: list[str] = field(default_factory=list)


def machine() -> str:
    """Date, processor, cores, memory, OS and Python of this machine, in one line."""
    model = "unknown processor"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor() or model
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = ""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * size / 2**30:.0f} GiB memory"
    except (ValueError, OSError, AttributeError):
        pass
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    return (f"{date}, {model}, {cores} cores{memory}, {platform.system()} {platform.release()} "
            f"{platform.machine()}, Python {platform.python_version()}")


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def run(command: str, cwd: Path, env: dict[str, str]) -> Ran:
    """Run one tour command (no shell), stdout and stderr merged in the order they were written."""
    load = load_average()
    start = time.perf_counter()
    try:
        done = subprocess.run(shlex.split(command), cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT, check=False)
        output, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        output = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        output, code = output + f"\n(stopped after {TIMEOUT} s)", 124
    return Ran(command, output.rstrip("\n"), time.perf_counter() - start, load, code)


#: A row of the plan table: a field name (lower case, maybe "(...)") then two or more spaces.
PLAN_ROW = re.compile(r"^[a-z_]+( [a-z_]+)*( \([^)]*\))?\s{2,}\S")


def shorten_train(ran: Ran, keep_every: int = 10) -> Ran:
    """`hwrun train`'s output without the plan table it prints first, and with the loss lines of steps 1, 2,
    every `keep_every`-th and the last (the others replaced by one `...` line); the caption says so."""
    lines = ran.output.splitlines()
    first = 0
    if len(lines) > 1 and lines[0].startswith("field ") and set(lines[1]) <= {"-", " "}:
        first = 2
        while first < len(lines) and PLAN_ROW.match(lines[first]):
            first += 1
    steps = [int(m.group(1)) for line in lines if (m := re.match(r"step (\d+)/", line))]
    last = max(steps) if steps else 0
    kept, left_out, elided = [], [], False
    for line in lines[first:]:
        match = re.match(r"step (\d+)/", line)
        step = int(match.group(1)) if match else None
        if step is None or step in (1, 2, last) or step % keep_every == 0:
            kept.append(line)
            elided = False
        else:
            left_out.append(step)
            if not elided:
                kept.append("...")
                elided = True
    notes = ["the plan table it prints first is left out (step 2 shows it)"] if first else []
    if left_out:
        notes.append(f"{len(left_out)} of its {len(steps)} loss lines are left out (`...`)")
    return Ran(ran.command, "\n".join(kept), ran.seconds, ran.load, ran.returncode, ran.notes + notes)


def render(step: Step, runs: list[Ran], extra: str = "") -> str:
    """The text of one block: the commands and their output, then a caption."""
    body = "\n".join(f"$ {ran.command}\n{ran.output}" for ran in runs)
    timing = "; ".join(f"`{ran.command.split(' --', 1)[0]}` {ran.seconds:.1f} s wall (load average {ran.load:.2f} "
                       "at its start)" if len(runs) > 1 else
                       f"{ran.seconds:.1f} s wall, load average {ran.load:.2f} at its start" for ran in runs)
    notes = [note for ran in runs for note in ran.notes]
    caption = f"<sub>Run by `tools/tour.py`: {timing}" + (f"; {'; '.join(notes)}" if notes else "") + ".</sub>"
    return f"```{step.language}\n{body}\n```\n{extra}{caption}"


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with the part between `<!-- tour:NAME -->` and `<!-- /tour:NAME -->` replaced by `content`."""
    pattern = re.compile(rf"(<!-- tour:{re.escape(name)} -->\n).*?(\n<!-- /tour:{re.escape(name)} -->)", re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"tools/tour.py: README.md needs exactly one <!-- tour:{name} --> ... "
                         f"<!-- /tour:{name} --> pair")
    return pattern.sub(lambda m: m.group(1) + content + m.group(2), text)


def scratch(workdir: Path) -> None:
    """The folder the commands run in: `packages` links to this checkout's, nothing else."""
    (workdir / "packages").symlink_to(ROOT / "packages", target_is_directory=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--sync", action="store_true", help="let `uv run` sync the environment (a fresh clone)")
    parser.add_argument("--print", dest="print_only", action="store_true",
                        help="print the blocks; write neither README.md nor the figure")
    args = parser.parse_args(argv)

    env = dict(os.environ, UV_PROJECT=str(ROOT), PYTHONUNBUFFERED="1")
    if not args.sync:
        env["UV_NO_SYNC"] = "1"
    blocks = {"machine": f"Ran on {machine()}" + (f"; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} was set"
                                                   if os.environ.get("OMP_NUM_THREADS") else "") + "."}
    total = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hwstack-tour-") as folder:
        workdir = Path(folder)
        scratch(workdir)
        for step in STEPS:
            runs = []
            for command in step.commands:
                print(f"tour: {command}", file=sys.stderr, flush=True)
                ran = run(command, workdir, env)
                if ran.returncode != 0:
                    print(ran.output, file=sys.stderr)
                    raise SystemExit(f"tools/tour.py: `{command}` exited {ran.returncode}; README.md left as it was")
                runs.append(shorten_train(ran) if " hwrun train " in f" {command} " else ran)
            extra = ""
            if step.name == "train" and (workdir / "ft" / "loss.png").is_file():
                if not args.print_only:
                    target = ROOT / LOSS_FIGURE
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(workdir / "ft" / "loss.png", target)
                extra = f"![loss curve of this run (ft/loss.png)]({LOSS_FIGURE.as_posix()})\n\n"
            blocks[step.name] = render(step, runs, extra)
    seconds = time.perf_counter() - total
    blocks["machine"] = blocks["machine"][:-1] + f"; the whole tour took {seconds:.0f} s."
    if args.print_only:
        for name, content in blocks.items():
            print(f"<!-- tour:{name} -->\n{content}\n<!-- /tour:{name} -->\n")
        return 0
    text = args.readme.read_text(encoding="utf-8")
    for name, content in blocks.items():
        text = replace_block(text, name, content)
    args.readme.write_text(text, encoding="utf-8")
    print(f"tools/tour.py: {len(blocks)} blocks of {args.readme} rewritten ({seconds:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
