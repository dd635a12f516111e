"""`train()`'s options checked before any work: types, ranges, and keyword names (a misspelt keyword names the
closest valid one instead of surfacing later as another library's TypeError)."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from ..errors import TrainingConfigError
from .booleans import check_booleans
from .data import DEFAULT_MAX_DATA_BYTES
from .lora import LoraSettings
from .sharding import FSDP_CHECKPOINTS

#: `on_nonfinite` policies (hwrun.training.guard): stop (default), skip the step, ignore.
POLICIES = ("stop", "skip", "ignore")


#: TrainingArguments keywords that train() sets from its own options: the option to use instead.
SET_BY_TRAIN = {
    "num_train_epochs": "epochs", "learning_rate": "lr", "per_device_train_batch_size": "batch_size",
    "gradient_accumulation_steps": "grad_accum", "data_seed": "seed", "save_steps": "save_steps",
    "output_dir": "output_dir", "max_steps": "max_steps", "seed": "seed", "ddp_find_unused_parameters": None,
}

_BOOLEAN = ("qlora", "merge", "fused_loss", "fused_projections", "plot", "overwrite", "packing")
#: Deprecated switches (a FutureWarning names the replacement): True, False, or None (not given).
_OPTIONAL_BOOLEAN = ("rope_table",)
_INTEGER = {"batch_size": 1, "grad_accum": 1, "block_size": 2, "save_steps": 1, "max_data_bytes": 1}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def training_argument_names() -> frozenset[str]:
    """Every keyword `transformers.TrainingArguments` takes."""
    from transformers import TrainingArguments

    return frozenset(f.name for f in fields(TrainingArguments) if f.init)


def check_overrides(overrides: Mapping[str, Any], train_options: Sequence[str]) -> None:
    """Refuse extra keywords that are not TrainingArguments keywords (naming the closest valid name) or that
    train() sets itself from one of its own options (which would collide as a TypeError)."""
    if not overrides:
        return
    valid = training_argument_names()
    for name in overrides:
        if name in SET_BY_TRAIN:
            own = SET_BY_TRAIN[name]
            use = f"pass {own}= instead" if own else "hwrun sets it for its fused layers; leave it out"
            raise TrainingConfigError(
                f"train(..., {name}=...) is a TrainingArguments keyword that train() sets itself; {use}."
            )
        if name not in valid:
            close = difflib.get_close_matches(name, [*train_options, *sorted(valid)], n=1, cutoff=0.6)
            hint = ""
            if close and close[0] in SET_BY_TRAIN and close[0] not in train_options:
                own = SET_BY_TRAIN[close[0]]
                hint = f" Did you mean {own}= (TrainingArguments' {close[0]}, which train() sets from it)?" if own \
                    else ""
            elif close:
                hint = f" Did you mean {close[0]}=?"
            raise TrainingConfigError(
                f"train() got an unknown keyword {name}=: it is neither one of train()'s options nor a "
                f"transformers.TrainingArguments keyword.{hint} Fix the name (train()'s options are listed in "
                "hwrun.train's docstring)."
            )
    from transformers import TrainingArguments

    check_booleans(overrides, TrainingArguments, "train(..., {name}={value!r})")


def check_numbers(epochs: Any, max_steps: Any, lr: Any, batch_size: Any, grad_accum: Any, block_size: Any,
                  seed: Any, save_steps: Any, max_data_bytes: Any = DEFAULT_MAX_DATA_BYTES) -> None:
    """Every numeric option's type and range at once (bools are not numbers here: max_steps=True is refused)."""
    problems = []
    if not (_is_int(seed) and 0 <= seed < 2**32):
        problems.append(f"seed={seed!r} (must be an int in 0..2**32-1, numpy's seed range)")
    values = {"batch_size": batch_size, "grad_accum": grad_accum, "block_size": block_size, "save_steps": save_steps,
              "max_data_bytes": max_data_bytes}
    for name, least in _INTEGER.items():
        value = values[name]
        if not (_is_int(value) and value >= least):
            why = " (checkpoints are what resume needs)" if name == "save_steps" else ""
            problems.append(f"{name}={value!r} (must be an int >= {least}{why})")
    if not (_is_number(lr) and lr > 0 and math.isfinite(lr)):
        problems.append(f"lr={lr!r} (must be a positive finite number)")
    if not _is_int(max_steps) or (max_steps < 1 and max_steps != -1):
        problems.append(f"max_steps={max_steps!r} (must be an int >= 1, or -1 to use epochs)")
    if max_steps == -1 and not (_is_number(epochs) and epochs > 0 and math.isfinite(epochs)):
        problems.append(f"epochs={epochs!r} (must be a finite number > 0 when max_steps=-1)")
    elif not _is_number(epochs):
        problems.append(f"epochs={epochs!r} (must be a number)")
    if problems:
        raise TrainingConfigError("Invalid training options: " + "; ".join(problems) + ". Fix those values.")


def check_kinds(options: Mapping[str, Any]) -> None:
    """The non-numeric options: flags are True/False, callbacks a list, echo a function, the policy a name."""
    problems = [f"{name}={options[name]!r} (must be True or False)"
                for name in _BOOLEAN if name in options and not isinstance(options[name], bool)]
    problems += [f"{name}={options[name]!r} (must be True, False or None; deprecated: use kernels=)"
                 for name in _OPTIONAL_BOOLEAN if options.get(name) is not None and not isinstance(options[name], bool)]
    policy = options.get("on_nonfinite", "stop")
    if policy not in POLICIES:
        problems.append(f"on_nonfinite={policy!r} (must be one of {', '.join(map(repr, POLICIES))})")
    callbacks = options.get("callbacks", ())
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Sequence):
        problems.append(f"callbacks={callbacks!r} (must be a list of transformers.TrainerCallback)")
    echo = options.get("echo")
    if echo is not None and not callable(echo):
        problems.append(f"echo={echo!r} (must be a function taking one line, e.g. print, or None)")
    for name in ("text_field", "messages_field"):
        value = options.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            problems.append(f"{name}={value!r} (must be a column name, or None)")
    kind = options.get("fsdp_checkpoint")
    if kind is not None and (not isinstance(kind, str) or kind not in FSDP_CHECKPOINTS):
        problems.append(f"fsdp_checkpoint={kind!r} (must be {' or '.join(map(repr, FSDP_CHECKPOINTS))}: the kind of "
                        "FSDP checkpoint, or None for what fsdp_config says)")
    template = options.get("chat_template")
    if template is not None and (not isinstance(template, (str, os.PathLike)) or not str(template).strip()):
        problems.append(f"chat_template={template!r} (must be a Jinja file's path or the template text, or None)")
    data = options.get("data")
    if not isinstance(data, (str, os.PathLike)) and not (hasattr(data, "__getitem__") or hasattr(data, "__iter__")):
        problems.append(f"data={data!r} (must be a path to a text/JSONL file or folder, or a dataset)")
    if problems:
        raise TrainingConfigError("Invalid training options: " + "; ".join(problems) + ". Fix those values.")


def check_plan(plan: Any) -> None:
    """`plan` must be a RunPlan (hwrun.plan(...) or train_plan(...)), not a model name."""
    from ..model.plan import RunPlan

    if not isinstance(plan, RunPlan):
        raise TrainingConfigError(
            f"train()'s first argument is {plan!r}, not a RunPlan. Fix: hwrun.train(hwrun.plan({plan!r}), data, ...) "
            "or hwrun.training.train_plan(...) for a plan with training's compile default."
            if isinstance(plan, (str, os.PathLike)) else
            f"train()'s first argument is a {type(plan).__name__}, not a RunPlan. Fix: pass hwrun.plan(...)."
        )


def lora_settings(lora: Any, qlora: bool) -> LoraSettings | None:
    """The LoRA settings `lora` (True, a LoraSettings, a dict, None/False) asks for; QLoRA implies LoRA."""
    if lora is None or lora is False:
        return LoraSettings() if qlora else None
    if lora is True:
        return LoraSettings()
    if isinstance(lora, LoraSettings):
        return lora
    if isinstance(lora, Mapping):
        known = {"r", "alpha", "dropout", "target_modules"}
        extra = {k: v for k, v in lora.items() if k not in known}
        base = {k: v for k, v in lora.items() if k in known}
        if "target_modules" in base and base["target_modules"] is not None:
            base["target_modules"] = tuple(base["target_modules"])
        return LoraSettings(**base, extra=extra)
    raise TrainingConfigError(
        f"lora={lora!r} is not understood; pass True, a LoraSettings, a dict such as "
        "{'r': 16, 'target_modules': ['q_proj', 'v_proj']}, or None/False for full fine-tuning."
    )


def check_all(plan: Any, options: Mapping[str, Any]) -> None:
    """Every check above but `check_overrides` (which imports transformers), before anything is read, loaded or
    written."""
    check_plan(plan)
    check_kinds(options)
    check_numbers(options["epochs"], options["max_steps"], options["lr"], options["batch_size"],
                  options["grad_accum"], options["block_size"], options["seed"], options["save_steps"],
                  options["max_data_bytes"])
