"""Start the `tp` ranks of an hwrun command, as vLLM's `--tensor-parallel-size` does: the same command again in `tp`
processes, one per device, through `hwdist launch` (torchrun underneath, `--standalone`: a free local port), no shell.

The parent has already planned (every check ran before anything starts); each rank plans again on its own device,
loads its shards and runs the same steps. The parent forwards SIGTERM to torchrun (which stops its ranks) and returns
torchrun's exit status.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TensorParallelError
from .ranks import RANK_MARK

logger = logging.getLogger(__name__)

#: The module every rank runs: hwrun's own command line.
CLI_MODULE = "hwrun.cli"
#: torchrun's entry point as the ranks' launcher runs it (`hwrun.parallel.torchrun`: the same main, quieter).
TORCHRUN_MODULE = "hwrun.parallel.torchrun"
#: Variable holding the pid of the `hwrun` command that started the ranks (they exit if it is gone).
PARENT_MARK = "HWRUN_TP_LAUNCHER"


@dataclass(frozen=True)
class RankLaunch:
    """The torchrun command (no shell), the variables the ranks get on top of this environment, and why."""

    argv: list[str]
    env_changes: dict[str, str]
    env: dict[str, str]
    reason: str

    def command(self) -> str:
        """The command as one line (for logs and --dry-run style output)."""
        import shlex

        changes = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_changes.items()))
        return f"{changes + ' ' if changes else ''}{shlex.join(self.argv)}"


def threads_per_rank(plan: Any, cores: int | None = None) -> str:
    """OMP_NUM_THREADS for each rank: the host's cores shared by the ranks on the host, 1 on an accelerator (the ranks'
    host work is launching kernels). An exported value wins."""
    if plan.accelerator.platform.is_accelerator:
        return "1"
    from hwdist.launch import usable_cores

    return str(max(1, (cores or usable_cores()) // plan.tp))


def rank_launch(plan: Any, argv: Sequence[str], environ: Any = None) -> RankLaunch:
    """The launch of `hwrun ARGV` as `plan.tp` ranks on the plan's devices (hwdist's `plan_launch`: the selection's
    variables for the ranks only, one process per selected device, Gaudi's groups checked)."""
    import hwdist
    from hwdist.launch import child_environment

    if plan.parallel is None:
        raise TensorParallelError("rank_launch needs a plan made with tp > 1.")
    env = dict(os.environ if environ is None else environ)
    try:
        launch = hwdist.plan_launch(CLI_MODULE, list(argv), nproc_per_node=plan.tp, kind=plan.accelerator.kind,
                                    torchrun_args=["--standalone"], module=True)
    except hwdist.HwdistError as error:
        raise TensorParallelError(f"tp={plan.tp}: {error}") from error
    argv = list(launch.argv)
    if argv[1:3] == ["-m", "torch.distributed.run"]:  # torchrun's own main, quiet about what the ranks said
        argv[2] = TORCHRUN_MODULE
    changes = dict(launch.env)
    changes[RANK_MARK] = "1"
    why = "exported" if "OMP_NUM_THREADS" in env else "hwrun's rule: the host's cores shared by the ranks, 1 on an accelerator"
    if "OMP_NUM_THREADS" not in env:  # torchrun would set 1 and warn about it
        changes["OMP_NUM_THREADS"] = threads_per_rank(plan)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # torchrun sets its own; stale ones from an outer job would confuse it
    full = child_environment(changes, env, selection=launch.selection)
    reason = (f"{plan.tp} ranks through torchrun --standalone (hwdist launch), OMP_NUM_THREADS="
              f"{full.get('OMP_NUM_THREADS')} ({why}); {plan.parallel.processes}")
    return RankLaunch(argv, changes, full, reason)


def run_ranks(launch: RankLaunch, what: str = "hwrun", *, drain_leader: bool = False) -> int:
    """Run the ranks (torchrun in a session of its own) and return torchrun's exit status. SIGTERM or Ctrl-C here
    stops them: with `drain_leader` (a server) only rank 0 gets SIGTERM, so it drains its requests and then ends the
    others' engine loops (every rank exits 0); otherwise torchrun gets it and stops every rank."""
    logger.info("starting %s", launch.reason)
    logger.info("command: %s", launch.command())
    env = dict(launch.env, **{PARENT_MARK: str(os.getpid())})
    process = subprocess.Popen(launch.argv, env=env, start_new_session=True)

    def stop(signum: int, _frame: Any) -> None:
        if process.poll() is not None:
            return
        target = rank_zero_pid(process.pid) if drain_leader else None
        logger.info("signal %d: SIGTERM to %s", signum, f"rank 0 (pid {target})" if target else "torchrun")
        os.kill(target or process.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code > 2:  # 1 and 2: a rank said why in one line; beyond that a rank was killed or crashed
        print(f"{what}: the ranks stopped with exit status {code}", file=sys.stderr)
    return code


def rank_zero_pid(torchrun_pid: int) -> int | None:
    """The pid of torchrun's rank-0 worker (its child whose RANK is 0), read from /proc; None where it cannot be read."""
    from pathlib import Path

    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != torchrun_pid:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if b"RANK=0" in environ:
            return int(stat.parent.name)
    return None


def exit_with_launcher(environ: Any = None) -> None:
    """In a rank hwrun started: end this process if the `hwrun` command that started the ranks is gone (killed: it can
    no longer stop them), so no rank outlives it."""
    import threading
    import time

    env = os.environ if environ is None else environ
    parent = env.get(PARENT_MARK)
    if not parent or not parent.isdigit():
        return

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(int(parent), 0)
            except ProcessLookupError:
                logger.error("the hwrun command that started the ranks (pid %s) is gone: this rank exits", parent)
                os._exit(1)
            except PermissionError:  # pragma: no cover - a pid reused by another user's process
                return

    threading.Thread(target=watch, name="hwrun-tp-launcher-watch", daemon=True).start()
