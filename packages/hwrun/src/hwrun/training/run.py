"""`train(plan, data, ...)`: fine-tune with Transformers' `Trainer` (LoRA via PEFT, 4-bit QLoRA via
bitsandbytes), atomic resumable checkpoints, a clean stop on SIGTERM/SIGINT, and the final model
(adapter or merged) saved as safetensors into `output_dir`.

`train()` runs its phases one after the other, each a small function: validate the options, prepare the
output folder (and what to resume from), prepare the data, build the arguments, load the model, patch it,
train, save. Nothing is read, loaded or written before every option is checked; a run that fails undoes its
model patches and leaves no folder it created for nothing.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    CheckpointError,
    NonFiniteLossError,
    QLoRAUnsupportedError,
    TrainingConfigError,
    TrainingDivergedError,
)
from . import output
from .checkpoints import checkpoint_run, choose_resume, finished_at, schedule_change, trainer_state
from .data import DEFAULT_MAX_DATA_BYTES
from .full_checkpoints import safetensors_full_checkpoints
from .kbit import check_quantized_base
from .kbit import fusion_blocker as quantized_blocker
from .lora import LoraSettings, lora_config, lora_targets
from .options import check_all, check_overrides, lora_settings
from .patching import PatchOptions, PatchStack, patch_base, patch_last, patch_lora
from .resume_match import check_resume_matches, data_sha256
from .sharding import check_fsdp_resume, with_fsdp_checkpoint
from .sharding import fusion_blocker as _fusion_blocker

if TYPE_CHECKING:
    from hwrun.model.plan import RunPlan

logger = logging.getLogger(__name__)

LOSS_PLOT = "loss.png"

#: Per kind: does `train_plan(compile=None)` compile. A run has many identical steps, so compiling pays
#: off on an accelerator; on CPU the compile time dominates short runs; MPS has no tested inductor path.
TRAIN_COMPILE_DEFAULT: dict[str, bool] = {
    "hpu": True, "xpu": True, "rocm": True, "cuda": True, "mps": False, "cpu": False,
}


@dataclass(frozen=True)
class TrainResult:
    """What a `train()` run did: where the model went, the per-step losses, and how it ended.
    `already_finished`: the run resumed was already at its end, so nothing trained and nothing on disk changed;
    `skipped_steps`: steps whose non-finite gradients were dropped (`on_nonfinite="skip"`)."""

    output_dir: str
    global_step: int
    losses: tuple[tuple[int, float], ...]
    lora: bool
    merged: bool
    interrupted: str | None = None
    resumed_from: str | None = None
    loss_plot: str | None = None
    tokens_per_step: int = 0
    train_runtime: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    already_finished: bool = False
    skipped_steps: tuple[int, ...] = ()
    eval_losses: tuple[tuple[int, float], ...] = ()


def train_plan(model: str | None = None, device: Any = "auto", dtype: str = "auto", attention: str = "auto",
               compile: bool | str | None = None, quantization: str | None = None,
               trust_remote_code: bool = False) -> RunPlan:
    """`hwrun.model.plan` for training: like plan(), but `compile=None` means on for an accelerator
    (a training run has many identical steps, so compiling pays off) and off on CPU (where the
    compile time dominates short runs). bf16 comes from plan()'s dtype choice (X17, G12)."""
    from ..model.plan import plan as make_plan

    base = make_plan(model, device=device, dtype=dtype, attention=attention, compile=False,
                     quantization=quantization, trust_remote_code=trust_remote_code)
    if compile is None:
        from hwrun.devices import row

        compile = row(TRAIN_COMPILE_DEFAULT, base.accelerator.kind, False)
    if not compile:
        return base
    compiled = make_plan(model, device=base.accelerator, dtype=dtype, attention=attention, compile=compile,
                         quantization=quantization, trust_remote_code=trust_remote_code)
    # Same device and dtype rules as `base`, so keep base's reasons for them (not "given").
    reasons = {**compiled.reasons, "device": base.reasons["device"], "dtype": base.reasons["dtype"]}
    return replace(compiled, reasons=reasons)


def _check_qlora(plan: RunPlan) -> None:
    from hwrun.errors import QuantizationError
    from hwrun.model.quantization import check_quantization

    try:
        check_quantization("4bit", plan.accelerator)
    except QuantizationError as error:
        raise QLoRAUnsupportedError(
            f"qlora=True on {plan.accelerator.name} (device {plan.accelerator.device}) is not possible: "
            f"{error} What works instead: LoRA on a {plan.dtype} base (train(..., lora=True, qlora=False), "
            "or `hwrun train --lora` without --qlora)."
        ) from error


def _data_tokenizer(plan: RunPlan) -> Any:
    """The plan's tokenizer alone (no weights), loaded as `hwrun.model.load` loads it, to pack the data."""
    from hwrun.errors import ModelSourceError
    from hwrun.model.load import load_tokenizer

    try:
        return load_tokenizer(plan)
    except OSError as exc:
        raise ModelSourceError(f"model={plan.model!r}: its tokenizer could not be loaded to prepare the "
                               f"training data: {exc}") from exc


def _load_model(plan: RunPlan, *, qlora: bool, full: bool, tokenizer: Any | None):
    """(model, tokenizer, reason): the base model through hwrun's own loading decisions. LoRA goes
    through `hwrun.model.load` (padding set up); every path keeps `tokenizer` (the one that packed the data),
    or loads it when the caller passed a ready dataset."""
    from ..model.load import from_pretrained_kwargs, load

    if not qlora and not full:
        model, tokenizer = load(plan, tokenizer=tokenizer)
        return model, tokenizer, f"base model in {plan.dtype} via hwrun.load (plan)"
    from transformers import AutoModelForCausalLM

    kwargs = dict(from_pretrained_kwargs(plan))
    if qlora:
        from hwrun.model.quantization import bnb_config

        kwargs["quantization_config"] = bnb_config("4bit", plan.dtype)
        reason = f"base model in 4-bit NF4 (bitsandbytes, compute {plan.dtype}) for QLoRA (X15, G11)"
    else:
        import torch

        kwargs["dtype"] = torch.float32
        kwargs.pop("torch_dtype", None)
        reason = "full fine-tuning keeps float32 master weights (mixed precision computes in " \
                 f"{plan.dtype}); pure {plan.dtype} AdamW updates lose small steps"
    if tokenizer is None:
        tokenizer = _data_tokenizer(plan)
    from ..model.integrity import verify_output

    verify_output(plan.model)  # a base hwrun wrote (a merged model) is compared with its record, as load() does
    model = AutoModelForCausalLM.from_pretrained(plan.model, **kwargs)
    return model, tokenizer, reason


@dataclass(frozen=True)
class RunSettings:
    """Everything `train()` was asked for, checked: the phases read this, not loose keywords."""

    options: Mapping[str, Any]
    settings: LoraSettings | None
    qlora: bool
    record: Mapping[str, Any]  # kind, model, data, block size, LoRA shape (resume_match.run_record): in checkpoints
    kernel_asks: Mapping[str, str] = field(default_factory=dict)  # {op: impl} asked for explicitly

    def __getattr__(self, name: str) -> Any:
        try:
            return self.options[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class OutputPlan:
    """Where the run writes (`found`: what the folder held before) and what it resumes from, with the reasons."""

    found: output.OutputSurvey
    resume_from: str | None
    reasons: Mapping[str, str]
    finished: str | None = None  # the run to resume is already at its end (and why)


def _validate(plan: RunPlan, data: Any, options: dict[str, Any]) -> RunSettings:
    """Phase 1: every option's type and range, before anything is read, loaded or written."""
    check_all(plan, {**options, "data": data})
    if plan.adapter is not None:
        raise TrainingConfigError(
            f"plan.model={plan.model!r} with adapter {plan.adapter!r}: train() fine-tunes a base model "
            "and would train the base without the adapter (full fine-tuning) or wrap it in a second "
            "PEFT layer (LoRA). Fix: train from the base model, or merge the adapter first "
            "(hwrun.model.load.merge_adapter_folder(adapter, out, plan)) and train the merged model."
        )
    qlora = options["qlora"] or plan.quantization == "4bit"
    settings = lora_settings(options["lora"], qlora)
    check_quantized_base(plan.quantization, lora=settings is not None, qlora=options["qlora"])
    if options["merge"] and settings is None:
        raise TrainingConfigError("merge=True needs LoRA (there is no adapter to merge in full fine-tuning); "
                                  "pass lora=True, or drop merge.")
    if qlora:
        _check_qlora(plan)
    asks = _check_kernel_asks(plan, options)
    if settings is not None:
        from ..model.source import resolve_source
        from .lora import check_rank

        check_rank(settings, resolve_source(plan.model).config)
    kind = "qlora" if qlora else ("lora" if settings is not None else "full")
    from .resume_match import run_record

    record = run_record(plan, kind, settings, options["block_size"] if isinstance(data, (str, os.PathLike)) else None)
    return RunSettings(options, settings, qlora, record, asks)


def _check_kernel_asks(plan: RunPlan, options: Mapping[str, Any]) -> dict[str, str]:
    """The explicit kernel choices (`kernels=`, and the deprecated `loss_kernel`/`swiglu_kernel`/`rope_table`), checked by the
    kernel policy against its candidates, the plan's device and the run's other options, before any work."""
    from .kernel_policy import OLD_KEYWORDS, candidate, check_kernels, from_old_keyword, resolve

    old, spelled = {}, {}
    for keyword in OLD_KEYWORDS:
        if options[keyword] is not None:  # warned about at the caller of train(): 4 frames up
            old[keyword] = from_old_keyword(keyword, options[keyword], stacklevel=5)
            spelled[OLD_KEYWORDS[keyword]] = f"{keyword}={options[keyword]!r}"
    asks = check_kernels(options["kernels"], old)
    resolve(plan.accelerator.kind, asks, spelled)  # an explicit choice that cannot run on this device raises here
    for op, impl in asks.items():
        needs = candidate(op, impl).needs
        if needs is not None and options[needs] is False:
            asked = spelled.get(op, f"kernels[{op!r}]={impl!r}")
            raise TrainingConfigError(f"{asked} runs inside hwrun's {needs.replace('_', ' ')}, but {needs}=False "
                                      "switches that off. Fix: drop one of the two.")
    return asks


def _prepare_output(plan: RunPlan, run: RunSettings) -> OutputPlan:
    """Phase 2: the output folder (write-tested, its files sorted into hwrun's and others'), the checkpoint to
    resume from (verified), and whether that run is already finished."""
    path = output.writable_output_dir(run.output_dir)
    found = output.survey(path)
    choice = choose_resume(run.resume, path)
    output.check_output_dir(found, plan.model, choice.folder, dict(run.record), run.overwrite)
    reasons = {"resume": choice.reason}
    if choice.folder is None:
        return OutputPlan(found, None, reasons)
    # the model, block size and LoRA shape must be the checkpoint's (the data is compared once it is read)
    reasons["resume checks"] = check_resume_matches(choice.folder, checkpoint_run(choice.folder), run.record)
    changed = schedule_change(choice.folder, run.max_steps, run.epochs)
    finished = finished_at(choice.folder, run.max_steps, run.epochs)
    if finished:
        step = trainer_state(choice.folder).get("global_step")
        final = output.final_step(path)
        if final is not None and final in (step, -1):
            reasons["resume"] = (f"{finished}; its final model is in {path}: nothing to train, nothing changed "
                                 "(pass a larger max_steps to train on)")
            logger.warning("%s", reasons["resume"])
        else:
            reasons["resume"] = (f"{finished}, but {path} holds no final model from it (the run stopped before its "
                                 "final save): writing it from the checkpoint, without training")
            logger.warning("%s", reasons["resume"])
            return OutputPlan(found, choice.folder, reasons, finished="final-missing")
        return OutputPlan(found, choice.folder, reasons, finished="done")
    if changed:
        reasons["resume"] = f"{choice.reason}; {changed}"
        logger.warning("%s", changed)
    elif not choice.skipped:
        reasons["resume"] = f"from {choice.folder}, same schedule"
    return OutputPlan(found, choice.folder, reasons)


def _finished_result(where: OutputPlan, run: RunSettings) -> TrainResult:
    """The result of resuming a run that is already finished, read from its checkpoint: nothing trained."""
    from .plot import loss_points

    state = trainer_state(where.resume_from)
    final = output.read_record(where.found.path).get("final", {})
    plot = where.found.path / LOSS_PLOT
    return TrainResult(
        output_dir=str(where.found.path), global_step=int(state.get("global_step", 0)),
        losses=tuple(loss_points(state.get("log_history", []))), lora=run.settings is not None,
        merged=bool((final.get("run") or {}).get("merged", False)), resumed_from=where.resume_from,
        loss_plot=str(plot) if plot.is_file() else None, reasons=dict(where.reasons), already_finished=True)


def _check_eval(fraction: Any, steps: Any, events: Any) -> None:
    """eval_fraction in [0, 0.5), eval_steps a positive int (and only with a fraction), events a bool."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 0.5:
        raise TrainingConfigError(f"eval_fraction={fraction!r} (--eval-fraction) must be a number in [0, 0.5): the "
                                  "share of the packed blocks held out for evaluation. Fix: e.g. 0.1, or 0 for none.")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise TrainingConfigError(f"eval_steps={steps!r} (--eval-steps) must be an integer >= 1.")
    if steps is not None and not fraction:
        raise TrainingConfigError(f"eval_steps={steps} given without eval_fraction: there is no held-out split to "
                                  "evaluate. Fix: add eval_fraction (--eval-fraction 0.1), or drop eval_steps.")
    if not isinstance(events, bool):
        raise TrainingConfigError(f"events={events!r} must be True or False.")


def _split_eval(dataset: Any, run: RunSettings, reasons: dict) -> tuple[Any, Any]:
    """(train, eval) datasets: the last `eval_fraction` of the packed blocks held out (at least one; at least one
    optimizer step's worth left to train on), or (dataset, None)."""
    if not run.eval_fraction:
        return dataset, None
    import copy

    total = len(dataset) if hasattr(dataset, "blocks") else None
    if total is None:
        raise TrainingConfigError("eval_fraction needs hwrun's packed data (a file or Hub id as data=); a ready "
                                  "dataset has no blocks to hold out. Fix: pass eval_dataset= yourself, or data as a file.")
    held = max(1, round(total * run.eval_fraction))
    world = os.environ.get("WORLD_SIZE", "1").strip()
    per_step = run.batch_size * run.grad_accum * (int(world) if world.isdigit() and int(world) > 0 else 1)
    if total - held < per_step:
        raise TrainingConfigError(
            f"eval_fraction={run.eval_fraction} holds out {held} of {total} packed blocks, leaving {total - held} to "
            f"train on, fewer than one optimizer step's {per_step} (batch size x accumulation x processes). Fix: more "
            "data, a smaller --block-size or --batch-size, or a smaller --eval-fraction.")
    parts = []
    for part in (slice(0, total - held), slice(total - held, total)):
        piece = copy.copy(dataset)
        for name in ("blocks", "labels", "positions"):  # PackedDataset's and SupervisedBlocks' tensors
            value = getattr(dataset, name, None)
            if hasattr(value, "shape"):
                setattr(piece, name, value[part])
        parts.append(piece)
    reasons["eval"] = (f"{held} of {total} packed blocks held out for evaluation (the last {run.eval_fraction:.0%}), "
                       f"evaluated every {_eval_every(run)} steps")
    return parts[0], parts[1]


def _eval_every(run: RunSettings) -> int:
    if run.eval_steps is not None:
        return run.eval_steps
    if run.max_steps and run.max_steps > 0:
        return max(1, min(run.save_steps, run.max_steps // 5 or 1))
    return run.save_steps


def _check_keywords(overrides: Mapping[str, Any]) -> None:
    """Phase 1b: the extra keywords are TrainingArguments keywords train() does not set itself (a misspelt one
    names the closest valid name). Imports transformers only when there are extra keywords."""
    check_overrides(overrides, TRAIN_OPTIONS)


def _prepare_data(plan: RunPlan, data: Any, run: RunSettings, where: OutputPlan) -> tuple[Any, Any, RunSettings]:
    """Phase 3: read (bounded by max_data_bytes), tokenise and pack the data before the weights load, so data
    problems (block_size beyond the tokenizer's limit, too little text) surface first. The documents' sha256 joins
    the run's record, and a resume from a checkpoint written on other data is refused before the tokenizer loads.
    Returns (dataset, tokenizer, run); a ready dataset needs no tokenizer here."""
    from .chat_data import DataFields, build_supervised, read_rows, wants_rows
    from .data import build_dataset, read_documents

    if not isinstance(data, (str, os.PathLike)):
        _check_fits(plan, data, run)
        return data, None, replace(run, record={**run.record, "data_sha256": None})
    fields = DataFields(text_field=run.text_field, messages_field=run.messages_field)
    if wants_rows(data, fields):  # chats, prompt/completion pairs, datasets files and Hub ids (chat_data.py)
        rows = read_rows(data, max_bytes=run.max_data_bytes)
        _check_fits(plan, None, run)
        tokenizer = _data_tokenizer(plan)
        dataset = build_supervised(rows, tokenizer, run.block_size, fields, packing=run.packing,
                                   attention=plan.attention.implementation, chat_template=run.chat_template)
        run = replace(run, record={**run.record, "data_sha256": dataset.data_sha256})
        if dataset.report.bad:
            where.reasons["bad rows"] = dataset.report.summary()
        if where.resume_from is not None:
            same = check_resume_matches(where.resume_from, checkpoint_run(where.resume_from), run.record,
                                        ("data_sha256",))
            where.reasons["resume checks"] = f"{where.reasons.get('resume checks', '')}; {same}".lstrip("; ")
        _check_fits(plan, dataset, run)
        return dataset, tokenizer, run
    if run.text_field or run.messages_field or run.chat_template is not None:
        given = ", ".join(f"{name}={run.options[name]!r}" for name in ("text_field", "messages_field", "chat_template")
                          if run.options[name] is not None)
        raise TrainingConfigError(f"{given} given for data {str(data)!r}, which is plain text (a text file or a "
                                  "folder of .txt files) and has no fields or chats. Fix: drop those options, or pass "
                                  "a JSONL/JSON/Parquet/CSV file or a Hub dataset id.")
    documents = read_documents(data, max_bytes=run.max_data_bytes)
    run = replace(run, record={**run.record, "data_sha256": data_sha256(doc.text for doc in documents)})
    if where.resume_from is not None:
        same = check_resume_matches(where.resume_from, checkpoint_run(where.resume_from), run.record, ("data_sha256",))
        where.reasons["resume checks"] = f"{where.reasons.get('resume checks', '')}; {same}".lstrip("; ")
    _check_fits(plan, None, run)  # the config's positions before the tokenizer reads that config
    tokenizer = _data_tokenizer(plan)
    dataset = build_dataset(documents, tokenizer, run.block_size)
    _check_fits(plan, dataset, run)
    return dataset, tokenizer, run


#: config.json keys that bound the positions a model handles (Llama-style, GPT-2, some others).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _check_fits(plan: RunPlan, dataset: Any, run: RunSettings) -> None:
    """Before the model loads: the packed blocks fit the model's positions (a config.json whose
    max_position_embeddings is 0, or any value below block_size, was accepted), and one optimizer step's blocks
    (batch_size x grad_accum x processes) fit the data (Trainer silently trained on a smaller batch). With
    `dataset=None` only the config's values are checked."""
    from ..model.source import resolve_source

    config = resolve_source(plan.model).config or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    block = int(dataset.blocks.shape[1]) if dataset is not None and hasattr(dataset, "blocks") else None
    for key in POSITION_KEYS:
        if key not in text:
            continue
        value = text[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TrainingConfigError(
                f"model={plan.model!r}: config.json {key}={value!r} must be an int >= 1 (the longest sequence the "
                "model's positions cover). Fix: correct config.json (the value of the model's release), or re-save "
                "the model with save_pretrained()."
            )
        if block is not None and block > value:
            raise TrainingConfigError(
                f"block_size={block} (--block-size) exceeds the model's {key}={value} (config.json): positions past "
                f"it were never trained, or do not exist. Fix: --block-size {value} or less."
            )
        break
    if dataset is None:
        return
    world = os.environ.get("WORLD_SIZE", "1").strip()
    world = int(world) if world.isdigit() and int(world) > 0 else 1
    per_step = run.batch_size * run.grad_accum * world
    try:
        blocks = len(dataset)
    except TypeError:  # an iterable dataset: its length is not known before training
        blocks = None
    if blocks is not None and per_step > blocks:
        processes = f" x {world} processes" if world > 1 else ""
        raise TrainingConfigError(
            f"batch_size={run.batch_size} (--batch-size) x grad_accum={run.grad_accum}{processes} = {per_step:,} "
            f"blocks per optimizer step, and the data packs into {blocks:,} blocks of {block or run.block_size} "
            "tokens: Trainer would train on a smaller batch than asked, silently. Fix: --batch-size "
            f"{max(1, blocks // max(1, run.grad_accum * world))} or less, more data, or a smaller --block-size."
        )


def _arguments(plan: RunPlan, run: RunSettings, path: Path, overrides: Mapping[str, Any]) -> Any:
    """Phase 4: TrainingArguments for the plan's device; TrainingArguments' own refusals become
    TrainingConfigError (one line in the CLI), and `on_nonfinite="skip"` is refused under sharding."""
    from .arguments import training_arguments
    from .sharding import is_sharded

    try:
        args = training_arguments(
            plan, path, num_train_epochs=run.epochs, max_steps=run.max_steps, learning_rate=run.lr,
            per_device_train_batch_size=run.batch_size, gradient_accumulation_steps=run.grad_accum, seed=run.seed,
            data_seed=run.seed, save_steps=run.save_steps, ddp_find_unused_parameters=False, **overrides)
    except TrainingConfigError:
        raise
    except (ValueError, TypeError) as error:
        given = ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "hwrun's defaults"
        raise TrainingConfigError(f"transformers.TrainingArguments refused these options ({given}): "
                                  f"{' '.join(str(error).split())} Fix that value.") from error
    if run.on_nonfinite == "skip" and is_sharded(args):
        raise TrainingConfigError(
            "on_nonfinite='skip' drops a step's gradients where every rank holds whole parameters; under FSDP or "
            "DeepSpeed each rank holds a shard and the ranks could disagree. Fix: on_nonfinite='stop' (the "
            "default) or 'ignore' with sharding."
        )
    return args


def _sharding(plan: RunPlan, args: Any, reasons: dict) -> tuple[RunPlan, bool]:
    """DeepSpeed ZeRO-3 partitions the weights while from_pretrained loads them (zero.Init), and Transformers
    refuses a device_map then; DeepSpeed places each rank's shard itself. Returns (plan to load, zero3)."""
    from .sharding import deepspeed_zero3, init_deepspeed_comm

    if not deepspeed_zero3(args):
        return plan, False
    init_deepspeed_comm(args)
    reasons["sharding"] = "DeepSpeed ZeRO-3: weights partitioned at load (no device_map)"
    return replace(plan, device_map=None), True


def _load(plan: RunPlan, run: RunSettings, tokenizer: Any, reasons: dict) -> tuple[Any, Any]:
    """Phase 5: the base model through hwrun's own loading decisions; a broken model file becomes a
    ModelSourceError naming the model (one line in the CLI) instead of a library traceback."""
    from ..errors import HwrunError, ModelSourceError

    try:
        model, tokenizer, reasons["model"] = _load_model(plan, qlora=run.qlora, full=run.settings is None,
                                                         tokenizer=tokenizer)
    except HwrunError:
        raise
    except (OSError, ValueError, KeyError) as error:
        kind = type(error).__name__
        raise ModelSourceError(f"model={plan.model!r} could not be loaded for training ({kind}: "
                               f"{' '.join(str(error).split())[:300]}). Fix: check the model files (a truncated "
                               "download, a config.json that is not a model config), or pass another model.") from error
    return model, tokenizer


def _patch(model: Any, dataset: Any, plan: RunPlan, args: Any, run: RunSettings, stack: PatchStack,
           reasons: dict) -> Any:
    """Phase 6: hwrun's model patches and the LoRA wrapper; every change is recorded on `stack`."""
    from ..devices import kind_of_device_type
    from .kernel_policy import resolve

    kind = kind_of_device_type(args.device.type, hint=plan.accelerator.kind)
    choices = resolve(kind, run.kernel_asks)  # per op: the kernel policy's choice here, and why
    for op, choice in choices.items():
        reasons[f"kernel {op}"] = choice.reason
    options = PatchOptions.from_choices(choices, fused_loss=run.fused_loss, fused_projections=run.fused_projections, compiled=plan.compile is not None)
    patch_base(model, dataset, options, stack, reasons)
    if run.settings is None:
        patch_last(model, options, stack, reasons)
        return model
    from peft import get_peft_model
    from transformers import set_seed

    if run.qlora:  # not peft's prepare_model_for_kbit_training: it copies the unquantized weights to float32
        from .kbit import prepare_kbit_base

        reasons["4-bit base"] = prepare_kbit_base(model)
    elif plan.quantization:  # torchao int8 weight-only: PEFT wraps it (TorchaoLoraLinear); the base stays frozen
        reasons["quantized base"] = check_quantized_base(plan.quantization, lora=True)
    set_seed(run.seed)  # LoRA A matrices are random: same seed, same adapter init, same run
    targets = lora_targets(getattr(model.config, "model_type", "") or "", run.settings.target_modules)
    model = _peft_model(model, lora_config(model.config, run.settings, targets), targets, get_peft_model)
    reasons["lora"] = f"r={run.settings.r} on {_adapted(model.peft_config['default'])} ({targets.reason})"
    patch_lora(model, options, _fusion_blocker(args, run.qlora) or quantized_blocker(plan.quantization), stack, reasons)
    patch_last(model, options, stack, reasons)
    return model


def _peft_model(model: Any, config: Any, targets: Any, get_peft_model: Callable[..., Any]) -> Any:
    """PEFT's LoRA wrapper; target modules the model does not have are a TrainingConfigError naming them and the
    model's linear layers (before: PEFT's NoMatchingPeftModuleError surfaced as an internal error)."""
    try:
        return get_peft_model(model, config)
    except ValueError as error:
        if "not found in the base model" not in str(error) and type(error).__name__ != "NoMatchingPeftModuleError":
            raise
        import torch

        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if isinstance(module, torch.nn.Linear) and name})
        asked = targets.modules if isinstance(targets.modules, str) else ",".join(targets.modules)
        raise TrainingConfigError(
            f"LoRA target_modules={asked} (--lora-targets) names no module of {getattr(model.config, 'model_type', 'this model')!r}; its linear "
            f"layers are {', '.join(linear[:12]) or 'none'}. Fix: name some of those, or leave --lora-targets out "
            "for PEFT's choice for the architecture."
        ) from None


@dataclass
class Training:
    """The trainer of a run and its callbacks (what phase 7 reads after training): `saver` is the HwrunCallback whose
    `stopper` and `guard` these are."""

    trainer: Any
    stopper: Any
    guard: Any
    output: Any = None
    saver: Any = None


def _trainer(model: Any, tokenizer: Any, dataset: Any, args: Any, run: RunSettings, eval_dataset: Any = None
             ) -> Training:
    """Transformers' Trainer with hwrun's callbacks: the caller's, then HwrunCallback (SIGTERM/SIGINT saving, the
    non-finite guard that can veto that save, atomic checkpoints), the loss lines, the TensorBoard event log."""
    from transformers import Trainer, default_data_collator

    from .callbacks import HwrunCallback
    from .sharding import is_sharded
    from .trainer import LossLog

    saver = HwrunCallback(run.on_nonfinite, check_weights=not is_sharded(args))
    saver.record = dict(run.record)  # the kind of run, checked when a later run resumes
    callbacks = [*run.callbacks, saver, LossLog(run.echo)]
    if run.events and not _reports(args):
        from .events import EVENTS_DIR, EventLog

        world = max(1, args.world_size)
        callbacks.append(EventLog(Path(args.output_dir) / EVENTS_DIR,
                                  _tokens_per_step(dataset, run.batch_size, run.grad_accum, world)))
    trainer = Trainer(model=model, args=args, train_dataset=dataset, eval_dataset=eval_dataset,
                      processing_class=tokenizer, data_collator=default_data_collator, callbacks=callbacks)
    if run.echo is not None:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # LossLog's lines replace its raw log dicts
    return Training(trainer, saver.stopper, saver.guard, saver=saver)


def _reports(args: Any) -> bool:
    """Whether the arguments report to a tracker (report_to other than "none"): then hwrun writes no events."""
    chosen = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    return any(name not in (None, "none") for name in chosen)


def _train(training: Training, where: OutputPlan, run: RunSettings) -> None:
    """Phase 7: claim the output folder, clear an earlier run when overwriting, then train (or, for a finished
    run whose final save is missing, load its last checkpoint)."""
    trainer = training.trainer
    if trainer.is_world_process_zero():
        output.claim(where.found.path)
        if where.resume_from is None and run.overwrite and where.found.earlier:
            output.clear_earlier(where.found)
    if where.finished == "final-missing":
        from transformers import TrainerState

        if getattr(trainer, "is_fsdp_enabled", False) or getattr(trainer, "is_deepspeed_enabled", False):
            raise CheckpointError(
                f"{where.resume_from} ends a finished run, but its final model was never saved, and hwrun writes it "
                "from a sharded (FSDP/DeepSpeed) checkpoint only by training. Fix: resume with a larger max_steps, "
                "or load the checkpoint folder itself."
            )
        trainer._load_from_checkpoint(where.resume_from)
        trainer.state = TrainerState.load_from_json(os.path.join(where.resume_from, "trainer_state.json"))
        return
    installed = training.stopper.install()
    try:
        training.output = trainer.train(resume_from_checkpoint=where.resume_from)
    except Exception as error:
        from .checkpoints import is_refused_pickle, refused_pickle

        failed_save = training.saver.save_failure(trainer.args, error)  # disk full mid-save: CheckpointWriteError
        if failed_save is not None:
            raise failed_save from error
        if where.resume_from is None or not is_refused_pickle(error):
            raise
        raise refused_pickle(where.resume_from, error) from None  # named as hwrun's error, not torch's advice
    finally:
        if installed:
            training.stopper.uninstall()
        from .events import EventLog

        for callback in trainer.callback_handler.callbacks:  # a run that raised gets no on_train_end
            if isinstance(callback, EventLog):
                callback.close()


def _check_finite(training: Training, where: OutputPlan, run: RunSettings) -> None:
    """After training: a run the guard stopped raises NonFiniteLossError naming the step and value."""
    from .checkpoints import latest_complete_checkpoint

    if training.guard.tripped is None:
        return
    step, what, value = training.guard.tripped
    last = latest_complete_checkpoint(where.found.path)
    kept = f"the last good checkpoint is {last}" if last is not None else "no checkpoint was written"
    if training.guard.diverged:  # finite, beyond one of the guard's divergence bounds (hwrun.training.guard)
        raise TrainingDivergedError(
            f"Training stopped at step {step}: {what} is {value:.4g} ({training.guard.rule}), so the run diverged "
            f"(lr={run.lr}). Nothing was saved after it: {kept}, and an earlier final model in {where.found.path} is "
            "untouched. Fix: a lower learning rate (--lr), then --resume from that checkpoint or start over "
            "(on_nonfinite='ignore', --on-nonfinite ignore, turns these checks off)."
        )
    raise NonFiniteLossError(
        f"Training stopped at step {step}: {what} is {value} (not finite), so the run diverged (lr={run.lr}). "
        f"Nothing was saved after it: {kept}, and an earlier final model in {where.found.path} is untouched. Fix: "
        "a lower learning rate (--lr), then --resume from that checkpoint or start over; on_nonfinite='skip' "
        "(--on-nonfinite skip) drops such steps instead."
    )


def _save(training: Training, tokenizer: Any, plan: RunPlan, run: RunSettings, where: OutputPlan, zero3: bool,
          dataset: Any, reasons: dict) -> TrainResult:
    """Phase 8: the final model (unless a signal stopped the run), the loss plot, and the result."""
    import signal

    from .final import save_final, write_plot
    from .plot import eval_points, loss_points
    from .sharding import release_zero3

    trainer, path = training.trainer, where.found.path
    interrupted = None
    if training.stopper.received is not None:
        interrupted = signal.Signals(training.stopper.received).name
        logger.warning("Training stopped by %s at step %d; checkpoint saved in %s. Run again with "
                       "resume='auto' (--resume) to continue.", interrupted, trainer.state.global_step, path)
    merged = False
    if interrupted is None:
        # a quantized base merges through the unquantized one, as QLoRA does (merging into int8 would round it)
        saved = save_final(trainer, tokenizer, where.found, run.settings is not None, run.merge,
                           run.qlora or bool(plan.quantization), plan,
                           zero3, {**run.record, "merged": run.merge and run.settings is not None})
        merged = saved.merged
        if saved.kept:
            reasons["kept"] = (f"not written, because files of these names in {path} are not hwrun's: "
                               f"{', '.join(saved.kept)}")
    if zero3:
        release_zero3()  # later loads in this process (hwrun.load, generate) get whole weights again
    if training.guard.skipped:
        reasons["nonfinite"] = (f"on_nonfinite='skip': {len(training.guard.skipped)} step(s) with non-finite "
                                f"gradients changed no weight: {training.guard.skipped}")
    points = loss_points(trainer.state.log_history)
    evals = eval_points(trainer.state.log_history)
    plot_path = None
    if run.plot and trainer.is_world_process_zero():
        plot_path, why_not = write_plot(points, where.found, f"hwrun train: {Path(plan.model).name}", evals)
        if why_not:
            reasons["plot"] = why_not
    world = max(1, training.trainer.args.world_size)
    metrics = dict(training.output.metrics) if training.output is not None else {}
    return TrainResult(
        output_dir=str(path), global_step=trainer.state.global_step, losses=tuple(points),
        lora=run.settings is not None, merged=merged, interrupted=interrupted, resumed_from=where.resume_from,
        loss_plot=plot_path, tokens_per_step=_tokens_per_step(dataset, run.batch_size, run.grad_accum, world),
        train_runtime=metrics.get("train_runtime"), metrics=metrics, reasons=reasons,
        skipped_steps=tuple(training.guard.skipped), eval_losses=tuple(evals))


def train(plan: RunPlan, data: str | os.PathLike | Any, *, lora: Any = None, qlora: bool = False,
          epochs: float = 1.0, max_steps: int = -1, lr: float = 2e-4, batch_size: int = 8,
          grad_accum: int = 1, seed: int = 42, output_dir: str | os.PathLike = "hwrun-train",
          resume: bool | str | None = "auto", block_size: int = 512, merge: bool = False,
          save_steps: int = 100, fused_loss: bool = True, fused_projections: bool = True,
          rope_table: bool | None = None, loss_kernel: str | None = None, swiglu_kernel: str | None = None,
          kernels: Mapping[str, str] | None = None, plot: bool = True, callbacks: Sequence[Any] = (),
          echo: Callable[[str], Any] | None = None,
          overwrite: bool = False, on_nonfinite: str = "stop", max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
          text_field: str | None = None, messages_field: str | None = None,
          chat_template: str | os.PathLike | None = None, packing: bool = True,
          eval_fraction: float = 0.0, eval_steps: int | None = None, events: bool = True,
          fsdp_checkpoint: str | None = None, **training_overrides: Any) -> TrainResult:
    """Fine-tune `plan.model` on `data` (text file, JSONL with "text", folder of .txt, or a
    ready dataset) with Trainer; LoRA when `lora` is given or `qlora=True`, else full fine-tuning.

    Checkpoints go to `output_dir/checkpoint-N` (atomic, with the sha256 of every file; a resume verifies
    them and falls back to the newest checkpoint that verifies); the final model (adapter, or merged with
    `merge=True`) to `output_dir` itself, so `hwrun generate --model output_dir` loads it.
    `overwrite=True` uses a folder holding files hwrun did not write (they are never replaced or deleted)
    and lets a fresh start replace an earlier run's files there (hwrun deletes only its own).
    `on_nonfinite`: "stop" (default: a NaN/inf loss or weight stops the run with NonFiniteLossError before
    anything is saved), "skip" (drop that step's update), "ignore".
    `max_data_bytes` bounds the data read from disk (default 4 GiB).
    Chat and instruction data (hwrun.training.chat_data): JSONL/JSON/Parquet/CSV/TSV/Arrow files and `datasets` Hub
    ids; rows with `messages` are rendered with the tokenizer's chat template (or `chat_template`, a Jinja file or
    text) with the loss on the assistant turns, `prompt`/`completion` pairs with the loss on the completion;
    `text_field` / `messages_field` name other columns; `packing=False` puts one example per block.
    `training_overrides` are TrainingArguments keywords (e.g. fsdp=..., deepspeed=...); any other name is a
    TrainingConfigError naming the closest valid one.
    `fsdp_checkpoint` (with fsdp=): "sharded" (each rank writes its shard, torch.distributed.checkpoint files) or
    "full" (gathered on rank 0: the model or adapter as safetensors, the optimizer state as one file), both resumable
    at another world size; None leaves fsdp_config's state_dict_type (Transformers' default: FULL_STATE_DICT). A
    resume from a checkpoint of the other kind is refused before the model loads (hwrun.training.sharding).
    `fused_loss` and `fused_projections` (LoRA on a frozen base, one process or DDP) switch hwrun's own training
    path off one by one; each logs why where it cannot apply. The RoPE table (packed blocks) is kernels' 'rope'
    choice: kernels={'rope': 'inductor'} runs the model's own rotary module instead.
    `kernels` picks the implementation of each training op, {op: impl} with op one of cross_entropy, swiglu,
    rmsnorm, rope and impl 'auto' (the default: hwrun.training.kernel_policy's measured choice for the
    device), 'hwrun' (our own: the loss kernel, the RoPE table), 'inductor' (the torch form, compiled), 'liger'
    (Liger's kernel, CUDA/ROCm/XPU, `pip install hwrun[liger]`) or 'torch' (torch's own op, where torch has one);
    result.reasons has every op's choice and why ("kernel <op>"). `loss_kernel`, `swiglu_kernel` and `rope_table`
    are deprecated (hwrun 0.1.0's spelling; a FutureWarning naming the replacement): 'triton' is
    kernels[op]='hwrun', 'torch' 'inductor' (kernels' own 'torch' is torch's own op, another implementation),
    rope_table=False kernels={'rope': 'inductor'}, rope_table=True the default.
    """
    options = {name: value for name, value in locals().items()
               if name not in ("plan", "data", "training_overrides")}
    _check_eval(eval_fraction, eval_steps, events)
    run = _validate(plan, data, options)
    _check_keywords(training_overrides)
    training_overrides = with_fsdp_checkpoint(fsdp_checkpoint, training_overrides)
    where = _prepare_output(plan, run)
    check_fsdp_resume(training_overrides, where.resume_from)
    if where.finished == "done":
        return _finished_result(where, run)
    dataset, data_tokenizer, run = _prepare_data(plan, data, run, where)
    reasons = dict(where.reasons)
    dataset, eval_dataset = _split_eval(dataset, run, reasons)
    if eval_dataset is not None:
        training_overrides = {"eval_strategy": "steps", "eval_steps": _eval_every(run),
                              "per_device_eval_batch_size": run.batch_size, **training_overrides}
    args = _arguments(plan, run, where.found.path, training_overrides)
    plan, zero3 = _sharding(plan, args, reasons)
    try:
        model, tokenizer = _load(plan, run, data_tokenizer, reasons)
        if hasattr(dataset, "blocks"):
            reasons["data"] = getattr(dataset, "description", None) or \
                f"{len(dataset)} packed blocks of {dataset.blocks.shape[1]} tokens, no padding"
        stack = PatchStack()
        try:
            model = _patch(model, dataset, plan, args, run, stack, reasons)
            training = _trainer(model, tokenizer, dataset, args, run, eval_dataset)
            with safetensors_full_checkpoints(training.trainer, reasons):  # --fsdp-checkpoint full: no pickle copy
                _train(training, where, run)
        finally:
            stack.undo()  # the model as it was loaded again, whether training finished or failed
        _check_finite(training, where, run)
    except BaseException:
        if zero3:
            from .sharding import release_zero3

            release_zero3()
        if args.process_index == 0:
            output.release(where.found.path, where.found.existed)
        raise
    return _save(training, tokenizer, plan, run, where, zero3, dataset, reasons)


#: train()'s own keyword options (for the "did you mean" of a misspelt keyword).
TRAIN_OPTIONS = tuple(name for name in inspect.signature(train).parameters if name not in ("plan", "data",
                                                                                          "training_overrides"))


def _adapted(config: Any) -> str:
    """What PEFT adapted, as module names: it resolves "all-linear" to full module paths (listed here by
    their last part) and, for MoE experts kept as 3-D parameters, adds `target_parameters`."""
    modules = config.target_modules
    names = [modules] if isinstance(modules, str) else sorted({name.rsplit(".", 1)[-1] for name in modules})
    text = ",".join(names)
    parameters = sorted(getattr(config, "target_parameters", None) or ())
    return f"{text} and parameters {','.join(parameters)}" if parameters else text


def _tokens_per_step(dataset: Any, batch_size: int, grad_accum: int, world: int) -> int:
    blocks = getattr(dataset, "blocks", None)
    block = int(blocks.shape[1]) if blocks is not None else 0
    return block * batch_size * grad_accum * world
