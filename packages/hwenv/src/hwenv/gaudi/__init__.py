"""Intel Gaudi facts as hwenv models them: selection variables, hl-smi, groups, execution mode.

FACTS.md G6-G8; INTEL.md S8-S12. Module IDs are stable across reboots and driver reinstalls;
device indices can change, so a selection is always written as module IDs. One job per module:
`variables` (names, id lists), `hl_smi` (index <-> module ID), `groups` (G8),
`mode` (lazy/eager).
"""

from __future__ import annotations

from .groups import SERVER_SIZE, SUPPORTED_PARTIAL_GROUPS, check_group, supported_groups_text
from .hl_smi import (
    HL_SMI_QUERY,
    HlSmiRow,
    index_to_module,
    indices_to_modules,
    module_to_index,
    parse_hl_smi_csv,
    read_hl_smi,
)
from .mode import LAST_LAZY_DEFAULT, GaudiMode, default_lazy, execution_mode
from .variables import (
    DEVICES_VARIABLE,
    INT64_VARIABLE,
    LAZY_MODE_VARIABLE,
    MODULE_ID_VARIABLE,
    MODULES_VARIABLE,
    PLUGIN_DISTRIBUTION,
    PLUGIN_INSTALL_HINT,
    parse_id_list,
)

__all__ = [
    "DEVICES_VARIABLE", "GaudiMode", "HL_SMI_QUERY", "HlSmiRow", "INT64_VARIABLE", "LAST_LAZY_DEFAULT",
    "LAZY_MODE_VARIABLE", "MODULES_VARIABLE", "MODULE_ID_VARIABLE", "PLUGIN_DISTRIBUTION", "PLUGIN_INSTALL_HINT",
    "SERVER_SIZE", "SUPPORTED_PARTIAL_GROUPS", "check_group", "default_lazy", "execution_mode", "index_to_module",
    "indices_to_modules", "module_to_index", "parse_hl_smi_csv", "parse_id_list", "read_hl_smi",
    "supported_groups_text",
]
