"""Which Gaudi module each process of a run uses, as the bridge assigns them (INTEL.md S8, S11).

gaudi-pytorch-bridge 1.19:
- `torch/distributed/hccl/__init__.py` `_setup_module_id` (run when `habana_frameworks.torch`
  is imported): an `HLS_MODULE_ID` already set is kept; with world size 1 or no `LOCAL_RANK`
  nothing is pinned; otherwise `HLS_MODULE_ID = HABANA_VISIBLE_MODULES[local_rank]` when that
  list is set, else `str(local_rank)` ("strict mapping of local_rank -> module_id").
- `torch/hpu/__init__.py` `set_device(i)`: `HLS_MODULE_ID`, if set, wins over the index; with
  neither it nor `HABANA_VISIBLE_MODULES` set and fewer than 8 devices only index 0 is allowed
  (and nothing is pinned); otherwise it pins `HABANA_VISIBLE_MODULES[i]` (default list 0..7).
- `backend/synapse_helpers/device.cpp`: a pinned process acquires its module by ID; an unpinned
  one acquires any free device by type.

So N processes with no selection on part of a server use modules 0..N-1 (2 processes ->
{0,1}), not device indices mapped through hl-smi.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import GaudiModulePinError, SelectionError
from .variables import MODULE_ID_VARIABLE, MODULES_VARIABLE, parse_id_list


def module_pin(environ: Mapping[str, str] | None = None) -> int | None:
    """The module `HLS_MODULE_ID` pins this process to, or None when unset (or empty, as the bridge reads it).

    A value that is not a non-negative integer raises `GaudiModulePinError` (the bridge's `int()` would fail).
    """
    env = os.environ if environ is None else environ
    raw = env.get(MODULE_ID_VARIABLE)
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise GaudiModulePinError(
            f"{MODULE_ID_VARIABLE}={raw!r} is not a module ID: the Gaudi bridge pins a process to the module "
            f"number it names (e.g. '3'). Unset it and choose devices with {MODULES_VARIABLE} "
            f"(hwenv exec --devices ...)."
        )
    return int(text)


def modules_for_processes(nproc: int, environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """Module IDs that `nproc` processes on one server use, indexed by local rank.

    - `HLS_MODULE_ID` set (it wins, as in the bridge): one process uses that module; two or
      more would all open the same card, which raises `GaudiModulePinError`.
    - `HABANA_VISIBLE_MODULES` set: the list position is the local rank, so the first `nproc`
      entries; fewer entries than processes raises `SelectionError` (the bridge asserts).
    - neither: `0 .. nproc-1` (module ID = local rank). One process is not pinned by the bridge
      unless something calls `set_device` (Transformers' `TrainingArguments` does, with index 0 ->
      module 0 on a full server; Accelerate's `PartialState` and `.to("hpu")` do not); an unpinned
      process gets any free card (`device.cpp`), so `(0,)` is the module it is pinned to if pinned at
      all. `hwenv.select` therefore pins a one-card selection itself (`HLS_MODULE_ID`).
    """
    if nproc < 1:
        raise SelectionError(f"nproc={nproc!r}: a run needs at least one process.")
    env = os.environ if environ is None else environ
    visible_text = env.get(MODULES_VARIABLE)
    visible = parse_id_list(visible_text, MODULES_VARIABLE) if visible_text not in (None, "") else None
    pin = module_pin(env)
    if pin is not None:
        if visible is not None and pin not in visible:
            raise GaudiModulePinError(
                f"{MODULE_ID_VARIABLE}={pin} is not in {MODULES_VARIABLE}={visible_text!r}: the bridge's set_device "
                f"asserts that the pinned module is visible. Unset {MODULE_ID_VARIABLE}."
            )
        if nproc > 1:
            raise GaudiModulePinError(
                f"{MODULE_ID_VARIABLE}={pin} is set, and the Gaudi bridge keeps an existing pin for every process "
                f"(hccl _setup_module_id), so all {nproc} processes would open module {pin}. Unset "
                f"{MODULE_ID_VARIABLE} (hwenv exec and hwdist launch remove it from the child's environment)."
            )
        return (pin,)
    if visible is not None:
        if nproc > len(visible):
            raise SelectionError(
                f"{nproc} processes need {nproc} Gaudi modules, but {MODULES_VARIABLE}={visible_text!r} lists "
                f"{len(visible)}; the bridge gives local rank r the r-th listed module. List more modules or "
                f"start fewer processes."
            )
        return visible[:nproc]
    return tuple(range(nproc))
