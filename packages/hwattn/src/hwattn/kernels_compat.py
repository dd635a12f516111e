"""The one place hwattn reads private parts of the `kernels` library: `kernels_internals()`.

kernels exports how to register mappings (`use_kernel_mapping`, `Mode`) and, from 0.18, what a
kernelized model uses (`get_kernelized_layers`), but not what `kernel_plan` needs before anything
loads: the merged table `kernelize` reads, the per-device repository sets in it, and the
mode-priority rule that picks one. kernels 0.19 moved those from `kernels.layer` to
`kernels._internals.layer` (and `DeviceRepos.repos` became `repos_for_device()`).
`kernels_internals()` reads them where the installed version keeps them and raises
`KernelsInternalsError` (version, what moved, supported window) when they are not there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import KernelsInternalsError

logger = logging.getLogger(__name__)

#: kernels versions hwattn supports (min inclusive, max exclusive), and the pairs the tests ran on.
KERNELS_WINDOW: tuple[str, str] = ("0.17.2", "0.20")
TESTED_PAIRS: tuple[tuple[str, str], ...] = (("5.22.2", "0.17.2"), ("5.24.0", "0.18.3"), ("5.25.0", "0.19.1"))

#: Where kernels keeps the mapping table and mode rule, newest first: (first kernels version, package).
INTERNALS_LOCATIONS: tuple[tuple[tuple[int, ...], str], ...] = (
    ((0, 19), "kernels._internals.layer"),
    ((0, 17, 2), "kernels.layer"),
)
MOVED = ("kernels 0.19 moved `kernels.layer.globals._KERNEL_MAPPING` and `kernels.layer.repos._select_repository` "
         "to `kernels._internals.layer` (and DeviceRepos.repos became repos_for_device())")

_warned: set[str] = set()


@dataclass(frozen=True)
class KernelsInternals:
    """What `kernel_plan` uses of kernels beyond its public API, bound for the installed version.

    `current_mapping()`: the table `kernelize` reads now (layer -> kernels device type -> repository set);
    `repos_for(device_repos, capability)`: the `{Mode: repository}` of one set (CUDA/ROCm by capability,
    0 = none known); `select(repos, mode)`: kernels' own mode priority -> `(repository, mode)` or None;
    `describe(repository)`: `(repo id or path, layer or function name)` without resolving a revision.
    """

    version: str
    location: str
    current_mapping: Callable[[], dict[str, dict[str, Any]]]
    repos_for: Callable[[Any, int], dict[Any, Any] | None]
    select: Callable[[dict[Any, Any], Any], tuple[Any, Any] | None]
    describe: Callable[[Any], tuple[str, str]]


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def kernels_internals(version: str | None = None) -> KernelsInternals:
    """Bind kernels' private mapping table, repository sets and mode rule for the installed kernels.

    The only function in hwattn that touches kernels internals. `version` (default: installed)
    picks the location from `INTERNALS_LOCATIONS`; anything missing raises `KernelsInternalsError`.
    """
    import importlib

    if version is None:
        import kernels

        version = str(getattr(kernels, "__version__", "unknown"))
    parsed = _parse(version)
    low, high = KERNELS_WINDOW
    in_window = _parse(low) <= parsed < _parse(high)
    location = next((where for first, where in INTERNALS_LOCATIONS if parsed >= first), INTERNALS_LOCATIONS[-1][1])

    def broken(what: str, error: BaseException) -> KernelsInternalsError:
        window = f"hwattn supports kernels {low} <= version < {high} (tested: " + ", ".join(
            f"kernels {k} with transformers {t}" for t, k in TESTED_PAIRS) + ")"
        return KernelsInternalsError(
            f"kernel_plan cannot read {what} from the installed kernels {version} (looked in {location}: "
            f"{type(error).__name__}: {error}). kernels does not export it; {MOVED}. {window}"
            + ("" if in_window else "; this version is outside that window") + ". Fix: install a kernels inside "
            "the window that your transformers accepts, or plan without it (loading with use_kernels=True does "
            "not need kernel_plan)."
        )

    try:
        mapping_var = importlib.import_module(f"{location}.globals")._KERNEL_MAPPING
        select_repository = importlib.import_module(f"{location}.repos")._select_repository
    except (ImportError, AttributeError) as error:
        raise broken("the mapping table and the mode-priority rule", error) from error
    if not in_window and version not in _warned:
        _warned.add(version)
        logger.warning("kernels %s is outside the window hwattn was tested with (%s <= version < %s); "
                       "kernel_plan reads its internals from %s", version, low, high, location)

    def repos_for(device_repos: Any, capability: int) -> dict[Any, Any] | None:
        tree = getattr(device_repos, "repos_by_capability", None)
        try:
            if tree is not None:
                return tree.find_smallest_interval(capability)
            if hasattr(device_repos, "repos_for_device"):  # kernels >= 0.19
                return device_repos.repos_for_device(None)
            return device_repos.repos  # kernels 0.17, 0.18
        except AttributeError as error:
            raise broken("a device's repository set", error) from error

    def select(repos: dict[Any, Any], mode: Any) -> tuple[Any, Any] | None:
        return select_repository(repos, mode=mode)

    def describe(repository: Any) -> tuple[str, str]:
        repo = getattr(repository, "_repo_id", None) or str(getattr(repository, "_repo_path", "") or "")
        name = getattr(repository, "layer_name", None) or getattr(repository, "func_name", None) or "?"
        return repo or type(repository).__name__, name

    return KernelsInternals(version=version, location=location, current_mapping=mapping_var.get,
                            repos_for=repos_for, select=select, describe=describe)
