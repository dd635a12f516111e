"""Intel Gaudi facts as hwenv models them: selection variables, hl-smi, groups, execution mode.

FACTS.md G6-G8; INTEL.md S8-S12. Module IDs are stable across reboots and driver reinstalls;
device indices can change, so a selection is always written as module IDs. One job per module:
`variables` (names, id lists), `hl_smi` (index <-> module ID), `groups` (G8),
`mode` (lazy/eager), `int64` (PT_ENABLE_INT64_SUPPORT), `modules` (which module each process
uses; HLS_MODULE_ID), `generations` (each generation's facts).
"""

from __future__ import annotations

from . import selecting  # the Gaudi half of hwenv.select / current_selection
from .flags import int64_problem, lazy_mode_problem, validate_gaudi_flags
from .generations import (
    GAUDI_GENERATIONS,
    GaudiGeneration,
    generation_of,
    known_generation_names,
    newest_generation,
)
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
from .int64 import Int64Status, int64_status
from .mode import LAST_LAZY_DEFAULT, GaudiMode, default_lazy, execution_mode
from .modules import module_pin, modules_for_processes
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
    "GAUDI_GENERATIONS", "GaudiGeneration", "Int64Status", "generation_of", "int64_status", "known_generation_names",
    "module_pin", "modules_for_processes", "newest_generation", "selecting",
    "DEVICES_VARIABLE", "GaudiMode", "HL_SMI_QUERY", "HlSmiRow", "INT64_VARIABLE", "LAST_LAZY_DEFAULT",
    "LAZY_MODE_VARIABLE", "MODULES_VARIABLE", "MODULE_ID_VARIABLE", "PLUGIN_DISTRIBUTION", "PLUGIN_INSTALL_HINT",
    "SERVER_SIZE", "SUPPORTED_PARTIAL_GROUPS", "check_group", "default_lazy", "execution_mode", "index_to_module",
    "indices_to_modules", "module_to_index", "parse_hl_smi_csv", "parse_id_list", "read_hl_smi",
    "supported_groups_text", "int64_problem", "lazy_mode_problem", "validate_gaudi_flags",
]
