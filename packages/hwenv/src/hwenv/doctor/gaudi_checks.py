"""Gaudi checks of `hwenv doctor`: plugin, Accelerate's gate, execution mode, int64, module pin, generation.

Sources: gaudi-pytorch-bridge 1.19 (INTEL.md S8), transformers 5.22 `utils/import_utils.py` (S4),
HabanaAI/habana-container-runtime (who reads `HABANA_VISIBLE_DEVICES`), FACTS.md G2-G5, G10-G12. Each finding says what it rests on.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Mapping

from .. import gaudi
from ..accelerator import Accelerator
from ..errors import HwenvError
from ..gaudi.flags import INT64_FIX, LAZY_MODE_FIX
from ..platforms import get_platform
from ..probes import ProbeResult
from ..versions import GAUDI_MIN_ACCELERATE, accelerate_sees_gaudi, format_version, library_versions
from .common import Checks, Problem


def _plugin_importable() -> bool:
    """Whether `habana_frameworks` can be imported (found without importing it)."""
    try:
        top = (get_platform("hpu").plugin_module or "").split(".")[0]
        return bool(top) and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def accelerate_gate(plugin_present: bool) -> list[Problem]:
    """Accelerate installed and older than 1.5.0 hides the Gaudi from Transformers (G3, G5); absent, it does not."""
    if not plugin_present or accelerate_sees_gaudi():
        return []
    acc_version = library_versions().get("accelerate")
    return [Problem(
        "accelerate-too-old-for-gaudi", "error",
        f"Accelerate {acc_version} is older than {format_version(GAUDI_MIN_ACCELERATE)}: "
        f"transformers.is_torch_hpu_available() returns False even with a Gaudi present (G3, G5).",
        f"pip install 'accelerate>={format_version(GAUDI_MIN_ACCELERATE)}' (or uninstall it: without "
        f"accelerate Transformers skips this check)",
    )]


def mode_findings(env: Mapping[str, str]) -> tuple[gaudi.GaudiMode, list[Problem], list[str]]:
    """The execution mode (G2; bridge `utils/internal.py` `is_lazy`, plugin-version default) and its problems."""
    mode = gaudi.execution_mode(env)
    problems: list[Problem] = []
    variable = gaudi.LAZY_MODE_VARIABLE
    malformed = gaudi.lazy_mode_problem(mode.value)  # the rule hwenv.validate_gaudi_flags raises for
    if malformed:
        problems.append(Problem("lazy-mode-malformed", "error", malformed + ".", LAZY_MODE_FIX))
    if mode.lazy:
        problems.append(Problem(
            "lazy-mode-blocks-compile", "warning",
            f"Gaudi runs in lazy mode ({mode.reason}); torch.compile (hpu_backend) needs eager mode (G2, G13).",
            f"run with {variable}=0 to use torch.compile, or do not compile",
        ))
        note = f"Gaudi execution mode: lazy ({mode.reason}). torch.compile needs eager mode."
    else:
        note = f"Gaudi execution mode: eager ({mode.reason}); ops run when called (G2), torch.compile routes to hpu_backend."
    return mode, problems, [note]


def int64_findings(env: Mapping[str, str], mode: gaudi.GaudiMode, device_name: str | None) -> tuple[list[Problem], list[str]]:
    """PT_ENABLE_INT64_SUPPORT: a problem only where it is malformed, or supported, needed and off (G4)."""
    status = gaudi.int64_status(env, device_name=device_name, mode=mode)
    variable = gaudi.INT64_VARIABLE
    malformed = gaudi.int64_problem(env.get(variable))  # the rule hwenv.validate_gaudi_flags raises for
    if malformed:
        return [Problem("int64-flag-malformed", "error", malformed + ".", INT64_FIX)], []
    empty = ([f"{variable} is set but empty: the bridge reads an empty value as unset (env_flags.cpp)."]
             if env.get(variable) == "" else [])
    if status.problem:
        return [Problem("int64-disabled", "error", status.reason + ".",
                        f"unset {variable} or set {variable}=1 (hwenv exec and hwenv env set it for eager mode)")], []
    if not status.supported:
        note = f"int64: unsupported here: {status.reason}."
        if status.value is not None and status.enabled:
            return [Problem("int64-flag-unsupported", "warning",
                            f"{variable}={status.value!r} is set, but {status.reason}.",
                            f"unset {variable}, or run in eager mode on Gaudi2 or newer")], [note]
        return [], [note] + empty
    return [], [f"int64: {status.reason} ({variable}; Transformers' token ids are int64, G4)."] + empty


def pin_findings(env: Mapping[str, str]) -> tuple[list[Problem], list[str]]:
    """HLS_MODULE_ID: the bridge's per-process module pin, which wins over selections (bridge `set_device`)."""
    variable = gaudi.MODULE_ID_VARIABLE
    if variable not in env:
        return [], []
    try:
        pin = gaudi.module_pin(env)
        gaudi.modules_for_processes(1, env)  # the pin must be one of HABANA_VISIBLE_MODULES when that is set
    except HwenvError as error:
        return [Problem("gaudi-module-pin", "error", str(error), f"unset {variable}")], []
    if pin is None:  # empty: the bridge reads it as unset
        return [], [f"{variable} is set but empty; the bridge treats it as unset."]
    return [], [
        f"{variable}={env[variable]} pins this process to Gaudi module {pin}: the bridge acquires that module "
        f"and it wins over {gaudi.MODULES_VARIABLE}/{gaudi.DEVICES_VARIABLE} (bridge 1.19 set_device, "
        f"_setup_module_id). hwenv exec and hwdist launch remove it from the child's environment."
    ]


def malformed_flag_findings(env: Mapping[str, str]) -> list[Problem]:
    """Off Gaudi: only a malformed `PT_HPU_LAZY_MODE` / `PT_ENABLE_INT64_SUPPORT` (a run on a Gaudi would read it)."""
    mode, found, _ = mode_findings(env)
    int64_found, _ = int64_findings(env, mode, None)
    malformed = ("lazy-mode-malformed", "int64-flag-malformed")
    return [p for p in found + int64_found if p.code in malformed]


def container_findings(env: Mapping[str, str]) -> tuple[list[Problem], list[str]]:
    """Who reads `HABANA_VISIBLE_DEVICES` (the container runtime at container start, never the bridge), and a
    one-module selection that nothing pins (issue 41 points 3-4; `hwenv.gaudi.selecting`'s sources)."""
    problems: list[Problem] = []
    notes: list[str] = []
    inside, evidence = gaudi.selecting.in_container()
    indices = env.get(gaudi.DEVICES_VARIABLE)
    if indices is not None:
        if inside:
            notes.append(
                f"{gaudi.DEVICES_VARIABLE}={indices} was read by the habana container runtime when this container "
                f"started ({evidence}): it mounted those cards and sets {gaudi.MODULES_VARIABLE} to their module IDs. "
                f"The Gaudi bridge itself never reads {gaudi.DEVICES_VARIABLE}.")
        else:
            problems.append(Problem(
                "habana-visible-devices-outside-container", "warning",
                f"{gaudi.DEVICES_VARIABLE}={indices!r} is set, but this process is not in a container ({evidence}): "
                f"only the habana container runtime reads it, when a container starts "
                f"(HabanaAI/habana-container-runtime); the Gaudi bridge never does, so it selects no card here "
                f"and a run takes any free card.",
                f"select by module ID, which the bridge reads: hwenv exec --devices M -- CMD (writes "
                f"{gaudi.MODULES_VARIABLE} and {gaudi.MODULE_ID_VARIABLE}; hl-smi -Q index,module_id -f csv maps "
                f"indices to module IDs), or start a container with docker run --runtime=habana -e "
                f"{gaudi.DEVICES_VARIABLE}={indices}",
            ))
    modules = env.get(gaudi.MODULES_VARIABLE, "")
    one_module = modules.strip().isdigit()
    world = env.get("WORLD_SIZE", "1").strip()
    if one_module and not env.get(gaudi.MODULE_ID_VARIABLE) and world in ("", "1") and not inside:
        problems.append(Problem(
            "gaudi-module-not-pinned", "warning",
            f"{gaudi.MODULES_VARIABLE}={modules} names one card, but nothing pins this process to it: the bridge "
            f"sets {gaudi.MODULE_ID_VARIABLE} only for ranks of a distributed run (hccl _setup_module_id) or in "
            f"set_device (TrainingArguments calls it; Accelerate's PartialState and .to('hpu') do not), and an "
            f"unpinned process acquires any free card (backend/synapse_helpers/device.cpp).",
            f"also set {gaudi.MODULE_ID_VARIABLE}={modules.strip()} (hwenv exec --devices {modules.strip()} -- CMD "
            f"writes both)",
        ))
    return problems, notes


def generation_findings(acc: Accelerator) -> tuple[list[Problem], list[str]]:
    """The Gaudi generation and its facts (`hwenv.gaudi.generation_of`); an unknown name is a warning."""
    name = acc.names[0] if acc.names else ""
    generation = gaudi.generation_of(name)
    facts = (f"bf16 {'yes' if generation.bf16 else 'no'}, int64 {'yes (eager mode)' if generation.int64 else 'no'}, "
             f"bitsandbytes 4-bit {'yes' if generation.bnb_4bit else 'no'} / 8-bit {'yes' if generation.bnb_8bit else 'no'}, "
             f"fp8 {'yes' if generation.fp8 else 'no'}")
    note = f"Gaudi generation: {generation.reason()} ({facts})."
    if generation.known:
        return [], [note]
    return [Problem(
        "unknown-gaudi-generation", "warning",
        f"{generation.reason()}: bf16, int64, 4/8-bit and fp8 support are assumed, not known.",
        "check Intel's support matrix for this device; update hwenv (hwenv.gaudi.GAUDI_GENERATIONS) when it is listed",
    )], [note]


def gaudi_checks(acc: Accelerator | None, probes: Mapping[str, ProbeResult], env: Mapping[str, str]) -> Checks:
    """Problems and notes about Intel Gaudi."""
    problems: list[Problem] = []
    notes: list[str] = []
    hpu = probes["hpu"]
    plugin_present = _plugin_importable()
    problems += accelerate_gate(plugin_present)
    if acc is not None and acc.platform.lazy_mode_variable:  # a Gaudi: the platform with a lazy mode
        mode, found, said = mode_findings(env)
        problems += found
        notes += said
        for check in (int64_findings(env, mode, acc.names[0] if acc.names else None), pin_findings(env),
                      generation_findings(acc), container_findings(env)):
            problems += check[0]
            notes += check[1]
    else:
        found, said = pin_findings(env)
        problems += found + malformed_flag_findings(env)
        notes += said
    if not hpu.available and shutil.which("hl-smi") and not plugin_present:
        problems.append(Problem(
            "torch-without-hpu", "error",
            "hl-smi is installed (a Gaudi driver is here) but habana_frameworks is not importable (G3).",
            gaudi.PLUGIN_INSTALL_HINT,
        ))
    return problems, notes
