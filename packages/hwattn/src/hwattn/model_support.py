"""What attention a model class declares it can run, read from its config without loading weights.

Transformers refuses an implementation the model class does not declare
(`PreTrainedModel._check_and_adjust_attn_implementation` -> `get_correct_attn_implementation`):
`sdpa` needs `_supports_sdpa`, `flex_attention` `_supports_flex_attn`, `flash_attention_N` and (from
5.25) flash hub kernels `_supports_flash_attn`; with no request it takes sdpa, else eager. These are
class attributes in Transformers 5.22-5.25, so they are read from the class the config names
(`architectures`, else the `AutoModelForCausalLM` mapping of its `model_type`) without building it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .names import EAGER, FLASH_NAMES, SDPA

#: Backend family -> the class attribute Transformers checks for it.
FLAGS: dict[str, str] = {"sdpa": "_supports_sdpa", "flash": "_supports_flash_attn", "flex": "_supports_flex_attn"}
#: Names offered as alternatives, best first (`auto`'s preference is sdpa, then eager: Transformers' default).
CANDIDATES: tuple[str, ...] = (SDPA, EAGER, *FLASH_NAMES, "flex_attention")


@dataclass(frozen=True)
class ModelSupport:
    """The attention backends a model class declares. `model_class` None: not found (nothing is checked)."""

    model_class: str | None
    source: str
    sdpa: bool = True
    flash: bool = True
    flex: bool = True
    compatible_flash: tuple[str, ...] | None = None
    transformers_version: str = ""

    @property
    def known(self) -> bool:
        """Whether a model class was found (else every backend is left to Transformers at load)."""
        return self.model_class is not None

    def supports(self, family: str | None) -> bool:
        """Whether the class declares `family` ("sdpa", "flash", "flex"; None = no requirement, e.g. eager)."""
        return family is None or not self.known or bool(getattr(self, family))

    def declaration(self, family: str) -> str:
        """`Gemma2ForCausalLM._supports_sdpa is False in transformers 5.22.2`."""
        value = getattr(self, family)
        return f"{self.model_class}.{FLAGS[family]} is {value} in transformers {self.transformers_version}"


def requirement(name: str) -> str | None:
    """The backend family Transformers checks for attention `name` (its own string rules), or None."""
    from .names import is_kernel_string

    if is_kernel_string(name):
        return "flash" if "flash" in name else None  # 5.25: a flash hub kernel needs _supports_flash_attn
    if re.fullmatch(r"flash_attention_\d", name):
        return "flash"
    if "flex_attention" in name:
        return "flex"
    if "sdpa" in name:
        return "sdpa"
    return None


def _field(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _model_class(name: str) -> type | None:
    import transformers

    try:
        found = getattr(transformers, name, None)
    except Exception:  # a lazy module whose optional dependency is missing
        return None
    return found if isinstance(found, type) and hasattr(found, "_supports_sdpa") else None


def _find(config: Any) -> tuple[type | None, str]:
    """The model class a config names, and how it was found (or why none was)."""
    from transformers.models.auto import modeling_auto

    auto_map = _field(config, "auto_map") or {}
    if isinstance(auto_map, Mapping) and "AutoModelForCausalLM" in auto_map:
        return None, (f"the config maps AutoModelForCausalLM to remote code ({auto_map['AutoModelForCausalLM']}), "
                      "whose support hwattn cannot read without running it")
    for name in _field(config, "architectures") or ():
        cls = _model_class(str(name))
        if cls is not None:
            return cls, f"{name} (config.architectures)"
    try:
        cls = modeling_auto.AutoModelForCausalLM._model_mapping[type(config)]
        if isinstance(cls, type):
            return cls, f"{cls.__name__} (AutoModelForCausalLM for {type(config).__name__})"
    except (KeyError, ValueError, TypeError, AttributeError):
        pass
    model_type = _field(config, "model_type")
    if not model_type:
        return None, "the config names neither architectures nor a model_type"
    for table, auto in ((modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "AutoModelForCausalLM"),
                        (modeling_auto.MODEL_MAPPING_NAMES, "AutoModel")):
        names = table.get(model_type)
        for name in (names,) if isinstance(names, str) else (names or ()):
            cls = _model_class(name)
            if cls is not None:
                return cls, f"{name} ({auto} for model_type {model_type!r})"
    return None, f"no Transformers model class for model_type {model_type!r}"


def model_support(model_config: Any = None, *, model_class: type | str | None = None) -> ModelSupport:
    """The attention backends the model class of `model_config` declares; no weights, no model built.

    `model_config`: a Transformers config, a config.json dict, or any object with `architectures` /
    `model_type`. `model_class` (a class or its name in `transformers`) overrides the lookup. The class named by
    `architectures` is read from its source file when possible (`hwattn.declared`: no modeling code imported),
    else imported.
    """
    if model_class is None and model_config is not None:
        found = _declared_support(model_config)
        if found is not None:
            return found
    import transformers

    if model_class is not None:
        cls = model_class if isinstance(model_class, type) else _model_class(str(model_class))
        how = f"{getattr(cls, '__name__', model_class)} (given)"
        if cls is None:
            how = f"model_class={model_class!r} is not a model class in transformers {transformers.__version__}"
    elif model_config is not None:
        cls, how = _find(model_config)
    else:
        cls, how = None, "no model config given"
    if cls is None:
        return ModelSupport(model_class=None, source=how, transformers_version=transformers.__version__)
    compatible = getattr(cls, "_compatible_flash_implementations", None)
    return ModelSupport(
        model_class=cls.__name__, source=how, sdpa=bool(getattr(cls, "_supports_sdpa", False)),
        flash=bool(getattr(cls, "_supports_flash_attn", False)), flex=bool(getattr(cls, "_supports_flex_attn", False)),
        compatible_flash=tuple(compatible) if compatible else None, transformers_version=transformers.__version__)


def _declared_support(model_config: Any) -> ModelSupport | None:
    """`model_support` for the first class of `architectures`, read from Transformers' source without importing
    it (`hwattn.declared`); None when that read does not answer (the caller imports the class)."""
    from hwenv import installed_version

    from .declared import declared_flags

    auto_map = _field(model_config, "auto_map") or {}
    names = _field(model_config, "architectures") or ()
    if (isinstance(auto_map, Mapping) and "AutoModelForCausalLM" in auto_map) or not names:
        return None
    version = installed_version("transformers")
    name = str(names[0])
    flags = declared_flags(name, _field(model_config, "model_type")) if version is not None else None
    if flags is None:
        return None
    compatible = flags["_compatible_flash_implementations"]
    return ModelSupport(
        model_class=name, source=f"{name} (config.architectures)", sdpa=bool(flags["_supports_sdpa"]),
        flash=bool(flags["_supports_flash_attn"]), flex=bool(flags["_supports_flex_attn"]),
        compatible_flash=tuple(compatible) if compatible else None, transformers_version=version)
