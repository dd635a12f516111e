"""`Selection`: which devices of a kind a run may use, and the exact environment that says so.

The environment is meant for one child process (`hwenv exec`, `hwdist launch`, a
`docker run -e` line), never exported into a shell where later runs would inherit it (X4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import gaudi
from .affinity import MASK_VARIABLE, PCI_ORDER_VARIABLE, format_affinity_mask, parse_affinity_mask
from .affinity import visible_root_devices as _xpu_visible_devices
from .errors import SelectionError
from .hierarchy import HIERARCHY_VARIABLE, DeviceHierarchy, as_hierarchy
from .platforms import get_platform, kinds

CUDA_VARIABLE = "CUDA_VISIBLE_DEVICES"


def _affinity_mask_kind(kind: str) -> bool:
    """Whether `kind` selects devices with a Level Zero `ZE_AFFINITY_MASK` (Intel GPUs), by its platform's data."""
    return kind in kinds() and get_platform(kind).selection_grammar == "affinity-mask"


@dataclass(frozen=True)
class Selection:
    """A validated device selection: `kind`, the ids as the variable writes them, and the env."""

    kind: str
    devices: tuple[str, ...] = ()
    pci_order: bool = True
    by: str = "module"  # Gaudi: devices are module IDs ("module") or one device index ("index")
    hierarchy: str | None = None  # XPU: ZE_FLAT_DEVICE_HIERARCHY as the user set it; None = unset (FLAT)

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
        if self.kind == "hpu":
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
        elif self.kind == "hpu":
            out.update(gaudi.selecting.child_env(self.devices, self.by, environ))
        elif self.kind == "cuda" and self.devices:
            out[CUDA_VARIABLE] = ",".join(self.devices)
        return out

    def apply(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """A copy of `environ` (default `os.environ`) with this selection's variables set.

        A Gaudi selection removes an inherited `HLS_MODULE_ID` (the bridge's per-process pin, which
        would otherwise win over the selection in the child) and, with devices, the other
        selection variable, which could disagree with it.
        """
        merged = dict(os.environ if environ is None else environ)
        if self.kind == "hpu":
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
) -> Selection:
    """Validate `devices` for `kind` and return the `Selection`; bad input raises before anything runs.

    - `xpu`: `devices` is a `ZE_AFFINITY_MASK` (`"0,2"`; `"0.1"` only under COMPOSITE), read in the
      device model of `hierarchy` (`"FLAT"`, `"COMPOSITE"`, `"COMBINED"`; default: this process's
      `ZE_FLAT_DEVICE_HIERARCHY`, unset = FLAT); `pci_order=False` opts out
      of `ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`.
    - `hpu`: `devices` are module IDs (`by="module"`, default, stable across reboots) or device
      indices (`by="index"`). One card is a standard run: no group rule, and one index stays an
      index (`HABANA_VISIBLE_DEVICES`, no hl-smi). Several cards are a distributed run: indices
      are translated to module IDs with `hl-smi` and the group is checked against Intel's
      supported combinations (G8).
    - `cuda`: `CUDA_VISIBLE_DEVICES` indices.
    """
    if kind not in kinds():
        raise SelectionError(f"Unknown accelerator kind {kind!r}; use one of {', '.join(kinds())}.")
    if devices is not None and str(devices).strip() == "" and not _affinity_mask_kind(kind):
        raise SelectionError(f"--devices {devices!r} is empty; list device ids such as '0,1', or leave it out.")
    if _affinity_mask_kind(kind):
        model = as_hierarchy(hierarchy)  # None: this process's environment, which the child inherits
        given = model.value if model.explicit else None
        if devices is None:
            return Selection("xpu", (), pci_order, hierarchy=given)
        entries = parse_affinity_mask(devices, device_count, hierarchy=model)
        return Selection("xpu", tuple(format_affinity_mask([e]) for e in entries), pci_order, hierarchy=given)
    if kind == "hpu":
        if by not in ("module", "index"):
            raise SelectionError(f"by={by!r} is not valid for Gaudi; use 'module' (module IDs) or 'index' (device indices).")
        if devices is None:
            return Selection("hpu")
        ids, written_by = gaudi.selecting.parse_devices(devices, by, hl_smi_rows)
        return Selection("hpu", ids, by=written_by)
    if kind == "cuda":
        if devices is None:
            return Selection("cuda")
        ids = gaudi.parse_id_list(devices, CUDA_VARIABLE)
        if device_count is not None and max(ids) >= device_count:
            raise SelectionError(f"{CUDA_VARIABLE}={devices!r} names device {max(ids)}, but only {device_count} are present.")
        return Selection("cuda", tuple(str(i) for i in ids))
    if devices is not None:
        raise SelectionError(f"{kind} has no device selection; leave --devices out (or pass --kind xpu|hpu|cuda).")
    return Selection(kind)


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
        return select("xpu", env.get(MASK_VARIABLE), pci_order=env.get(PCI_ORDER_VARIABLE) == "1", hierarchy=model)
    if kind == "hpu":
        devices, by = gaudi.selecting.environment_devices(env, hl_smi_rows)
        return Selection("hpu") if devices is None else select("hpu", devices, by=by, hl_smi_rows=hl_smi_rows)
    if kind == "cuda":
        value = env.get(CUDA_VARIABLE)
        return select("cuda", value) if value else Selection("cuda")
    return Selection(kind)
