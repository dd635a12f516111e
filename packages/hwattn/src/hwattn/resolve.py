"""`resolve_attention`: which `attn_implementation` to load a model with on a device, and why.

Rules (fact ids from FACTS.md): `auto` is SDPA on every device (X6); `eager`, `sdpa` pass
through; `flash_attention_2` on XPU is the hub kernel `kernels-community/flash-attn2` (X7), on
CUDA and ROCm the `flash_attn` package when installed, else Transformers' hub kernel
(`kernels-community/flash-attn2`, on ROCm `kernels-community/aiter-flash-attn`); FlashAttention-3/4
only on NVIDIA (X8) with compute capability >= 8 / >= 9; on CPU, Gaudi and MPS flash requests
raise, or become SDPA with `fallback=True` (logged once). What each kind runs is a row of
`capabilities` (no kind is compared here). The tables in README.md are generated from here.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from hwenv import Accelerator

from .capabilities import NVIDIA_ONLY_FLASH, FlashSupport, flash_support, gqa_rule, hub_kernels
from .environment import AttentionEnvironment, current_environment
from .errors import (
    AcceleratorTypeError,
    AttentionUnsupportedError,
    HwattnError,
    KernelsMissingError,
    ModelAttentionError,
    UnknownAttentionError,
)
from .gqa import MAX_GQA_HEAD_DIM, model_head_dim, model_kv_groups, native_gqa, native_gqa_reason
from .model_support import CANDIDATES, ModelSupport, model_support, requirement
from .names import (
    AUTO,
    EAGER,
    FLASH_DISTRIBUTION,
    FLASH_KERNEL_DEVICES,
    FLASH_MIN_CAPABILITY,
    FLASH_NAMES,
    SDPA,
    TRUSTED_KERNEL_ORG,
    check_name,
    kernel_repo_id,
)

logger = logging.getLogger(__name__)

KERNELS_INSTALL_HINT = 'pip install "hwattn[kernels]"'

#: Hub kernel repo -> the FlashAttention version it implements (for the CUDA capability rule).
_REPO_FLASH_NAME = {
    "kernels-community/flash-attn2": "flash_attention_2",
    "kernels-community/flash-attn3": "flash_attention_3",
    "kernels-community/vllm-flash-attn3": "flash_attention_3",
    "kernels-community/flash-attn4": "flash_attention_4",
}

_logged_fallbacks: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class AttentionChoice:
    """The attention decision for one device: the `attn_implementation` value and why.

    `gqa_native`: True when grouped-query attention runs without repeating KV heads, False when
    KV heads are repeated, None when it is not fixed at load time (SDPA on CUDA/ROCm/CPU/Gaudi decides
    per call from the mask) or does not apply (a model without GQA).
    """

    implementation: str
    reason: str
    gqa_native: bool | None
    requested: str
    kernel_repo: str | None = None
    fallback: bool = False
    model_class: str | None = None

    def to_dict(self) -> dict:
        """A JSON-ready dict of every field."""
        return asdict(self)


def resolve_attention(
    accel: Accelerator,
    requested: str = AUTO,
    *,
    model_config: object | None = None,
    fallback: bool = False,
    environment: AttentionEnvironment | None = None,
    model_class: type | str | None = None,
) -> AttentionChoice:
    """Decide the `attn_implementation` for `accel` and the model; raise before any loading when it cannot run.

    `model_config` (a Transformers config, a config.json dict or a namespace of it) names the model
    class whose declared backends (`_supports_sdpa`, ...) limit the choice and refines the GQA answer;
    `model_class` overrides the class; `environment` describes the software (default: this process's).
    """
    if not isinstance(accel, Accelerator):
        raise AcceleratorTypeError(
            f"accel must be an hwenv.Accelerator, got {type(accel).__name__} {accel!r}; "
            "use hwenv.detect() or hwenv.Accelerator('xpu')."
        )
    name = check_name(requested)
    if not isinstance(fallback, bool):
        raise UnknownAttentionError(f"fallback must be True or False, got {fallback!r}.")
    env = current_environment() if environment is None else environment
    support = (model_support(model_config, model_class=model_class)
               if model_config is not None or model_class is not None else None)
    return _resolve(accel, name, model_config, fallback, env, log=True, support=support)


def _resolve(accel: Accelerator, name: str, model_config: object | None, fallback: bool,
             env: AttentionEnvironment, *, log: bool, support: ModelSupport | None = None) -> AttentionChoice:
    """`resolve_attention` after validation; `log=False` for generated tables (no fallback log lines)."""
    if support is not None and support.known:
        implementation, kernel_repo, why, fell_back = _decide_for_model(accel, name, fallback, env, support)
    else:
        implementation, kernel_repo, why, fell_back = _decide(accel, name, fallback, env)
        if support is not None:
            why += f"; model class not checked: {support.source} (Transformers checks at load)"
    if fell_back and log:
        key = (accel.kind, name)
        if key not in _logged_fallbacks:
            _logged_fallbacks.add(key)
            logger.warning("attention fallback: %s", why)
    torch_version = accel.torch_version or env.torch_version
    gqa, gqa_why = _gqa(accel.kind, torch_version, implementation, kernel_repo, _config_view(model_config))
    return AttentionChoice(
        implementation=implementation,
        reason=f"{why}; GQA: {gqa_why}",
        gqa_native=gqa,
        requested=name,
        kernel_repo=kernel_repo,
        fallback=fell_back,
        model_class=support.model_class if support is not None else None,
    )


def _config_view(model_config: object | None) -> object | None:
    """A config.json dict as attributes (its `text_config` for multimodal models), for the GQA answer."""
    from collections.abc import Mapping
    from types import SimpleNamespace

    if isinstance(model_config, Mapping):
        text = model_config.get("text_config")
        return SimpleNamespace(**(text if isinstance(text, Mapping) else model_config))
    return model_config


def _decide_for_model(accel: Accelerator, name: str, fallback: bool, env: AttentionEnvironment,
                      support: ModelSupport) -> tuple[str, str | None, str, bool]:
    """`_decide`, limited to what `support.model_class` declares (Transformers' own checks, made before loading)."""
    cls = support.model_class
    note = ""
    family = requirement(name) if name != AUTO else None
    if family == "flash" and support.compatible_flash and name not in support.compatible_flash and support.flash:
        # Transformers swaps a flash request for the model's own flash kernel (`_compatible_flash_implementations`),
        # preferring one that ships builds for this device.
        device = hub_kernels(accel.kind).kernels_device
        usable = [k for k in support.compatible_flash
                  if device in FLASH_KERNEL_DEVICES.get(kernel_repo_id(k), (device,))]
        chosen = (usable or list(support.compatible_flash))[0]
        note = f"{name} -> {chosen}: {cls} lists its compatible flash kernels ({', '.join(support.compatible_flash)}); "
        name = chosen
    if not support.supports(family):
        if not fallback:
            raise ModelAttentionError(_model_refusal(accel, name, family, support, env))
        best = _best_for_model(support)
        return best, None, (f"{note}{name} requested, but {cls} does not support {family} "
                            f"({support.declaration(family)}); fallback=True -> {best}"), True
    implementation, kernel_repo, why, fell_back = _decide(accel, name, fallback, env)
    needs = requirement(implementation) if kernel_repo is None else family
    if support.supports(needs):
        return implementation, kernel_repo, f"{note}{why}; {support.source} supports it", fell_back
    best = _best_for_model(support)
    if name == AUTO:
        why = (f"auto -> {best}: {cls} does not support {needs} ({support.declaration(needs)}; found as "
               f"{support.source}), so {best}, as Transformers itself falls back when no attention is requested")
        return best, None, why, False
    return best, None, f"{note}{why}; {cls} does not support {needs} ({support.declaration(needs)}) -> {best}", fell_back


def _best_for_model(support: ModelSupport) -> str:
    """`auto`'s choice for a model: sdpa where declared (X6), else eager (Transformers' own default)."""
    return SDPA if support.supports("sdpa") else EAGER


def _model_refusal(accel: Accelerator, name: str, family: str, support: ModelSupport,
                   env: AttentionEnvironment) -> str:
    """The error for a request the model class does not declare: the class, the backend, what it runs here."""
    alternatives = []
    for candidate in CANDIDATES:
        if not support.supports(requirement(candidate)):
            continue
        try:
            _decide(accel, candidate, False, env)
        except HwattnError:
            continue
        alternatives.append(repr(candidate))
    what = {"sdpa": "torch.nn.functional.scaled_dot_product_attention (sdpa)", "flash": "FlashAttention",
            "flex": "torch's flex_attention"}[family]
    return (f"{name!r} cannot run {support.model_class}: the model class does not support {what} "
            f"({support.declaration(family)}; found as {support.source}), so Transformers would refuse it at load. "
            f"On {accel.name} {support.model_class} runs {', '.join(alternatives)}; use one of those, 'auto' "
            f"(-> {_best_for_model(support)!r}), or pass fallback=True to get {_best_for_model(support)!r} with the "
            "fallback logged.")


def _decide(accel: Accelerator, name: str, fallback: bool,
            env: AttentionEnvironment) -> tuple[str, str | None, str, bool]:
    if name == AUTO:
        return SDPA, None, "auto -> sdpa: SDPA is Transformers' default attention on every device (X6)", False
    if name in (EAGER, SDPA):
        return name, None, f"{name} requested; it runs on every device", False
    if name == "flex_attention":
        return name, None, ("flex_attention passed through; Transformers checks at load that torch's flex "
                            "attention runs here (it compiles the kernel first, slowly on CPU)"), False
    if name == "paged|eager":
        return name, None, ("paged|eager passed through; it serves continuous batching (generate_batch) only, "
                            "not a plain forward"), False
    if name in FLASH_NAMES:
        return _flash(accel, name, fallback, env)
    return _hub_kernel(accel, name, fallback, env)


def _flash(accel: Accelerator, name: str, fallback: bool,
           env: AttentionEnvironment) -> tuple[str, str | None, str, bool]:
    support = flash_support(accel.kind)
    repo, dist = support.kernels.get(name), FLASH_DISTRIBUTION[name]
    if repo is None:
        return _flash_refused(accel, name, fallback, support)
    note = _check_capability(accel, name) if support.capability_checked else ""
    if not support.packages:
        if env.kernels_available:
            return repo, repo, (f"{name} on {support.label} is the hub kernel {repo}, which ships an "
                                f"{support.label} build ({support.source})"), False
        raise KernelsMissingError(
            f"{name!r} on {accel.name} is the hub kernel {repo!r} ({support.source}), which needs `kernels`: "
            f"{_kernels_problem()}. Fix: {KERNELS_INSTALL_HINT}, or use 'sdpa' (the default, X6)."
        )
    if env.has_flash_package(name):
        return name, None, f"{name}: the {dist} package is installed{note}", False
    if env.kernels_available:
        return repo, repo, (f"{name}: {dist} is not installed, so Transformers' hub kernel {repo} "
                            f"through `kernels`{note}"), False
    raise KernelsMissingError(
        f"{name!r} on {accel.name} needs the {dist} package or the hub kernel {repo!r}, and neither is usable: "
        f"{_kernels_problem()}. Fix: {KERNELS_INSTALL_HINT} (or pip install {dist}), or use 'sdpa'."
    )


def _flash_refused(accel: Accelerator, name: str, fallback: bool,
                   support: FlashSupport) -> tuple[str, None, str, bool]:
    """A flash version this kind does not run: fallback where the row allows it, else an error naming its own."""
    nvidia_only = name in NVIDIA_ONLY_FLASH
    if support.fallback_allowed:
        why = "FlashAttention-3/4 run only on NVIDIA GPUs (X8)" if nvidia_only else support.why_not
        return _no_flash_device(accel, name, fallback, why)
    offered = ", ".join(_offered(support, n, r) for n, r in support.kernels.items())
    rule = (f"runs only on NVIDIA GPUs (X8), not on {accel.name}" if nvidia_only
            else f"cannot run on {accel.name}: {support.why_not}")
    raise AttentionUnsupportedError(
        f"{name!r} {rule}. On {support.label} use {offered}, 'sdpa' (the default, X6) or 'eager'."
        + support.refusal_note
    )


def _offered(support: FlashSupport, name: str, repo: str) -> str:
    """`'flash_attention_2' (the hub kernel ..., X7)`: one flash version a kind runs, and through what."""
    package = f"the {FLASH_DISTRIBUTION[name]} package, else " if support.packages else ""
    return f"{name!r} ({package}the hub kernel {repo}, {support.source})"


def _hub_kernel(accel: Accelerator, name: str, fallback: bool,
               env: AttentionEnvironment) -> tuple[str, str | None, str, bool]:
    kind, repo = accel.kind, kernel_repo_id(name)
    devices, hub, support = FLASH_KERNEL_DEVICES.get(repo), hub_kernels(kind), flash_support(kind)
    if hub.kernels_device is None:
        return _no_flash_device(accel, name, fallback, hub.refused)
    if devices is not None and hub.kernels_device not in devices:
        why = f"{repo} ships builds for {', '.join(devices)} only"
        if support.fallback_allowed:
            return _no_flash_device(accel, name, fallback, why)
        offered = "".join(f", or {n!r} ({support.source})" for n in support.kernels) if support.source else ""
        raise AttentionUnsupportedError(
            f"{name!r} cannot run on {accel.name}: {why}. Use 'sdpa' (the default, X6) or 'eager'{offered}."
        )
    if not env.kernels_available:
        raise KernelsMissingError(
            f"the hub kernel {name!r} needs `kernels`: {_kernels_problem()}. Fix: {KERNELS_INSTALL_HINT}, or use 'sdpa'."
        )
    note = ""
    if support.capability_checked and repo in _REPO_FLASH_NAME:
        note = _check_capability(accel, _REPO_FLASH_NAME[repo])
    if devices is None:
        note += (f"; Transformers assumes kernels it does not list run everywhere: loading fails if {repo} "
                 f"has no {kind} build")
    if not repo.startswith(TRUSTED_KERNEL_ORG + "/"):
        note += f"; {repo} is outside {TRUSTED_KERNEL_ORG}: from_pretrained needs allow_all_kernels=True"
    return name, repo, f"hub kernel {name} requested, loaded through `kernels`{note}", False


def _no_flash_device(accel: Accelerator, name: str, fallback: bool, why: str) -> tuple[str, None, str, bool]:
    if not fallback:
        raise AttentionUnsupportedError(
            f"{name!r} cannot run on {accel.name}: {why}. Use 'sdpa' (the default, X6) or 'eager', or pass "
            "fallback=True to get 'sdpa' with the fallback logged."
        )
    return SDPA, None, f"{name} cannot run on {accel.name} ({why}); fallback=True -> sdpa", True


def _check_capability(accel: Accelerator, name: str) -> str:
    """Raise when a CUDA GPU is too old for FA3/FA4; return a note when the capability is unknown."""
    minimum = FLASH_MIN_CAPABILITY.get(name)
    if minimum is None:
        return ""
    if accel.capability is None:
        logger.info("%s needs CUDA compute capability >= %d.0; the accelerator does not say its capability, "
                       "so Transformers checks it at load", name, minimum)
        return f"; compute capability unknown, not checked here (needs >= {minimum}.0)"
    major, minor = accel.capability
    if major < minimum:
        better = "'flash_attention_3' (>= 8.0), " if name == "flash_attention_4" and major >= 8 else ""
        raise AttentionUnsupportedError(
            f"{name!r} needs CUDA compute capability >= {minimum}.0, but this GPU is {major}.{minor}. "
            f"Use {better}'flash_attention_2' or 'sdpa' (the default, X6)."
        )
    return f"; compute capability {major}.{minor} >= {minimum}.0"


def _kernels_problem() -> str:
    """Why `transformers.utils.is_kernels_available()` is False here, in words."""
    from hwenv import installed_version

    version = installed_version("kernels")
    if version is None:
        return "the `kernels` package is not installed"
    try:
        from transformers.utils.import_utils import KERNELS_MAX_VERSION, KERNELS_MIN_VERSION
    except ImportError:  # older transformers without the window constants
        return f"kernels {version} is installed but transformers.utils.is_kernels_available() is False"
    return (f"kernels {version} is installed but Transformers accepts only {KERNELS_MIN_VERSION} <= version < "
            f"{KERNELS_MAX_VERSION} (transformers.utils.is_kernels_available() is False)")


def _gqa(kind: str, torch_version: str | None, implementation: str, kernel_repo: str | None,
         model_config: object | None) -> tuple[bool | None, str]:
    groups = model_kv_groups(model_config) if model_config is not None else None
    if groups == 1:
        return None, "the model has as many KV heads as query heads (no grouped-query attention)"
    if implementation in (EAGER, "paged|eager"):
        return False, "eager attention repeats KV heads (repeat_kv)"
    if implementation == SDPA:
        head_dim = model_head_dim(model_config) if model_config is not None else None
        dims = head_dim or 64
        if gqa_rule(kind).masked_from is not None:  # the answer does not depend on the mask
            native = native_gqa(kind, torch_version, has_mask=True, key_head_dim=dims, value_head_dim=dims)
            return native, native_gqa_reason(kind, torch_version, has_mask=True, key_head_dim=dims,
                                             value_head_dim=dims)
        if not native_gqa(kind, torch_version, has_mask=False, key_head_dim=dims, value_head_dim=dims):
            return False, native_gqa_reason(kind, torch_version, has_mask=False, key_head_dim=dims,
                                            value_head_dim=dims)
        return None, (f"SDPA on {kind} uses enable_gqa only in calls without an attention mask (head dim <= "
                      f"{MAX_GQA_HEAD_DIM}), else repeats KV heads (Transformers' use_gqa_in_sdpa)")
    if implementation in FLASH_NAMES or kernel_repo in FLASH_KERNEL_DEVICES:
        return True, "FlashAttention takes fewer KV heads than query heads directly"
    return None, "decided inside the kernel"
