"""The variables `torchrun` and `accelerate launch` set for each process, read and checked.

RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun sets all of
them; `torch/distributed/run.py`). With none of RANK / WORLD_SIZE set the run is one process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import DistEnvError

#: `1` turns hwdist's collective checks on for every `init()` that does not say `check=` (off by default: issue 29).
CHECKS_VARIABLE = "HWDIST_CHECKS"
VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_FIX = "launch with `hwdist launch` or `torchrun`, which set them all, or unset them for one process"


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as the launcher described it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launched: bool = False  # False: no launcher variables, a single process


def _integer(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    text = env.get(name)
    if text is None:
        return None
    value = text.strip()
    if not re.fullmatch(r"-?[0-9]+", value):  # ASCII digits: '--5' or a superscript digit would crash int()
        raise DistEnvError(f"{name}={text!r} is not an integer; {_FIX}.")
    number = int(value)
    if number < minimum:
        raise DistEnvError(f"{name}={text!r} must be >= {minimum}; {_FIX}.")
    return number


def read_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read and check the launcher variables; any missing or inconsistent one is a `DistEnvError`."""
    env = os.environ if environ is None else environ
    rank = _integer(env, "RANK", 0)
    world_size = _integer(env, "WORLD_SIZE", 1)
    if rank is None and world_size is None:
        stray = [name for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE") if name in env]
        if stray:
            raise DistEnvError(f"{', '.join(stray)} is set but RANK and WORLD_SIZE are not; {_FIX}.")
        return LaunchEnv()
    if rank is None or world_size is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise DistEnvError(f"{missing} is not set but {'WORLD_SIZE' if rank is None else 'RANK'} is; {_FIX}.")
    if rank >= world_size:
        raise DistEnvError(f"RANK={rank} is not below WORLD_SIZE={world_size}: ranks run 0..{world_size - 1}; {_FIX}.")
    local_rank = _integer(env, "LOCAL_RANK", 0)
    if local_rank is None:
        if world_size > 1:
            raise DistEnvError(f"LOCAL_RANK is not set (RANK={rank}, WORLD_SIZE={world_size}); {_FIX}.")
        local_rank = 0
    local_world_size = _integer(env, "LOCAL_WORLD_SIZE", 1)
    if local_world_size is None:
        local_world_size = world_size  # accelerate < torchrun sets it; assume one node
    if local_world_size > world_size:
        raise DistEnvError(f"LOCAL_WORLD_SIZE={local_world_size} exceeds WORLD_SIZE={world_size}; {_FIX}.")
    if local_rank >= local_world_size:
        raise DistEnvError(
            f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}: local ranks run "
            f"0..{local_world_size - 1}; {_FIX}."
        )
    addr = env.get("MASTER_ADDR")
    port = _integer(env, "MASTER_PORT", 1)
    if world_size > 1:
        missing = [name for name, value in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if not value]
        if missing:
            raise DistEnvError(f"{' and '.join(missing)} not set for WORLD_SIZE={world_size}; {_FIX}.")
    if port is not None and port > 65535:
        raise DistEnvError(f"MASTER_PORT={port} is not a TCP port (1..65535); {_FIX}.")
    return LaunchEnv(rank, world_size, local_rank, local_world_size, addr, port, True)


def read_checks(environ: Mapping[str, str] | None = None) -> bool:
    """`HWDIST_CHECKS` as `init(check=None)` reads it: `1` on, `0` or unset (or empty) off; anything else raises."""
    env = os.environ if environ is None else environ
    value = env.get(CHECKS_VARIABLE, "")
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise DistEnvError(
        f"{CHECKS_VARIABLE}={value!r} is not 0 or 1: it turns hwdist's collective checks on (1) or off (0, or unset). "
        f"Set {CHECKS_VARIABLE}=1 or {CHECKS_VARIABLE}=0, or unset it."
    )
