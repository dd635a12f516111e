"""When Transformers reaches for Hub kernels on its own, and whether that works offline (issue 41.9).

Read from the installed transformers 5.25 and kernels 0.19 (`.venv/.../transformers`, `.../kernels`):
- `modeling_utils.py` `from_pretrained`: `use_kernels` not passed is `None`, which becomes **True** unless
  `USE_HUB_KERNELS` is off (`integrations/hub_kernels.py` `_kernels_enabled` = `is_env_variable_true(
  "USE_HUB_KERNELS", default="YES")`: on for `1`, `true`, `y`, `yes`, `on` in any case, off for anything else).
  The loaded model is then kernelized (`set_use_kernels` -> `register_kernel_mapping_transformers()` ->
  `kernelize(model, device_map=...)`, `Mode.INFERENCE` after `model.eval()`), and `model.train()` re-kernelizes in
  `Mode.TRAINING` (`PreTrainedModel.train` -> `kernels_mode`), which Trainer calls. `kernels` is a hard
  dependency of transformers 5.25 (`Requires-Dist: kernels<0.20,>=0.19.1`), so this is every plain
  `from_pretrained` and every Trainer run.
- Which layers: the default mapping (`hub_kernels.py` `_build_kernel_mapping`) names Hub repos for the device
  types in `HUB_KERNEL_DEVICE_TYPES` only (`DEFAULT_KERNEL_REPOS`: e.g. `kernels-community/rotary` version 2 for
  rotary embeddings on cuda/xpu, `activation` version 1, `liger-kernels` version 4 on cuda/rocm); a model's layers
  that carry `use_kernel_forward_from_hub` / `use_kernelized_func` are swapped. On cpu, mps and hpu nothing is
  fetched.
- Also: `attn_implementation="org/repo"` or `flash_attention_2/3` without the pip package
  (`modeling_flash_attention_utils.py`: `FLASH_ATTN_KERNEL_FALLBACK`, e.g. `kernels-community/flash-attn2`, X7),
  `transformers serve --continuous-batching` on MPS (Metal flash kernel, `cli/serving/model_manager.py`), and
  quantized checkpoints whose kernels live on the Hub (`lazy_load_kernel`: finegrained-fp8, deep-gemm, nvfp4, ...).
- Offline: kernels resolves `version=N` with `HfApi.list_repo_refs` online; with `HF_HUB_OFFLINE=1` it reads
  `<KERNELS_CACHE or HF_HUB_CACHE>/kernels--<org>--<name>/refs/vN` (`kernels/_internals/_versions.py`), and a
  missing ref raises `ValueError("Version N of '<repo>' is not available in the local cache and Hugging Face
  Hub is in offline mode...")`, which is what the 2026-12-06 GPU runs died of. With no network and the
  variable unset, the listing itself fails.
hwstack's own loading passes `use_kernels=False` unless asked (hwattn), so `hwrun` is not affected; user code and
benchmarks that call Transformers directly are. Fix: `USE_HUB_KERNELS=NO`, or run the same load once online so the
kernels are in the cache. Nothing here imports transformers or kernels.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .versions import installed_version, parse_version

VARIABLE = "USE_HUB_KERNELS"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
#: Device types transformers 5.25's default kernel mapping has entries for (`_build_kernel_mapping`).
HUB_KERNEL_DEVICE_TYPES = ("cuda", "rocm", "xpu")
#: The kernels-community repos of that mapping: repo -> (version, device types) (the drift test reads transformers').
DEFAULT_KERNEL_REPOS: dict[str, tuple[int, tuple[str, ...]]] = {
    "kernels-community/rotary": (2, ("cuda", "xpu")),
    "kernels-community/aiter-rope": (3, ("rocm",)),
    "kernels-community/activation": (1, ("cuda", "rocm", "xpu")),
    "kernels-community/liger-kernels": (4, ("cuda", "rocm")),
    "kernels-community/fla": (3, ("cuda", "rocm", "xpu")),
    "kernels-community/mamba-ssm": (5, ("cuda", "rocm", "xpu")),
    "kernels-community/deformable-detr": (2, ("cuda", "rocm")),
}
FIX = (f"set {VARIABLE}=NO for runs that must work offline (Transformers then keeps every layer's own code), or "
       f"run the same load once with the Hub reachable (HF_HUB_OFFLINE unset) so the kernels are in the cache")
_TRUE = ("true", "1", "y", "yes", "on")  # transformers utils/import_utils.py is_env_variable_true


@dataclass(frozen=True)
class HubKernels:
    """Whether a plain Transformers load on `device_type` fetches Hub kernels here, and what happens offline."""

    device_type: str
    transformers_version: str | None
    kernels_version: str | None
    default_on: bool  # from_pretrained without use_kernels kernelizes (read from the installed transformers)
    enabled: bool  # USE_HUB_KERNELS is not off
    offline: bool  # HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE
    missing: tuple[str, ...]  # default repos for this device type whose version is not in the local cache
    value: str | None = None  # USE_HUB_KERNELS as found

    @property
    def reaches_hub(self) -> bool:
        """A plain `from_pretrained` / Trainer run here loads Hub kernels (from the cache or the Hub)."""
        return (self.default_on and self.enabled and self.kernels_version is not None
                and self.device_type in HUB_KERNEL_DEVICE_TYPES)

    @property
    def fails_offline(self) -> bool:
        """Offline with a kernel version missing from the cache: the load raises (kernels `_versions.py`)."""
        return self.reaches_hub and self.offline and bool(self.missing)

    def reason(self) -> str:
        """One paragraph: when Transformers reaches for Hub kernels here, and the consequence."""
        if self.kernels_version is None:
            return "kernels is not installed: Transformers loads no Hub kernels"
        if not self.enabled:
            return (f"{VARIABLE}={self.value!r} turns Hub kernels off: Transformers loads none, and "
                    f"use_kernels=True is ignored with a warning")
        if not self.default_on:
            return (f"transformers {self.transformers_version} loads Hub kernels only when asked (use_kernels=True, a "
                    f"kernel attn_implementation)")
        if self.device_type not in HUB_KERNEL_DEVICE_TYPES:
            return (f"transformers {self.transformers_version}'s default kernel mapping has no {self.device_type} "
                    f"entry: a plain from_pretrained fetches no Hub kernel here")
        what = (f"transformers {self.transformers_version} with kernels {self.kernels_version} kernelizes every "
                f"from_pretrained that does not pass use_kernels=False ({VARIABLE} unset means YES), and again on "
                f"model.train() (Trainer): on {self.device_type} it loads "
                f"{', '.join(f'{r} v{v}' for r, (v, d) in DEFAULT_KERNEL_REPOS.items() if self.device_type in d)} "
                f"for the layers a model has")
        if self.fails_offline:
            return (f"{what}. The Hub is offline and {', '.join(self.missing)} are not in the local cache, so a load "
                    f"of a model with those layers raises \"Version N of '<repo>' is not available in the local "
                    f"cache\"")
        if self.missing:
            return f"{what}; {', '.join(self.missing)} are not cached yet, so an offline run would fail"
        return f"{what}; every such version is in the local cache"


def _offline(env: Mapping[str, str]) -> bool:
    value = env.get(OFFLINE_VARIABLES[0]) or env.get(OFFLINE_VARIABLES[1])  # huggingface_hub.constants
    return value is not None and value.upper() in {"1", "ON", "YES", "TRUE"}


def _default_on(transformers_version: str | None) -> bool:
    """Whether the installed transformers' `from_pretrained` turns an absent `use_kernels` into True: read from its
    `modeling_utils.py` (not imported); an unknown layout falls back to the version (5.25, where it was read)."""
    spec = importlib.util.find_spec("transformers")
    if spec is not None and spec.submodule_search_locations:
        source = Path(next(iter(spec.submodule_search_locations))) / "modeling_utils.py"
        try:
            text = source.read_text()
        except OSError:
            text = ""
        if "use_kernels is None" in text:
            after = text[text.index("use_kernels is None"):][:200]
            return "use_kernels = True" in after
    parsed = parse_version(transformers_version)
    return parsed is not None and parsed[:2] >= (5, 25)


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where kernels keeps its refs: `KERNELS_CACHE`, else the Hub cache (`HF_HUB_CACHE`, `HF_HOME/hub`)."""
    if env.get("KERNELS_CACHE"):
        return Path(env["KERNELS_CACHE"])
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    return Path(home) / "hub"


def cached(repo: str, version: int, env: Mapping[str, str]) -> bool:
    """Whether `repo`'s `version` ref is in the local cache (kernels `_get_available_versions_from_cache`)."""
    folder = "kernels--" + repo.replace("/", "--")
    return (cache_dir(env) / folder / "refs" / f"v{version}").is_file()


def hub_kernels_status(device_type: str, environ: Mapping[str, str] | None = None) -> HubKernels:
    """What a plain Transformers load on `device_type` does with Hub kernels here (see the module docstring)."""
    env = os.environ if environ is None else environ
    transformers_version = installed_version("transformers")
    kernels_version = installed_version("kernels")
    value = env.get(VARIABLE)
    enabled = value is None or value.lower() in _TRUE
    missing = tuple(f"{repo} v{version}" for repo, (version, devices) in DEFAULT_KERNEL_REPOS.items()
                    if device_type in devices and not cached(repo, version, env))
    return HubKernels(device_type, transformers_version, kernels_version,
                      _default_on(transformers_version) if transformers_version else False, enabled, _offline(env),
                      missing, value)
