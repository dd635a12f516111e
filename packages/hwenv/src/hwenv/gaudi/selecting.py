"""The Gaudi half of `hwenv.select` / `current_selection` / `Selection.env()`: rules, no `Selection` type.

What reads which variable (issue 41 points 3-4):
- `HABANA_VISIBLE_DEVICES` is read only by the habana container runtime's OCI hook when a container
  starts (HabanaAI/habana-container-runtime `cmd/habana-container-runtime-hook/container_config.go`
  `getDevicesFromEnvvar`; its README: "If environment variable HABANA_VISIBLE_DEVICES is set in the OCI
  spec, the hook will configure Habana device access for the container"), which then generates
  `HABANA_VISIBLE_MODULES` inside the container "in the matching order of HABANA_VISIBLE_DEVICES".
  The bridge never reads it (gaudi-pytorch-bridge 1.19 has no reference to it), so handed to a child
  process it selects nothing. A `--by index` selection is therefore written for a container start
  (`hwenv env --format docker`) *and*, where hl-smi maps the index to its module, as the module pin the
  bridge reads; without that mapping a child process would not be restricted (`selects_in_process`).
- The bridge acquires the card named by `HLS_MODULE_ID` (`backend/synapse_helpers/device.cpp`
  `synDeviceAcquireByModuleId`), else any free card (`synDeviceAcquireByDeviceType`). It sets the pin
  itself only for ranks of a distributed run (`distributed/hccl/__init__.py` `_setup_module_id`, world
  size > 1) and in `set_device` (Transformers' `TrainingArguments` calls it; Accelerate's `PartialState`
  and `.to("hpu")` never do). So one card on bare metal is pinned explicitly: a one-module selection
  writes `HLS_MODULE_ID` too.
- One card needs no group check: a single-card run is standard (INTEL.md S13). Two or more cards are a
  distributed workload: device indices are mapped to module IDs with hl-smi and the group is checked
  against Intel's table (G8).
- `HLS_MODULE_ID`, the bridge's per-process pin, wins over both selection variables in the process that
  has it (bridge `set_device`); an inherited one is removed from a child's environment (`child_removals`)
  and replaced by the selection's own pin where it names one card.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..errors import GaudiModulePinError, SelectionError
from .groups import check_group
from .hl_smi import HlSmiRow, indices_to_modules, read_hl_smi
from .int64 import int64_status
from .mode import execution_mode
from .modules import module_pin
from .variables import (
    DEVICES_VARIABLE,
    INT64_VARIABLE,
    MODULE_ID_VARIABLE,
    MODULES_VARIABLE,
    parse_id_list,
)

BY_MODULE = "module"
BY_INDEX = "index"


def variable_for(by: str) -> str:
    """`HABANA_VISIBLE_MODULES` for module IDs, `HABANA_VISIBLE_DEVICES` for device indices."""
    return DEVICES_VARIABLE if by == BY_INDEX else MODULES_VARIABLE


def index_module(index: int, hl_smi_rows: tuple[HlSmiRow, ...] | None = None) -> tuple[int | None, str]:
    """The module ID of device `index` by hl-smi (`hl_smi_rows`, else `read_hl_smi()`), or None and why not."""
    try:
        rows = hl_smi_rows if hl_smi_rows is not None else read_hl_smi()
        return indices_to_modules((index,), rows)[0], ""
    except Exception as error:  # no hl-smi, a failed run, an index it does not list
        return None, f"hl-smi could not map device index {index} to its module ID ({error})"


def parse_devices(
    devices: str, by: str = BY_MODULE, hl_smi_rows: tuple[HlSmiRow, ...] | None = None
) -> tuple[tuple[str, ...], str]:
    """Validate a Gaudi `--devices` list; return the ids to write and how (`"module"` or `"index"`).

    One id is returned as given (no group rule). Several indices are translated to module IDs with
    hl-smi; several module IDs must be a supported group (G8). One index's module (for the pin the
    bridge reads) is `index_module`'s answer, asked by `hwenv.select`.
    """
    if by not in (BY_MODULE, BY_INDEX):
        raise SelectionError(f"by={by!r} is not valid for Gaudi; use 'module' (module IDs) or 'index' (device indices).")
    ids = parse_id_list(devices, variable_for(by))
    if len(ids) == 1:
        if by == BY_MODULE:
            check_group(ids)  # one card passes the group rule; the module ID must still exist on a server
        return (str(ids[0]),), by
    if by == BY_INDEX:
        rows = hl_smi_rows if hl_smi_rows is not None else read_hl_smi()
        ids = indices_to_modules(ids, rows)
    check_group(ids)
    return tuple(str(i) for i in ids), BY_MODULE


def environment_devices(
    environ: Mapping[str, str] | None = None, hl_smi_rows: tuple[HlSmiRow, ...] | None = None
) -> tuple[str | None, str]:
    """The Gaudi selection `environ` already makes: `(devices text or None, by)`, validated.

    Order, as the bridge decides: `HLS_MODULE_ID` (one module; must be in `HABANA_VISIBLE_MODULES`
    when that is set); then both selection variables (they must agree, checked with hl-smi);
    then `HABANA_VISIBLE_MODULES`; then `HABANA_VISIBLE_DEVICES` (one index stays an index).
    """
    env = os.environ if environ is None else environ
    modules = env.get(MODULES_VARIABLE)
    indices = env.get(DEVICES_VARIABLE)
    pin = module_pin(env)
    if pin is not None:
        if modules is not None and pin not in parse_id_list(modules, MODULES_VARIABLE):
            raise GaudiModulePinError(
                f"{MODULE_ID_VARIABLE}={pin} is not in {MODULES_VARIABLE}={modules!r}: the Gaudi bridge's set_device "
                f"asserts that the pinned module is visible. Unset {MODULE_ID_VARIABLE}, or make it one of the listed "
                f"modules."
            )
        return str(pin), BY_MODULE
    if modules is not None and indices is not None:
        module_ids = parse_id_list(modules, MODULES_VARIABLE)
        index_ids = parse_id_list(indices, DEVICES_VARIABLE)
        try:
            rows = hl_smi_rows if hl_smi_rows is not None else read_hl_smi()
        except Exception as error:
            raise SelectionError(
                f"Both {MODULES_VARIABLE}={modules!r} and {DEVICES_VARIABLE}={indices!r} are set and "
                f"hl-smi cannot be read to check that they agree ({error}). Set only {MODULES_VARIABLE}."
            ) from error
        translated = indices_to_modules(index_ids, rows)
        if set(translated) != set(module_ids):
            raise SelectionError(
                f"{MODULES_VARIABLE}={modules!r} and {DEVICES_VARIABLE}={indices!r} disagree: the "
                f"indices are module IDs {sorted(translated)} by hl-smi, not {sorted(module_ids)}. "
                f"Unset {DEVICES_VARIABLE} and keep {MODULES_VARIABLE} (module IDs are stable)."
            )
        return modules, BY_MODULE
    if modules is not None:
        parse_id_list(modules, MODULES_VARIABLE)  # its own name in the error (an empty value included)
        return modules, BY_MODULE
    if indices is not None:
        parse_id_list(indices, DEVICES_VARIABLE)
        return indices, BY_INDEX
    return None, BY_MODULE


def child_env(devices: tuple[str, ...], by: str, environ: Mapping[str, str] | None = None,
              modules: tuple[str, ...] = ()) -> dict[str, str]:
    """The Gaudi variables to set for a child: the selection variables, the pin, and int64 where it is supported.

    - by module: `HABANA_VISIBLE_MODULES`; one module also `HLS_MODULE_ID` (the bridge pins nothing for
      one process that does not call `set_device`, and an unpinned process takes any free card).
    - by index: `HABANA_VISIBLE_DEVICES` (what the container runtime reads at container start) and, where
      `modules` gives the index's module (hl-smi), `HABANA_VISIBLE_MODULES` and `HLS_MODULE_ID` (what the
      bridge reads).

    `PT_ENABLE_INT64_SUPPORT=1` is written only when the child will run in eager mode (read from
    `environ`'s `PT_HPU_LAZY_MODE` and the installed plugin, `execution_mode`): Intel supports it
    only there (and on Gaudi2 or newer, where eager mode turns it on by default anyway). In lazy
    mode it is not written. The Gaudi generation is not known when an environment is prepared
    (possibly for another machine); on Gaudi 1 `hwenv doctor` reports int64 as unsupported.
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    if devices:
        out[variable_for(by)] = ",".join(devices)
        pinned = devices if by == BY_MODULE else modules
        if by == BY_INDEX and pinned:
            out[MODULES_VARIABLE] = ",".join(pinned)
        if len(pinned) == 1:
            out[MODULE_ID_VARIABLE] = pinned[0]
    if int64_status(env, device_name=None, mode=execution_mode(env)).supported:
        out[INT64_VARIABLE] = "1"  # Transformers uses int64 token ids (G4)
    return out


def in_container(root: str = "/") -> tuple[bool, str]:
    """Whether this process runs in a container, and the evidence (`/.dockerenv`, `/run/.containerenv`,
    or a docker/containerd/kubepods/libpod cgroup of PID 1). Only a container start reads `HABANA_VISIBLE_DEVICES`."""
    base = Path(root)
    for marker in (".dockerenv", "run/.containerenv"):
        if (base / marker).exists():
            return True, f"/{marker} exists"
    try:
        cgroup = (base / "proc/1/cgroup").read_text()
    except OSError:
        return False, "no container marker (/.dockerenv, /run/.containerenv) and /proc/1/cgroup unreadable"
    for word in ("docker", "containerd", "kubepods", "libpod"):
        if word in cgroup:
            return True, f"/proc/1/cgroup names {word}"
    return False, "no container marker (/.dockerenv, /run/.containerenv, a container cgroup of PID 1)"


def index_selection_note(index: str, why: str) -> str:
    """Why a one-index selection whose module is unknown selects nothing in a child process, and the fix."""
    return (f"{DEVICES_VARIABLE}={index} is read only by the habana container runtime when a container starts "
            f"(HabanaAI/habana-container-runtime); the Gaudi bridge never reads it, so a child process given it "
            f"still takes any free card. {why}. Fix: pass the module ID (--devices M; hl-smi -Q index,module_id "
            f"-f csv lists them), or start a container with {DEVICES_VARIABLE}={index} "
            f"(hwenv env --kind hpu --by index --devices {index} --format docker)")


def child_removals(devices: tuple[str, ...], by: str) -> tuple[str, ...]:
    """Inherited variables to drop from a child's environment: the pin, and the other selection variable."""
    removed = [MODULE_ID_VARIABLE]  # a child must not inherit this process's module pin
    if devices:
        removed.append(DEVICES_VARIABLE if by == BY_MODULE else MODULES_VARIABLE)
    return tuple(removed)
