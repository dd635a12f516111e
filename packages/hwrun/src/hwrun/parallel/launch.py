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
    return RankLaunch(list(launch.argv), changes, full, reason)


def run_ranks(launch: RankLaunch, what: str = "hwrun") -> int:
    """Run the ranks and return torchrun's exit status; SIGTERM here is passed on to torchrun (it stops its ranks),
    Ctrl-C reaches every process of the terminal's group by itself."""
    logger.info("starting %s", launch.reason)
    logger.info("command: %s", launch.command())
    process = subprocess.Popen(launch.argv, env=launch.env)

    def forward(signum: int, _frame: Any) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:  # torchrun got the same SIGINT from the terminal; let it stop its ranks
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != 0:
        print(f"{what}: the ranks stopped with exit status {code} (each rank's own error is above)", file=sys.stderr)
    return code
