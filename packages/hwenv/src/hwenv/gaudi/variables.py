"""The Gaudi environment variables hwenv reads or writes, the install hint, and id-list parsing (G3, G6)."""

from __future__ import annotations

from ..errors import SelectionError

#: Module IDs a container/process may use (G6); stable across reboots.
MODULES_VARIABLE = "HABANA_VISIBLE_MODULES"
#: Device indices a container may use (G6); indices can change across reboots.
DEVICES_VARIABLE = "HABANA_VISIBLE_DEVICES"
#: The bridge's per-process module pin (S8 `hccl/__init__.py` `_setup_module_id`, `hpu/__init__.py` `set_device`).
MODULE_ID_VARIABLE = "HLS_MODULE_ID"
#: int64 tensors on the device (S8 `scripts/env_flags.yaml`, G4).
INT64_VARIABLE = "PT_ENABLE_INT64_SUPPORT"
#: Lazy (graph-accumulating) vs eager execution, read once at plugin import (S8, S12, G2).
LAZY_MODE_VARIABLE = "PT_HPU_LAZY_MODE"
#: The distribution whose version decides the defaults above.
PLUGIN_DISTRIBUTION = "habana-torch-plugin"

PLUGIN_INSTALL_HINT = (
    "Install the Intel Gaudi software stack and its PyTorch package (habana-torch-plugin, "
    "imported as habana_frameworks) from Intel's Gaudi installer; it is not on PyPI. "
    "See https://docs.habana.ai/en/latest/Installation_Guide/"
)


def parse_id_list(text: str, variable: str) -> tuple[int, ...]:
    """`"5,4,7,6"` -> `(5, 4, 7, 6)`; bad items, negatives and duplicates raise `SelectionError`."""
    if text is None or str(text).strip() == "":
        raise SelectionError(f"{variable}={text!r} is empty; list ids such as '0,1' or unset it to use every Gaudi.")
    ids: list[int] = []
    for position, item in enumerate(str(text).split(","), start=1):
        item = item.strip()
        if not (item.isascii() and item.isdigit()):
            raise SelectionError(
                f"{variable}={text!r} is invalid: item {position} ({item!r}) is not a non-negative integer id; "
                f"list ids such as '0,1', or unset {variable}."
            )
        value = int(item)
        if value in ids:
            raise SelectionError(f"{variable}={text!r} lists {value} twice; list each id once.")
        ids.append(value)
    return tuple(ids)


