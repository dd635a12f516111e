"""The launcher variables: single process when absent, clear errors when inconsistent."""

from __future__ import annotations

import pytest
from hwdist import DistEnvError, LaunchEnv, read_launch_env

FULL = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_no_variables_is_one_process():
    assert read_launch_env({}) == LaunchEnv()
    assert read_launch_env({}).launched is False


def test_torchrun_variables_are_read():
    env = read_launch_env(FULL)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.launched) == ("10.0.0.1", 29500, True)


def test_local_world_size_defaults_to_world_size():
    env = read_launch_env({k: v for k, v in FULL.items() if k != "LOCAL_WORLD_SIZE"})
    assert env.local_world_size == 4


@pytest.mark.parametrize("changes, message", [
    ({"RANK": "4"}, r"RANK=4 is not below WORLD_SIZE=4"),
    ({"RANK": "-1"}, r"RANK='-1' must be >= 0"),
    ({"RANK": "one"}, r"RANK='one' is not an integer"),
    ({"WORLD_SIZE": "0"}, r"WORLD_SIZE='0' must be >= 1"),
    ({"RANK": None}, r"RANK is not set but WORLD_SIZE is"),
    ({"WORLD_SIZE": None}, r"WORLD_SIZE is not set but RANK is"),
    ({"LOCAL_RANK": None}, r"LOCAL_RANK is not set"),
    ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
    ({"LOCAL_WORLD_SIZE": "8"}, r"LOCAL_WORLD_SIZE=8 exceeds WORLD_SIZE=4"),
    ({"MASTER_ADDR": None}, r"MASTER_ADDR not set for WORLD_SIZE=4"),
    ({"MASTER_PORT": None, "MASTER_ADDR": None}, r"MASTER_ADDR and MASTER_PORT not set"),
    ({"MASTER_PORT": "70000"}, r"MASTER_PORT=70000 is not a TCP port"),
])
def test_inconsistent_variables_are_clear_errors(changes, message):
    env = dict(FULL)
    for key, value in changes.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    with pytest.raises(DistEnvError, match=message) as info:
        read_launch_env(env)
    assert "hwdist launch" in str(info.value)  # every message says how to fix it


def test_stray_local_rank_without_rank_is_an_error():
    with pytest.raises(DistEnvError, match="LOCAL_RANK is set but RANK and WORLD_SIZE are not"):
        read_launch_env({"LOCAL_RANK": "0"})


def test_world_size_one_needs_no_master():
    env = read_launch_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert env.launched and env.world_size == 1 and env.local_rank == 0
