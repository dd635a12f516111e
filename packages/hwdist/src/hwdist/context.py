"""`init()` / `shutdown()`: one process group per process, from the launcher's variables.

One process with no launcher variables still gets a group (world size 1, an in-memory store,
no port), so every collective takes the same code path at any world size.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import hwenv

from .backend import choose_backend, ensure_available
from .env import LaunchEnv, read_checks, read_launch_env
from .errors import BackendMismatchError, DistEnvError, NotInitializedError
from .gaudi_world import check_gaudi_world
from .rules import BACKENDS, rule_for, serves

logger = logging.getLogger(__name__)

#: torch's own default for NCCL process groups; also used for gloo so both fail alike.
DEFAULT_TIMEOUT = timedelta(minutes=10)
#: Where gloo reduces: host memory (on CPU and MPS, or on any device when backend="gloo" is asked for).
HOST_DEVICE = "cpu"


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job: rank, local rank, world size, bound device and backend."""

    rank: int
    local_rank: int
    world_size: int
    device: str
    backend: str
    local_world_size: int = 1
    timeout: timedelta = DEFAULT_TIMEOUT
    reason: str = ""
    owns_group: bool = True
    launched: bool = False
    modules: tuple[int, ...] | None = field(default=None, compare=False)
    check: bool = False  # validate arguments and exchange a dtype/shape descriptor before each collective
    kind: str = "cpu"  # the hwenv platform kind this process runs on (ROCm: "rocm", device "cuda:N")

    @property
    def device_type(self) -> str:
        """`cuda` (NVIDIA and ROCm), `xpu`, `hpu` or `cpu`: the device type of the tensors this group reduces."""
        return self.device.partition(":")[0]

    @property
    def platform(self) -> hwenv.Platform:
        """The platform of `kind` (its device facts)."""
        return hwenv.get_platform(self.kind)

    @property
    def on_accelerator(self) -> bool:
        """True when the group reduces accelerator tensors (False: host tensors, e.g. gloo on MPS)."""
        platform = self.platform
        return platform.is_accelerator and self.device_type == platform.device_type

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the rank that prints and writes files)."""
        return self.rank == 0

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        shutdown()

    def to_dict(self) -> dict:
        """JSON-ready fields (timeout in seconds)."""
        return {
            "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
            "local_world_size": self.local_world_size, "device": self.device, "backend": self.backend,
            "timeout_s": self.timeout.total_seconds(), "reason": self.reason, "owns_group": self.owns_group,
            "launched": self.launched, "kind": self.kind,
        }


_current: DistContext | None = None


def _as_timedelta(timeout: float | timedelta) -> timedelta:
    value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
    if value.total_seconds() <= 0:
        raise DistEnvError(f"timeout={timeout!r} must be positive (seconds or a timedelta).")
    return value


def _collective_device(platform: hwenv.Platform, backend: str, local_rank: int) -> str:
    """The device whose tensors `backend` reduces in this process: the local rank's device where
    devices are indexed (`xpu:1`, `cuda:1` on NVIDIA and ROCm), the bare type where the stack places
    the process itself (Gaudi: `hpu`, one module per process), host memory where the backend
    does not move the platform's tensors (gloo on MPS)."""
    if not platform.is_accelerator or not serves(backend, platform.device_type):
        return HOST_DEVICE
    return f"{platform.device_type}:{local_rank}" if platform.indexed_device else platform.device_type


def _bind(device: str) -> None:
    """Make `device` this process's current device, through torch.accelerator (device-generic)."""
    if ":" not in device:
        return
    import torch

    kind, index = device.split(":")
    current = torch.accelerator.current_accelerator(check_available=True)
    if current is None or current.type != kind:
        raise DistEnvError(
            f"cannot bind {device}: torch sees {current.type if current else 'no'} accelerator here. "
            f"Install torch's {kind} build, or set HWENV_DEVICE/backend for this machine."
        )
    torch.accelerator.set_device_index(int(index))


def _check_local_rank(launch: LaunchEnv, accel: hwenv.Accelerator) -> None:
    if not accel.platform.selectable or not launch.launched:
        return
    if launch.local_rank >= accel.count:
        variable = accel.platform.visible_devices_variable
        raise DistEnvError(
            f"LOCAL_RANK={launch.local_rank} but this process sees {accel.count} {accel.name} device(s) "
            f"(restricted by {variable}={os.environ.get(variable)!r}); launch at most {accel.count} processes "
            f"per node (G16) or select more devices."
        )


#: Entry forms the CUDA/HIP runtimes read that hwenv's index parser does not (it counts devices by index).
UUID_PREFIXES = ("GPU-", "MIG-")


def _check_selection(accel: hwenv.Accelerator) -> None:
    """The selection this process inherited (`ZE_AFFINITY_MASK`, `CUDA_VISIBLE_DEVICES`, ...), read with
    `hwenv.current_selection`, the parser `hwdist launch` and `hwenv doctor` use: the runtimes skip what
    they cannot read silently. Gaudi's is read by `check_gaudi_world`; device UUIDs are left to the runtime."""
    platform = accel.platform
    if not platform.selectable or rule_for(platform).partial_server_groups:
        return
    values = [os.environ.get(variable, "") for variable in platform.visible_devices]
    if any(item.strip().startswith(UUID_PREFIXES) for value in values for item in value.split(",")):
        return
    try:
        hwenv.current_selection(accel.kind)
    except hwenv.HwenvError as error:
        raise DistEnvError(f"the device selection this process inherited is not valid: {error}") from error


def _adopt(backend: str | None, timeout: timedelta, accel: hwenv.Accelerator, check: bool) -> DistContext:
    """A context for a process group someone else (accelerate, Trainer) already started."""
    import torch.distributed as dist

    running = str(dist.get_backend())
    if backend is not None and backend not in running.split(","):
        raise BackendMismatchError(
            f"a process group with backend {running!r} is already running; init(backend={backend!r}) cannot "
            f"change it. Call init() without backend, or destroy that group first."
        )
    launch = read_launch_env()
    name = running.split(":")[-1] if ":" in running else running
    device = _collective_device(accel.platform, name, launch.local_rank)
    logger.info("adopting the running %s process group (rank %d of %d)", running, dist.get_rank(), dist.get_world_size())
    return DistContext(dist.get_rank(), launch.local_rank, dist.get_world_size(), device, name,
                       launch.local_world_size, timeout, "adopted a process group started elsewhere",
                       owns_group=False, launched=launch.launched, check=check, kind=accel.kind)


def init(
    backend: str | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT,
    *,
    accel: hwenv.Accelerator | None = None,
    check: bool | None = None,
) -> DistContext:
    """Start (or return) this process's group from RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.

    Checks the variables, Gaudi groups (G8) and the backend before anything starts; binds the
    local device; a second call returns the same context. `timeout` (seconds or timedelta)
    bounds every collective. `check=True` (or, with `check=None`, `HWDIST_CHECKS=1`) validates
    every collective's arguments first and makes ranks compare dtype/shape/op before it, so a
    mismatch is an error on every rank instead of a hang or garbage; off by default, the hot path
    is the raw torch call (issue 29: <= 2 us over torch.distributed).
    """
    global _current
    import torch.distributed as dist

    limit = _as_timedelta(timeout)
    check = read_checks() if check is None else bool(check)
    if _current is not None and dist.is_initialized():
        if backend is not None and backend != _current.backend:
            raise BackendMismatchError(
                f"hwdist is already initialised with backend {_current.backend!r}; init(backend={backend!r}) "
                f"cannot change it. Call hwdist.shutdown() first."
            )
        return _current
    accel = accel if accel is not None else hwenv.detect()
    if dist.is_initialized():
        _current = _adopt(backend, limit, accel, check)
        return _current
    launch = read_launch_env()
    name, reason = choose_backend(accel) if backend is None else (backend, f"backend={backend!r} given")
    platform = accel.platform
    device = _collective_device(platform, name, launch.local_rank)
    _check_selection(accel)
    _check_local_rank(launch, accel)
    modules = None
    if rule_for(platform).partial_server_groups and name == platform.dist_backend:
        modules = check_gaudi_world(launch.local_world_size, accel.count, local_rank=launch.local_rank,
                                    kind=accel.kind)
    ensure_available(name, device.split(":")[0])
    _bind(device)
    kwargs: dict[str, Any] = {"backend": name, "timeout": limit}
    if launch.launched and (launch.world_size > 1 or (launch.master_addr and launch.master_port)):
        kwargs.update(init_method="env://", rank=launch.rank, world_size=launch.world_size)
    else:
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
        logger.info("one process (no launcher rendezvous): a world-size-1 %s group with an in-memory store", name)
    if name in BACKENDS and BACKENDS[name].binds_device:  # NCCL (RCCL on ROCm) connects to the device eagerly
        import torch

        kwargs["device_id"] = torch.device(device)
    dist.init_process_group(**kwargs)
    _current = DistContext(launch.rank, launch.local_rank, launch.world_size, device, name,
                           launch.local_world_size, limit, reason, True, launch.launched, modules, check,
                           kind=accel.kind)
    logger.info("hwdist: rank %d/%d on %s with %s (%s)", launch.rank, launch.world_size, device, name, reason)
    return _current


def current() -> DistContext:
    """The context `init()` returned; `NotInitializedError` before `init()`."""
    if _current is None:
        raise NotInitializedError("no hwdist context: call hwdist.init() (inside torchrun / hwdist launch) first.")
    return _current


def is_initialized() -> bool:
    """True between `init()` and `shutdown()`."""
    return _current is not None


def shutdown(*, adopted: bool = False) -> None:
    """Destroy the group `init()` started; idempotent. A group adopted from elsewhere (Trainer,
    accelerate) is left running unless `adopted=True`, which destroys whatever default group is
    running, as `Accelerator.end_training()` does: call it on every rank at the end of a script,
    since torch does not destroy a gloo group at exit and can abort there ("terminate called"). Garbage is
    collected first, so objects in reference cycles that hold the group or its pending work (a DDP wrapper,
    a finished Trainer) are freed while the interpreter is alive, not during its teardown, where gloo's worker
    threads can abort the process (pytorch/pytorch#179291)."""
    global _current
    ctx, _current = _current, None
    collectives = sys.modules.get(f"{__package__}.collectives")  # loaded only if a collective ran
    if collectives is not None:
        collectives.forget()  # the hot path's kept all-gather view holds the last `out` alive
    if not adopted and (ctx is None or not ctx.owns_group):
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()  # release cyclic holders of the group (DDP wrappers) while the interpreter is alive
        dist.destroy_process_group()
