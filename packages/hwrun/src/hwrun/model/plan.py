"""`plan()`: every decision for running a model here (device, dtype, device_map, attention, compile,
collectives, env), each with its reason, made before anything loads; `RunPlan` holds them.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import devices
from ..errors import PlanError
from .adapters import adapter_base_model, check_adapter_weights, is_adapter_folder
from .quantization import plan_quantization
from .source import (
    DEFAULT_MODEL,
    ModelSource,
    model_config,
    needs_remote_code,
    resolve_source,
    weight_bytes,
)

if TYPE_CHECKING:
    import hwattn
    import hwcompile
    import hwdist
    import hwenv
    import torch

logger = logging.getLogger(__name__)

#: `plan(device=AUTO)` detects the accelerator (hwenv.detect).
AUTO = "auto"
#: dtype spellings accepted, mapped to the torch attribute name.
DTYPES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}
#: Fraction of one device's memory the weights may take and still count as "fits" (the rest is
#: left for the KV cache and activations).
FIT_FRACTION = 0.85

#: What runs a model larger than one device where a process uses only one (Gaudi, `Platform.devices_per_process`).
BIGGER_THAN_ONE_DEVICE = ("Larger than one card: for training use QLoRA (quantization='4bit' with LoRA adapters, G11); "
                          "for inference, tensor parallelism with one process per card: tp=N "
                          "(hwrun generate --tp N, hwrun serve --tp N).")

#: Per kind: the fact ids (FACTS.md) or rule behind "this device has bf16", for the dtype reason.
#: How bf16 was read on the machine comes from the accelerator (`bf16_source`, hwenv's probe).
BF16_FACTS: dict[str, str] = {
    "hpu": "G12",
    "xpu": "X10, X17",
    "rocm": "is_bf16_supported() of torch's cuda module on a HIP build",
    "cuda": "compute capability >= 8",
    "mps": "",
    "cpu": "",
}
#: Per kind: the fact ids behind placing the weights with a device_map there (X9 one device / split).
DEVICE_MAP_FACTS: dict[str, str] = {"hpu": "G9", "xpu": "X9", "rocm": "X9", "cuda": "X9", "mps": "X9", "cpu": "X9"}
#: Per kind: variables a run needs set, and why. A platform's own rules (`hwenv.run_environment`: on Gaudi
#: PT_ENABLE_INT64_SUPPORT=1 only in eager mode on Gaudi 2+, the bridge's env_flags.yaml) are added to the row.
PLAN_ENV: dict[str, tuple[dict[str, str], str]] = {
    "hpu": ({}, "the Gaudi variables hwenv.run_environment decides"),
    "xpu": ({}, "no variables needed on this device"),
    "rocm": ({}, "no variables needed on this device"),
    "cuda": ({}, "no variables needed on this device"),
    "mps": ({}, "no variables needed on this device"),
    "cpu": ({}, "no variables needed on this device"),
}


@dataclass(frozen=True)
class RunPlan:
    """Every decision for one run, with `reasons[field]` saying why; build with `plan()`."""

    model: str
    accelerator: hwenv.Accelerator
    device: str
    device_map: str | dict | None
    dtype: str
    attention: hwattn.AttentionChoice
    use_kernels: bool
    compile: hwcompile.CompileDecision | None
    quantization: str | None
    env: dict[str, str]
    trust_remote_code: bool
    dist_backend: hwdist.BackendChoice
    weight_bytes: int | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    adapter: str | None = None  # a LoRA adapter folder loaded on top of `model` (its base)
    #: the checked source `plan()` resolved `model` to (config, weight files), so a run reads it once
    source: ModelSource | None = field(default=None, compare=False, repr=False)
    #: processes the model is split across with Transformers' tensor-parallel plan (1: this process alone)
    tp: int = 1
    #: how they split it (`hwrun.parallel.checks.TensorParallelPlan`), when `tp` > 1
    parallel: Any = None
    #: torchao int8/int4 weight-only quantize-on-load also quantizes the LM head (an untied copy); False keeps it
    quantize_lm_head: bool = True
    #: fp8-inc: the Intel Neural Compressor FP8 config (QUANTIZE mode, measured) `load()` converts the model with
    inc_config: str | None = None

    def model_source(self) -> ModelSource:
        """`model`'s checked source: the one `plan()` resolved, or resolved now for a plan built otherwise (or whose
        `model` was replaced since)."""
        source = self.source
        same = source is not None and (str(source.path) if source.local else source.reference) == self.model
        # a local folder whose weights changed since plan() (replaced, converted) is checked again
        if same and all(f.is_file() for f in source.safetensors) and (not source.local or source.path.is_dir()):
            return source
        return resolve_source(self.model)

    def torch_dtype(self) -> torch.dtype:
        """The torch dtype object for `dtype`."""
        import torch

        return getattr(torch, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field's value (nested choices as dicts) plus `reasons`."""
        compile_backend = None
        if self.compile is not None:
            backend = self.compile.backend
            compile_backend = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
        return {
            "model": self.model,
            "accelerator": self.accelerator.to_dict(),
            "device": self.device,
            "device_map": self.device_map,
            "dtype": self.dtype,
            "attention": {
                "implementation": self.attention.implementation,
                "requested": self.attention.requested,
                "gqa_native": self.attention.gqa_native,
                "kernel_repo": self.attention.kernel_repo,
                "fallback": self.attention.fallback,
                "model_class": getattr(self.attention, "model_class", None),  # whose declared support was read
                "reason": self.attention.reason,
            },
            "use_kernels": self.use_kernels,
            "compile": None if self.compile is None else {
                "backend": compile_backend, "requested": _jsonable(self.compile.requested),
                "warned": self.compile.warned, "reason": self.compile.reason,
            },
            "quantization": self.quantization,
            "quantize_lm_head": self.quantize_lm_head,
            "inc_config": self.inc_config,
            "env": dict(self.env),
            "trust_remote_code": self.trust_remote_code,
            "dist_backend": {
                "name": self.dist_backend.name, "ddp_backend": self.dist_backend.ddp_backend,
                "reason": self.dist_backend.reason,
            },
            "weight_bytes": self.weight_bytes,
            "adapter": self.adapter,
            "tp": self.tp,
            "tensor_parallel": None if self.parallel is None else self.parallel.to_dict(),
            "reasons": dict(self.reasons),
        }

    def rows(self) -> list[tuple[str, str, str]]:
        """(field, value, reason) rows in display order, as `render()` and `hwrun plan` show them."""
        data = self.to_dict()
        compile_value = "off" if self.compile is None else str(data["compile"]["backend"])
        values = {
            "model": self.model,
            "device": f"{self.device} ({self.accelerator.count} x {self.accelerator.kind})",
            "dtype": self.dtype,
            "device_map": str(self.device_map),
            "attention": self.attention.implementation,
            "use_kernels": str(self.use_kernels),
            "compile": compile_value,
            "quantization": str(self.quantization),
            "dist_backend": self.dist_backend.name,
            "env": " ".join(f"{k}={v}" for k, v in self.env.items()) or "(none)",
            "trust_remote_code": str(self.trust_remote_code),
        }
        rows = [(name, values[name], self.reasons.get(name, "")) for name in values]
        if self.parallel is not None:  # tp > 1: the processes, then how the model is split, one part a row
            rows.append(("tensor_parallel", f"tp={self.tp}, {self.parallel.backend}",
                         self.reasons.get("tensor_parallel", "")))
            rows += [("  split", "", line) for line in self.parallel.split]
        return rows

    def render(self, extra: Sequence[tuple[str, str, str]] = ()) -> str:
        """A plain-text table of every decision and its reason (`extra` rows appended, e.g. the decode path)."""
        rows = [*self.rows(), *extra]
        width_f = max(len(r[0]) for r in rows)
        width_v = min(40, max(len(r[1]) for r in rows))
        lines = [f"{'field'.ljust(width_f)}  {'value'.ljust(width_v)}  reason",
                 f"{'-' * width_f}  {'-' * width_v}  {'-' * 6}"]
        for name, value, reason in rows:
            lines.append(f"{name.ljust(width_f)}  {value.ljust(width_v)}  {reason}")
        return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return getattr(value, "__name__", repr(value))


def resolve_accelerator(device: Any) -> hwenv.Accelerator:
    """The accelerator for `device`: "auto" detects (hwenv), a kind is probed and must be usable here,
    an `hwenv.Accelerator` is used as given (to plan for another machine)."""
    import hwenv

    if isinstance(device, hwenv.Accelerator):
        return device
    known = devices.kinds()
    if not isinstance(device, str):
        raise PlanError(f"device={device!r} is not a device; use 'auto' or one of {', '.join(known)}.")
    kind = device.strip().lower()
    if kind == AUTO:
        return hwenv.detect()
    if kind.split(":")[0] in known and ":" in kind:
        raise PlanError(
            f"device={device!r}: hwrun plans for a device kind, not an index; pass {kind.split(':')[0]!r} and "
            "choose devices with `hwenv exec --devices N -- ...` (X4)."
        )
    if kind not in known:
        raise PlanError(f"device={device!r} is not a device kind hwrun knows; use 'auto' or one of {', '.join(known)}.")
    detected = hwenv.detect()
    if detected.kind == kind:
        return detected
    result = hwenv.run_probe(kind)
    if not result.available:
        raise PlanError(
            f"device={device!r} is not usable here: {result.reason}. Use device='auto' (detected: "
            f"{detected.kind}) or install that device's stack."
        )
    return hwenv.Accelerator(
        kind=result.kind, count=result.count, names=result.names, bf16=result.bf16, memory=result.memory,
        capability=result.capability, torch_version=hwenv.installed_version("torch"),
        transformers_version=hwenv.installed_version("transformers"),
        accelerate_version=hwenv.installed_version("accelerate"), source="given", reasons=(),
        bf16_source=result.bf16_source, memory_source=result.memory_source,
    )


def check_environment(accel: hwenv.Accelerator, *, planned_elsewhere: bool) -> str:
    """Refuse an invalid device selection or Gaudi flag in this process's environment (the parser
    `hwdist launch` and `hwenv doctor` use), before anything loads; returns a note for the device reason."""
    import hwenv

    if planned_elsewhere:
        return "planned for the given accelerator; this machine's selection variables were not read"
    try:
        hwenv.validate_selection(accel.kind, device_count=accel.count or None)
        for platform in hwenv.platforms():
            # a selection that hides every device of its kind makes detection fall back (an invalid
            # ZE_AFFINITY_MASK plans the CPU): a set variable of any kind is checked, not only the detected one's
            # ('-1' is the usual way to hide every GPU on purpose, and is kept)
            values = [os.environ.get(name, "").strip() for name in platform.visible_devices]
            if platform.kind != accel.kind and any(value not in ("", "-1") for value in values):
                hwenv.validate_selection(platform.kind)
        if accel.platform.lazy_mode_variable:
            mode = hwenv.validate_gaudi_flags()
            return f"{mode.name} mode ({mode.reason})"
    except hwenv.HwenvError as exc:
        raise PlanError(f"invalid device selection (planning for {accel.kind}): {exc}") from exc
    return ""


def environment_as_loaded(needed: dict[str, str], reason: str, environ: Any) -> tuple[dict[str, str], str]:
    """The variables loading will run with: hwrun's where unset, the user's own value where set (load()
    keeps it and warns), so the plan never shows a value other than the one the run uses."""
    env = {}
    kept = []
    for name, value in needed.items():
        have = environ.get(name)
        if have is not None and have != value:
            env[name] = have
            kept.append(f"{name}={have} is set by you and kept (hwrun would set {value})")
        else:
            env[name] = value
    if kept:
        reason = f"{'; '.join(kept)}; {reason}"
    return env, reason


def check_compile_backend(name: str, accel: hwenv.Accelerator) -> None:
    """A backend name must be one torch.compile knows here (or the platform's own, e.g. Gaudi's `hpu_backend`,
    which its plugin registers on import); a misspelt one is a PlanError naming the closest, before loading."""
    import difflib

    from torch._dynamo import list_backends

    common = set(list_backends()) | {"inductor", "eager", accel.platform.compile_backend}
    if name in common or name in list_backends(exclude_tags=()):
        return
    close = difflib.get_close_matches(name, sorted(common), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise PlanError(f"compile={name!r} is not a torch.compile backend here; {hint}common ones: "
                    f"{', '.join(sorted(common))} (torch._dynamo.list_backends()), or compile=True for the device's default.")


def choose_dtype(accel: hwenv.Accelerator, dtype: str) -> tuple[str, str]:
    """(dtype, reason): bf16 where the accelerator computes it natively, fp32 on the host; an explicit
    bf16 without support is an error. The reason names how bf16 was read (`accel.bf16_source`, X17):
    an integrated Intel GPU emulates bf16 only, so it gets float32 with that reason."""
    if not isinstance(dtype, str) or (dtype != "auto" and dtype.lower() not in DTYPES):
        raise PlanError(f"dtype={dtype!r} is not a dtype hwrun loads; use 'auto', 'bfloat16', 'float16' or 'float32'.")
    read = accel.bf16_source
    if dtype == "auto":
        if not accel.platform.is_accelerator:
            return "float32", ("CPU: float32 is the reference precision and fast everywhere; bf16 matmuls on CPU "
                               "are slow without AMX (pass dtype='bfloat16' to force)")
        if accel.bf16:
            fact = devices.row(BF16_FACTS, accel.kind, "")
            source = f"; read by {read}" if read else ""
            return "bfloat16", f"{accel.kind} supports bf16 ({fact}{source}): half the memory of fp32, same range"
        if accel.bf16_emulated:  # torch says yes by counting emulation: usable, slow (X17)
            return "float32", (f"{accel.kind} runs bf16 emulated only ({read or 'X17'}), so float32 for speed; pass "
                               "dtype='bfloat16' to use it anyway (torch and TrainingArguments accept it)")
        return "float32", (f"{accel.kind} reports no bf16 support ({read or 'X17'}), so float32; pass "
                           "dtype='float16' for half precision")
    name = DTYPES[dtype.lower()]
    if name == "bfloat16" and accel.platform.is_accelerator and not accel.bf16 and accel.bf16_emulated:
        return name, (f"given; {accel.kind} runs bf16 emulated, not natively ({read or 'X17'}): it runs, slowly, as "
                      f"torch's default is_bf16_supported() and TrainingArguments(bf16=True) accept it")
    if name == "bfloat16" and accel.platform.is_accelerator and not accel.bf16:
        raise PlanError(
            f"dtype={dtype!r} but {accel.name} ({', '.join(accel.names) or accel.kind}) does not support bfloat16 "
            f"({read or 'torch reports no bf16'}, X17); use dtype='float16' or 'float32', or dtype='auto'."
        )
    return name, "given"


def choose_device_map(accel: hwenv.Accelerator, nbytes: int | None, how: str) -> tuple[str, str]:
    """(device_map, reason): one device when the weights fit it, "auto" to split across devices when not (X9).

    Device memory is what hwenv's probe read (`accel.memory`: `mem_get_info()` of the Gaudi bridge,
    `mem_get_info` on XPU as Accelerate reads it); the reason says where it came from, and
    when it could not be read, that one device was assumed (`accel.memory_source` says why).
    Where a process can use only one of the visible devices (`Platform.devices_per_process`, Gaudi),
    "auto" offloads to CPU instead of splitting, and the reason says what runs a bigger model.
    """
    one = accel.device_type
    if not accel.platform.is_accelerator:
        return one, f"CPU run; weights {_size(nbytes)} ({how})"
    per_device = accel.memory_per_device
    fact = devices.row(DEVICE_MAP_FACTS, accel.kind, "X9")
    read = f"; memory: {accel.memory_source}" if accel.memory_source else ""
    if nbytes is None:
        return one, f"one {accel.kind} device ({fact}); weight size unknown, so no split ({how})"
    if per_device is None:
        why = accel.memory_source or "the accelerator reports no memory size"
        logger.info("device memory unknown (%s): planning one %s device for %s of weights",
                    why, accel.kind, _size(nbytes))
        return one, (f"one {accel.kind} device ({fact}); device memory unknown ({why}): assumed the weights "
                     f"({_size(nbytes)}) fit one device, so no split; plan with hwenv.Accelerator(..., memory=...) "
                     f"to split by known sizes ({how})")
    budget = int(per_device * FIT_FRACTION)
    if nbytes <= budget:
        return one, (f"weights {_size(nbytes)} fit one {accel.kind} ({_size(per_device)}, {FIT_FRACTION:.0%} "
                     f"budget) so device_map={one!r} ({fact}; {how}{read})")
    usable = accel.platform.usable_devices(accel.count)
    if usable > 1:
        needed = math.ceil(nbytes / budget)
        enough = (f"at least {needed} of them" if needed <= usable
                  else f"{needed} would be needed, so accelerate offloads the rest to CPU memory (slow)")
        return "auto", (f"weights {_size(nbytes)} exceed one {accel.kind}'s budget ({_size(budget)}): "
                        f"split across the {accel.count} selected devices, {enough} ({fact}; {how}{read})")
    if usable < accel.count:  # one device per process (Gaudi): the other visible cards are not this process's
        logger.warning("weights %s exceed one %s device's budget %s and a process uses only one of the %d: "
                       "device_map='auto' offloads to CPU", _size(nbytes), accel.kind, _size(budget), accel.count)
        return "auto", (f"weights {_size(nbytes)} exceed one {accel.kind} device ({_size(budget)} budget), and "
                        f"{accel.platform.devices_per_process_note}: of the {accel.count} visible devices accelerate "
                        f"keeps {accel.device} and offloads the rest to CPU memory (slow), it does not split. "
                        f"{BIGGER_THAN_ONE_DEVICE} ({how}{read})")
    logger.warning("weights %s exceed the only %s device's budget %s: device_map='auto' offloads to CPU",
                   _size(nbytes), accel.kind, _size(budget))
    bigger = f" {BIGGER_THAN_ONE_DEVICE}" if accel.platform.devices_per_process is not None else ""
    return "auto", (f"weights {_size(nbytes)} exceed the only {accel.kind} device ({_size(budget)} budget): "
                    f"accelerate offloads the rest to CPU memory (slow){read}.{bigger}")


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def plan(
    model: str | None = None,
    device: Any = "auto",
    dtype: str = "auto",
    attention: str = "auto",
    use_kernels: bool = False,
    compile: bool | str = False,
    quantization: str | None = None,
    trust_remote_code: bool = False,
    tp: int = 1,
    quantize_lm_head: bool = True,
    inc_config: str | os.PathLike | None = None,
) -> RunPlan:
    """Decide how to run `model` (default: the shipped tiny model) here; nothing loads. Raises PlanError.
    `tp=N` splits it across N processes, one per device, with Transformers' tensor-parallel plan
    (`hwrun.parallel`; TensorParallelError, a PlanError, when it cannot run here). `quantize_lm_head=False` keeps the
    LM head in the planned dtype under torchao int8/int4 weight-only quantize-on-load (default: quantized too).
    `inc_config=PATH` (quantization='fp8-inc'): Intel Neural Compressor's QUANTIZE-mode FP8 config of an already
    measured model (else $QUANT_CONFIG, INC's convention); checked before load, converted with after it."""
    import hwattn
    import hwcompile
    import hwdist
    import hwenv

    if not isinstance(use_kernels, bool):
        raise PlanError(f"use_kernels={use_kernels!r} must be True or False.")
    if not isinstance(trust_remote_code, bool):
        raise PlanError(f"trust_remote_code={trust_remote_code!r} must be True or False.")
    if not isinstance(quantize_lm_head, bool):
        raise PlanError(f"quantize_lm_head={quantize_lm_head!r} must be True or False.")
    from ..parallel.checks import check_tp_value

    tp = check_tp_value(tp)
    if not (isinstance(compile, bool) or (isinstance(compile, str) and compile)):
        raise PlanError(f"compile={compile!r} must be True, False, or a torch.compile backend name such as 'inductor'.")
    reference = DEFAULT_MODEL if model is None else model
    accel = resolve_accelerator(device)
    selection_note = check_environment(accel, planned_elsewhere=not isinstance(device, str))
    adapter = None
    if isinstance(reference, (str, os.PathLike)) and is_adapter_folder(reference):
        # `hwrun train` without --merge saves only the LoRA adapter: plan its base, load both.
        adapter = str(Path(reference).resolve())
        check_adapter_weights(adapter)  # safetensors only: a pickle-only adapter is refused before anything loads
        reference = adapter_base_model(adapter)
    source = resolve_source(reference)
    remote = needs_remote_code(source.config)
    if remote and not trust_remote_code:
        raise PlanError(f"model={source.reference!r}: {remote}. Running it means running that code: read it first, then "
                        "pass trust_remote_code=True (--trust-remote-code). hwrun never turns this on by itself.")
    reasons: dict[str, str] = {}
    shipped = source.local and source.path == Path(DEFAULT_MODEL).resolve()
    reasons["model"] = ("the tiny model shipped in hwrun" if shipped
                        else ("local folder" if source.local else "Hub id (loaded from the cache or the Hub)"))
    if adapter is not None:
        reasons["model"] += f"; base of the LoRA adapter {adapter} (adapter_config.json)"
    reasons["device"] = (f"{accel.source}: {accel.name}" if not isinstance(device, str) or device == "auto"
                         else f"given: device={device!r}")
    dtype_name, reasons["dtype"] = choose_dtype(accel, dtype)
    # every method of hwrun's quantization table, and a pre-quantized checkpoint's own config (issue 43)
    quant = plan_quantization(quantization, accel, dtype_name, model_config(source),
                              quantize_lm_head=quantize_lm_head, inc_config=inc_config)
    reasons["quantization"] = quant.reason
    nbytes, how = weight_bytes(source, dtype_name, quant.size_key)
    # tp > 1: no device_map (each rank loads its shards; below), so no single-device split or offload is chosen
    device_map, reasons["device_map"] = (choose_device_map(accel, nbytes, how) if tp == 1
                                         else (None, f"weights {_size(nbytes)} ({how})"))

    try:
        choice = hwattn.resolve_attention(accel, attention, model_config=model_config(source))
    except ValueError as exc:
        raise PlanError(f"attention={attention!r}: {exc}") from exc
    reasons["attention"] = choice.reason
    reasons["use_kernels"] = (
        "from_pretrained(use_kernels=True) swaps supported layers for Hub kernels (X12, X13)" if use_kernels
        else "off: the model's own layers (pass use_kernels=True for Hub kernels, X12)"
    )
    hub = hwenv.hub_kernels_status(accel.device_type)  # what a plain Transformers load does here (issue 41.9)
    if hub.reaches_hub:
        offline = "; offline this fails now" if hub.fails_offline else ""
        reasons["use_kernels"] += (f"; hwrun loads with use_kernels={use_kernels}, but a plain from_pretrained/Trainer "
                                   f"here turns Hub kernels on by itself ({hub.reason()}){offline}. Fix for runs that "
                                   f"must work offline: USE_HUB_KERNELS=NO, or fetch them once online")
    if isinstance(compile, str):
        check_compile_backend(compile, accel)
    if compile is False:
        decision = None
        reasons["compile"] = "off (pass compile=True to compile the decode step)"
    else:
        decision = hwcompile.route_backend(accel, None if compile is True else compile)
        reasons["compile"] = decision.reason
    dist = hwdist.backend_for(accel)
    reasons["dist_backend"] = dist.reason
    needed_env, reasons["env"] = devices.row(PLAN_ENV, accel.kind, ({}, "no variables hwrun knows for this device"))
    if accel.platform.run_env is not None:  # the platform's own rules (Gaudi: int64 only where supported)
        platform_env, reasons["env"] = hwenv.run_environment(accel)
        needed_env = {**needed_env, **platform_env}
    env, reasons["env"] = environment_as_loaded(needed_env, reasons["env"], os.environ)
    if selection_note:
        reasons["device"] += f"; {selection_note}"
    parallel = None
    if tp > 1:
        from ..parallel.checks import plan_tensor_parallel
        from .source import DTYPE_BYTES, safetensors_tensors

        parallel = plan_tensor_parallel(accel, model_config(source), tp, weight_bytes=nbytes,
                                        planned_elsewhere=not isinstance(device, str), quantization=quant.value,
                                        adapter=adapter, fit_fraction=FIT_FRACTION,
                                        tensors=safetensors_tensors(source.safetensors) if source.safetensors else None,
                                        per_element=DTYPE_BYTES.get(dtype_name))
        reasons["tensor_parallel"] = parallel.reason
        device_map = None
        reasons["device_map"] = (f"none: with tp={tp} each rank loads only its shards onto its own device (local rank "
                                 f"r on device r; Transformers' tensor parallelism and device_map are exclusive); "
                                 f"{reasons['device_map']}")
    reasons["trust_remote_code"] = ("given: the model's own Python code will run" if trust_remote_code
                                    else "off: only Transformers' built-in model code runs")
    return RunPlan(
        model=str(source.path) if source.local else source.reference,
        accelerator=accel,
        device=accel.device,
        device_map=device_map,
        dtype=dtype_name,
        attention=choice,
        use_kernels=use_kernels,
        compile=decision,
        quantization=quant.value,
        env=env,
        trust_remote_code=trust_remote_code,
        dist_backend=dist,
        weight_bytes=nbytes,
        reasons=reasons,
        adapter=adapter,
        source=source,
        tp=tp,
        parallel=parallel,
        quantize_lm_head=quantize_lm_head,
        inc_config=quant.inc_config,
    )
