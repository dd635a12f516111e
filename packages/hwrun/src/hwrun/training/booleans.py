"""Boolean fields of another library's dataclass checked before they reach it: a string such as "false" is truthy
and would switch the option on (issue 42). Its own module so `options` and `lora` both import it without a circle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ..errors import TrainingConfigError


def check_booleans(values: Mapping[str, Any], owner: type, where: str) -> None:
    """Values for `owner`'s (a dataclass: TrainingArguments, peft's LoraConfig) fields typed `bool` must be True or
    False: a string such as "false" is truthy and would switch the option on (issue 42). `where` names the caller's
    spelling, a format string of `name` and `value` (e.g. "train(..., {name}={value!r})")."""
    types = {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
             for f in fields(owner)}
    for name, value in values.items():
        kind = str(types.get(name, "")).replace(" ", "")
        if kind not in ("bool", "bool|None", "Optional[bool]", "None|bool") or isinstance(value, bool):
            continue
        if value is None and kind != "bool":
            continue
        hint = (f" ({value!r} is a string, which counts as True)" if isinstance(value, str) else "")
        raise TrainingConfigError(f"{where.format(name=name, value=value)} must be True or False{hint}. Fix: pass "
                                  f"{name}={str(value).strip().lower() in ('1', 'true', 'yes', 'on')}.")
