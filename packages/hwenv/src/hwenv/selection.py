"""`Selection`: which devices of a kind a run may use, and the exact environment that says so.

The environment is meant for one child process (`hwenv exec`, `hwdist launch`, a
`docker run -e` line), never exported into a shell where later runs would inherit it (X4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import gaudi
from .affinity import MASK_VARIABLE, PCI_ORDER_VARIABLE, format_affinity_mask, parse_affinity_mask
from .affinity import visible_root_devices as _xpu_visible_devices
from .errors import SelectionError
from .hierarchy import HIERARCHY_VARIABLE, DeviceHierarchy, as_hierarchy
from .platforms import get_platform, kinds, platforms

CUDA_VARIABLE = "CUDA_VISIBLE_DEVICES"


def _grammar(kind: str) -> str | None:
    """The selection grammar of `kind`'s platform (`affinity-mask`, `module-ids`, `indices`, `none`)."""
    return get_platform(kind).selection_grammar if kind in kinds() else None


def _affinity_mask_kind(kind: str) -> bool:
    """Whether `kind` selects devices with a Level Zero `ZE_AFFINITY_MASK` (Intel GPUs), by its platform's data."""
    return _grammar(kind) == "affinity-mask"


def _module_id_kind(kind: str) -> bool:
    """Whether `kind` selects Gaudi module IDs (`HABANA_VISIBLE_MODULES`), by its platform's data."""
    return _grammar(kind) == "module-ids"


def _selectable_kinds() -> str:
    return "|".join(p.kind for p in platforms() if p.selectable)


@dataclass(frozen=True)
class Selection:
    """A validated device selection: `kind`, the ids as the variable writes them, and the env."""

    kind: str
    devices: tuple[str, ...] = ()
    pci_order: bool = True
    by: str = "module"  # Gaudi: devices are module IDs ("module") or one device index ("index")
    hierarchy: str | None = None  # XPU: ZE_FLAT_DEVICE_HIERARCHY as the user set it; None = unset (FLAT)
    modules: tuple[str, ...] = ()  # Gaudi by index: the index's module ID by hl-smi, when it could be read
    note: str = field(default="", compare=False)  # what the selection cannot do, and the fix (empty: nothing)

    @property
    def selects_in_process(self) -> bool:
        """Whether a child process given `env()` is restricted to the selection (not only a container start).

        False for a Gaudi device index whose module ID hl-smi could not give: `HABANA_VISIBLE_DEVICES` is
        read only by the habana container runtime when a container starts, never by the bridge.
        """
        return not (_module_id_kind(self.kind) and self.by == "index" and self.devices and not self.modules)

    @property
    def count(self) -> int | None:
        """Devices the child will see (one process each); None when every device is selected.

        XPU: the root devices `torch.xpu.device_count()` reports in the child. Under COMPOSITE the
        sub-device entries of one card are one device (`1.1,1.2` is 1, `0,1.0,1.1` is 2); under
        FLAT (the default) sub-device entries are refused by `select`, so each entry is one device.
        """
        if self.devices and _affinity_mask_kind(self.kind):
            return _xpu_visible_devices(parse_affinity_mask(",".join(self.devices)))
        return len(self.devices) if self.devices else None

    @property
    def variable(self) -> str | None:
        """The variable that carries the selection (`ZE_AFFINITY_MASK`, `HABANA_VISIBLE_MODULES`, ...)."""
        if _module_id_kind(self.kind):
            return gaudi.selecting.variable_for(self.by)
        return get_platform(self.kind).visible_devices_variable

    def env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Exactly the variables to set for the child process, in a stable order.

        Gaudi: `PT_ENABLE_INT64_SUPPORT=1` only where the child runs in eager mode, read from
        `environ` (default `os.environ`) and the installed plugin (`hwenv.gaudi.selecting.child_env`).
        """
        out: dict[str, str] = {}
        if _affinity_mask_kind(self.kind):
            if self.devices:
                out[MASK_VARIABLE] = ",".join(self.devices)
            if self.pci_order:
                out[PCI_ORDER_VARIABLE] = "1"
            if self.hierarchy is not None:  # only what the user set: never invent a hierarchy
                out[HIERARCHY_VARIABLE] = self.hierarchy
        elif _module_id_kind(self.kind):
            out.update(gaudi.selecting.child_env(self.devices, self.by, environ, self.modules))
        elif self.devices:  # indices: CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES (ROCm), a plug-in's own
            out[get_platform(self.kind).visible_devices_variable] = ",".join(self.devices)
        return out

    def apply(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """A copy of `environ` (default `os.environ`) with this selection's variables set.

        A Gaudi selection removes an inherited `HLS_MODULE_ID` (the bridge's per-process pin, which
        would otherwise win over the selection in the child) and, with devices, the other
        selection variable, which could disagree with it.
        """
        merged = dict(os.environ if environ is None else environ)
        if _module_id_kind(self.kind):
            for variable in gaudi.selecting.child_removals(self.devices, self.by):
                merged.pop(variable, None)
        merged.update(self.env(merged))
        return merged


def select(
    kind: str,
    devices: str | None = None,
    *,
    by: str = "module",
    device_count: int | None = None,
    hl_smi_rows: tuple[gaudi.HlSmiRow, ...] | None = None,
    pci_order: bool = True,
    hierarchy: DeviceHierarchy | str | None = None,
    map_index: bool = True,
    integrated: tuple[bool, ...] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Selection:
    """Validate `devices` for `kind` and return the `Selection`; bad input raises before anything runs.

    `map_index=False` keeps a single Gaudi index unmapped (no hl-smi), as `current_selection` reads one.
    `integrated`: per XPU device, in the order this process enumerates them (`environ`, default `os.environ`),
    whether it is an integrated GPU (hwenv's XPU probe, `details["integrated_gpus"]`): with an integrated GPU
    next to discrete ones the indices would name other GPUs under the PCI order the child gets, so such a
    selection is refused with the fix (`check_pci_order`).

    - `xpu`: `devices` is a `ZE_AFFINITY_MASK` (`"0,2"`; `"0.1"` only under COMPOSITE), read in the
      device model of `hierarchy` (`"FLAT"`, `"COMPOSITE"`, `"COMBINED"`; default: this process's
      `ZE_FLAT_DEVICE_HIERARCHY`, unset = FLAT); `pci_order=False` opts out
      of `ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`.
    - `hpu`: `devices` are module IDs (`by="module"`, default, stable across reboots) or device
      indices (`by="index"`). One card is a standard run: no group rule; one module is also pinned
      (`HLS_MODULE_ID`); one index is written as `HABANA_VISIBLE_DEVICES` (read only at a container
      start) and, where hl-smi gives its module, as that module's pin; otherwise `note` says why a
      child process is not restricted (`selects_in_process`). Several cards are a distributed run:
      indices are translated to module IDs with `hl-smi` and the group is checked against Intel's
      supported combinations (G8).
    - `cuda`, `rocm` and any kind whose platform takes indices: the platform's variable
      (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`).
    - `mps`, `cpu`: no selection (a device list is an error naming the selectable kinds).
    """
    if kind not in kinds():
        raise SelectionError(f"Unknown accelerator kind {kind!r}; use one of {', '.join(kinds())}.")
    if devices is not None and str(devices).strip() == "" and not _affinity_mask_kind(kind):
        raise SelectionError(f"--devices {devices!r} is empty; list device ids such as '0,1', or leave it out.")
    if _affinity_mask_kind(kind):
        model = as_hierarchy(hierarchy)  # None: this process's environment, which the child inherits
        given = model.value if model.explicit else None
        if devices is None:
            return Selection(kind, (), pci_order, hierarchy=given)
        entries = parse_affinity_mask(devices, device_count, hierarchy=model)
        if entries and pci_order:
            check_pci_order(devices, integrated, os.environ if environ is None else environ)
        return Selection(kind, tuple(format_affinity_mask([e]) for e in entries), pci_order, hierarchy=given)
    if _module_id_kind(kind):
        if by not in ("module", "index"):
            raise SelectionError(f"by={by!r} is not valid for Gaudi; use 'module' (module IDs) or 'index' (device indices).")
        if devices is None:
            return Selection(kind)
        ids, written_by = gaudi.selecting.parse_devices(devices, by, hl_smi_rows)
        if written_by != "index" or not map_index:
            return Selection(kind, ids, by=written_by)
        module, why = gaudi.selecting.index_module(int(ids[0]), hl_smi_rows)
        if module is None:
            return Selection(kind, ids, by=written_by, note=gaudi.selecting.index_selection_note(ids[0], why))
        return Selection(kind, ids, by=written_by, modules=(str(module),))
    if _grammar(kind) == "indices":
        if devices is None:
            return Selection(kind)
        variable = get_platform(kind).visible_devices_variable
        ids = gaudi.parse_id_list(devices, variable)
        if device_count is not None and max(ids) >= device_count:
            raise SelectionError(f"{variable}={devices!r} names device {max(ids)}, but only {device_count} are present.")
        return Selection(kind, tuple(str(i) for i in ids))
    if devices is not None:
        raise SelectionError(
            f"{kind} has no device selection; leave --devices out (or pass --kind {_selectable_kinds()})."
        )
    return Selection(kind)


def check_pci_order(devices: str, integrated: tuple[bool, ...] | None, environ: Mapping[str, str]) -> None:
    """Refuse XPU indices that `ZE_ENABLE_PCI_ID_DEVICE_ORDER=1` would move to other GPUs.

    intel/compute-runtime `shared/source/execution_environment/execution_environment.cpp`
    `comparePciIdBusNumber` (used by `sortNeoDevices`, which `shared/source/os_interface/device_factory.cpp`
    calls before `parseAffinityMask`): without the variable discrete GPUs come before integrated ones, with it
    PCI order only. The two orders differ only when integrated and discrete GPUs are both present; indices read
    in this process's order (`environ` without the variable) then name other GPUs in a child that has it.
    """
    if integrated is None or environ.get(PCI_ORDER_VARIABLE) == "1" or not (True in integrated and False in integrated):
        return
    raise SelectionError(
        f"--devices {devices}: this machine has an integrated Intel GPU next to {integrated.count(False)} discrete "
        f"one(s), and Level Zero orders them differently with and without {PCI_ORDER_VARIABLE}: discrete GPUs first "
        f"by default (the order these indices were read in here), PCI bus order with {PCI_ORDER_VARIABLE}=1 (the "
        f"integrated GPU, usually on bus 0, becomes device 0). The driver sorts before it applies {MASK_VARIABLE} "
        f"(intel/compute-runtime execution_environment.cpp comparePciIdBusNumber), so with the stable PCI order "
        f"hwenv sets (X5) these indices would name other GPUs. Fix: set {PCI_ORDER_VARIABLE}=1 in this shell, read "
        f"the indices again (hwenv doctor lists the devices) and pass those; or pass --no-pci-order to keep the "
        f"default order."
    )


def current_selection(
    kind: str,
    environ: Mapping[str, str] | None = None,
    *,
    hl_smi_rows: tuple[gaudi.HlSmiRow, ...] | None = None,
    hierarchy: DeviceHierarchy | str | None = None,
) -> Selection:
    """The selection the environment already makes for `kind`, validated.

    On Gaudi, `HLS_MODULE_ID` (the bridge's pin) wins; `HABANA_VISIBLE_MODULES` and
    `HABANA_VISIBLE_DEVICES` both set must name the same devices (checked with the hl-smi
    mapping), otherwise a `SelectionError` says which to keep; one index in
    `HABANA_VISIBLE_DEVICES` (a one-card container) is kept as an index
    (`hwenv.gaudi.selecting.environment_devices`).
    On XPU the mask is read in `environ`'s `ZE_FLAT_DEVICE_HIERARCHY` (or the given `hierarchy`).
    """
    env = os.environ if environ is None else environ
    if _affinity_mask_kind(kind):
        # the mask is read in the hierarchy of `environ` (ZE_FLAT_DEVICE_HIERARCHY), unless one is given
        model = as_hierarchy(hierarchy, env)
        return select(kind, env.get(MASK_VARIABLE), pci_order=env.get(PCI_ORDER_VARIABLE) == "1", hierarchy=model)
    if _module_id_kind(kind):
        devices, by = gaudi.selecting.environment_devices(env, hl_smi_rows)
        if devices is None:
            return Selection(kind)
        return select(kind, devices, by=by, hl_smi_rows=hl_smi_rows, map_index=False)
    if _grammar(kind) == "indices":  # the first of the platform's variables that is set (ROCm: HIP_ before CUDA_)
        variable = next((v for v in get_platform(kind).visible_devices if env.get(v)), None)
        if variable is None:
            return Selection(kind)
        gaudi.parse_id_list(env[variable], variable)  # an error names the variable that holds the value
        return select(kind, env[variable])
    return Selection(kind)
