"""`train(plan, data, ...)`: fine-tune with Transformers' `Trainer` (LoRA via PEFT, 4-bit QLoRA via
bitsandbytes), atomic resumable checkpoints, a clean stop on SIGTERM/SIGINT, and the final model
(adapter or merged) saved as safetensors into `output_dir`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import QLoRAUnsupportedError, TrainingConfigError
from .checkpoints import resolve_resume, schedule_change
from .lora import LoraSettings, lora_config, lora_targets
from .patches.record import ModelPatch

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
    """What a `train()` run did: where the model went, the per-step losses, and how it ended."""

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


def _lora_settings(lora: Any, qlora: bool) -> LoraSettings | None:
    if lora is None or lora is False:
        if qlora:
            return LoraSettings()
        return None
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


def _check_numbers(epochs: float, max_steps: int, lr: float, batch_size: int, grad_accum: int,
                   block_size: int, seed: int, save_steps: int) -> None:
    problems = []
    if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32):
        problems.append(f"seed={seed!r} (must be an int in 0..2**32-1, numpy's seed range)")
    if not (isinstance(save_steps, int) and not isinstance(save_steps, bool) and save_steps >= 1):
        problems.append(f"save_steps={save_steps!r} (must be an int >= 1; checkpoints are what resume needs)")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        problems.append(f"batch_size={batch_size!r} (must be an int >= 1)")
    if not (isinstance(grad_accum, int) and grad_accum >= 1):
        problems.append(f"grad_accum={grad_accum!r} (must be an int >= 1)")
    if not (isinstance(block_size, int) and block_size >= 2):
        problems.append(f"block_size={block_size!r} (must be an int >= 2)")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        problems.append(f"lr={lr!r} (must be a positive finite number)")
    if not isinstance(max_steps, int) or (max_steps < 1 and max_steps != -1):
        problems.append(f"max_steps={max_steps!r} (must be >= 1, or -1 to use epochs)")
    if max_steps == -1 and not (isinstance(epochs, (int, float)) and epochs > 0 and math.isfinite(epochs)):
        problems.append(f"epochs={epochs!r} (must be a finite number > 0 when max_steps=-1)")
    if problems:
        raise TrainingConfigError("Invalid training options: " + "; ".join(problems) + ". Fix those values.")


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
    model = AutoModelForCausalLM.from_pretrained(plan.model, **kwargs)
    return model, tokenizer, reason


def train(plan: RunPlan, data: str | os.PathLike | Any, *, lora: Any = None, qlora: bool = False,
          epochs: float = 1.0, max_steps: int = -1, lr: float = 2e-4, batch_size: int = 8,
          grad_accum: int = 1, seed: int = 42, output_dir: str | os.PathLike = "hwrun-train",
          resume: bool | str | None = "auto", block_size: int = 512, merge: bool = False,
          save_steps: int = 100, fused_loss: bool = True, fused_projections: bool = True,
          rope_table: bool = True, loss_kernel: str = "auto", swiglu_kernel: str = "auto",
          plot: bool = True,
          callbacks: Sequence[Any] = (), echo: Callable[[str], Any] | None = None,
          **training_overrides: Any) -> TrainResult:
    """Fine-tune `plan.model` on `data` (text file, JSONL with "text", folder of .txt, or a
    ready dataset) with Trainer; LoRA when `lora` is given or `qlora=True`, else full fine-tuning.

    Checkpoints go to `output_dir/checkpoint-N` (atomic); the final model (adapter, or merged with
    `merge=True`) to `output_dir` itself, so `hwrun generate --model output_dir` loads it.
    `training_overrides` are TrainingArguments keywords (e.g. fsdp=..., deepspeed=...).
    `fused_loss`, `fused_projections` (LoRA on a frozen base, one process or DDP) and `rope_table`
    (packed blocks) switch hwrun's own training path off one by one; each logs why where it cannot apply.
    `loss_kernel` is the fused loss's per-chunk softmax/gradient: 'auto' (hwrun's Triton kernel when
    training on CUDA, else the torch form), 'torch' or 'triton'; `swiglu_kernel` likewise for the
    fused MLP's SwiGLU backward.
    """
    from ..devices import kind_of_device_type
    from .arguments import training_arguments
    from .data import PackedDataset, build_dataset, read_documents
    from .patches.fused_loss import apply_fused_loss, check_kernel, triton_kernel_usable
    from .patches.fused_projections import apply_fused_projections
    from .patches.rope_table import apply_rope_table
    from .patches.swiglu import check_swiglu_kernel, triton_swiglu_usable
    from .plot import loss_points, write_loss_plot
    from .trainer import GracefulStop, HwTrainer, LossLog

    # -- everything that can be rejected is rejected before the model loads --
    _check_numbers(epochs, max_steps, lr, batch_size, grad_accum, block_size, seed, save_steps)
    check_kernel(loss_kernel)
    check_swiglu_kernel(swiglu_kernel)
    if plan.adapter is not None:
        raise TrainingConfigError(
            f"plan.model={plan.model!r} with adapter {plan.adapter!r}: train() fine-tunes a base model "
            "and would train the base without the adapter (full fine-tuning) or wrap it in a second "
            "PEFT layer (LoRA). Fix: train from the base model, or merge the adapter first "
            "(hwrun.model.adapters.merge_adapter_folder(adapter, out, plan)) and train the merged model."
        )
    qlora = bool(qlora) or plan.quantization == "4bit"
    if plan.quantization == "8bit":
        raise TrainingConfigError("plan.quantization='8bit' cannot be fine-tuned by hwrun; train LoRA on a "
                                  "4-bit base (qlora=True) or on an unquantized plan.")
    settings = _lora_settings(lora, qlora)
    if merge and settings is None:
        raise TrainingConfigError("merge=True needs LoRA (there is no adapter to merge in full fine-tuning); "
                                  "pass lora=True, or drop merge.")
    if qlora:
        _check_qlora(plan)
    documents = read_documents(data) if isinstance(data, (str, os.PathLike)) else None
    output_dir = _writable_output_dir(output_dir)
    resume_from = resolve_resume(resume, output_dir)
    run_record = {"kind": "qlora" if qlora else ("lora" if settings is not None else "full"),
                  "model": plan.model}
    _check_output_dir(output_dir, plan, resume_from, run_record)
    # tokenise and pack before the weights load, so data problems (block_size beyond the
    # tokenizer's limit, too little text) surface first; a ready dataset needs no tokenizer here
    data_tokenizer = _data_tokenizer(plan) if documents is not None else None
    dataset = data if documents is None else build_dataset(documents, data_tokenizer, block_size)
    args = training_arguments(
        plan, output_dir, num_train_epochs=epochs, max_steps=max_steps, learning_rate=lr,
        per_device_train_batch_size=batch_size, gradient_accumulation_steps=grad_accum, seed=seed,
        data_seed=seed, save_steps=save_steps, ddp_find_unused_parameters=False, **training_overrides)

    reasons = {}
    if resume_from is not None:
        changed = schedule_change(resume_from, args.max_steps, args.num_train_epochs)
        reasons["resume"] = changed or f"from {resume_from}, same schedule"
        if changed:
            logger.warning("%s", changed)
    zero3 = _deepspeed_zero3(args)
    if zero3:
        # ZeRO-3 partitions the weights while from_pretrained loads them (zero.Init), and
        # Transformers refuses a device_map then; DeepSpeed places each rank's shard itself.
        plan = replace(plan, device_map=None)
        _init_deepspeed_comm(args)
        reasons["sharding"] = "DeepSpeed ZeRO-3: weights partitioned at load (no device_map)"
    model, tokenizer, load_reason = _load_model(plan, qlora=qlora, full=settings is None, tokenizer=data_tokenizer)
    reasons["model"] = load_reason
    if isinstance(dataset, PackedDataset):
        reasons["data"] = f"{len(dataset)} packed blocks of {dataset.blocks.shape[1]} tokens, no padding"
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = False  # training needs no KV cache; restored before the final save

    kind = kind_of_device_type(args.device.type, hint=plan.accelerator.kind)
    if loss_kernel == "auto":
        loss_kernel = "triton" if triton_kernel_usable(kind) else "torch"
    if swiglu_kernel == "auto":
        swiglu_kernel = "triton" if triton_swiglu_usable(kind) else "torch"
    patch = (apply_fused_loss(model, compiled=plan.compile is not None, kernel=loss_kernel)
             if fused_loss else None)
    reasons["loss"] = patch.reason if patch is not None else "model's own loss (fused_loss=False)"
    base_model = model
    layer_patches = []
    if rope_table and isinstance(dataset, PackedDataset):
        layer_patches.append(apply_rope_table(model, int(dataset.blocks.shape[1])))
        reasons["rope"] = layer_patches[-1].reason
    restore_attention = _use_causal_sdpa(model, dataset)
    if restore_attention is not None:
        reasons["attention"] = ("sdpa, causal kernel with no mask built (packed blocks have no padding; "
                                "hwattn.causal), also under torch.compile")
    if settings is not None:
        from peft import get_peft_model, prepare_model_for_kbit_training

        if qlora:
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=True,
                gradient_checkpointing_kwargs={"use_reentrant": False})
        from transformers import set_seed

        set_seed(seed)  # LoRA A matrices are random: same seed, same adapter init, same run
        targets = lora_targets(getattr(model.config, "model_type", "") or "", settings.target_modules)
        model = get_peft_model(model, lora_config(model.config, settings, targets))
        reasons["lora"] = f"r={settings.r} on {_adapted(model.peft_config['default'])} ({targets.reason})"
        if fused_projections:
            why_not = _fusion_blocker(args, qlora)
            layer_patches.append(apply_fused_projections(model, swiglu_kernel) if why_not is None else ModelPatch(False, why_not))
            reasons["projections"] = layer_patches[-1].reason

    from transformers import default_data_collator

    stopper = GracefulStop()
    trainer = HwTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                        data_collator=default_data_collator,
                        callbacks=[*callbacks, stopper, LossLog(echo)])
    trainer.hw_run = run_record
    if echo is not None:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # LossLog's lines replace its raw log dicts
    installed = stopper.install()
    try:
        output = trainer.train(resume_from_checkpoint=resume_from)
    finally:
        if installed:
            stopper.uninstall()
        if restore_attention is not None:
            base_model.set_attn_implementation(restore_attention)
        if use_cache is not None:
            base_model.config.use_cache = use_cache
        for layer_patch in reversed(layer_patches):
            layer_patch.undo()  # separate weights again before the final save or merge
    if patch is not None:
        patch.undo()

    interrupted = None
    if stopper.received is not None:
        import signal

        interrupted = signal.Signals(stopper.received).name
        logger.warning("Training stopped by %s at step %d; checkpoint saved in %s. Run again with "
                       "resume='auto' (--resume) to continue.", interrupted, trainer.state.global_step,
                       output_dir)
    merged = False
    if interrupted is None:
        merged = _save_final(trainer, tokenizer, output_dir, settings is not None, merge, qlora, plan, zero3)
    if zero3:
        _release_zero3()  # later loads in this process (hwrun.load, generate) get whole weights again
    points = loss_points(trainer.state.log_history)
    plot_path = None
    if plot and trainer.is_world_process_zero():
        plot_path = str(write_loss_plot(points, output_dir / LOSS_PLOT, title=f"hwrun train: {Path(plan.model).name}"))
    world = max(1, args.world_size)
    return TrainResult(
        output_dir=str(output_dir), global_step=trainer.state.global_step, losses=tuple(points),
        lora=settings is not None, merged=merged, interrupted=interrupted, resumed_from=resume_from,
        loss_plot=plot_path, tokens_per_step=_tokens_per_step(dataset, batch_size, grad_accum, world),
        train_runtime=output.metrics.get("train_runtime"), metrics=dict(output.metrics), reasons=reasons)


_KIND_FLAGS = {"lora": "--lora", "qlora": "--qlora", "full": "no --lora/--qlora"}


def _writable_output_dir(output_dir: str | os.PathLike) -> Path:
    """The output folder, refused before anything loads when it is empty (`''` would train into the
    current folder, issue 27), an existing file, or not writable; write-tested otherwise (in a single
    process, folders created for the test are removed again, so a later refusal leaves the disk as it was)."""
    if not isinstance(output_dir, (str, os.PathLike)) or str(output_dir).strip() == "":
        raise TrainingConfigError(
            f"output_dir={output_dir!r} is empty: the run would write its checkpoints, model card and model into "
            "the current folder, over files that are not hwrun's. Fix: name a folder (e.g. --output my-finetune)."
        )
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise TrainingConfigError(f"output_dir={str(path)!r} is an existing file, not a folder. Fix: name a folder.")
    created = [folder for folder in (path, *path.parents) if not folder.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hwrun-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):  # one process: leave no trace for a refusal;
            for folder in created:  # with several ranks another one may be writing its probe there right now
                folder.rmdir()
    except OSError as error:
        raise TrainingConfigError(
            f"output_dir={str(path)!r} cannot be written ({error.strerror or error}): checkpoints and the final "
            "model would fail only after training. Fix: choose a folder you can write to."
        ) from error
    return path


def _check_output_dir(output_dir: Path, plan: RunPlan, resume_from: str | None, run: dict) -> None:
    """Refuse, before the model loads, an output_dir whose contents the run would destroy or mix:
    the model's own folder, an earlier run's final model or checkpoints on a fresh start, or a
    checkpoint of a different kind of run (LoRA vs full) on resume."""
    from .checkpoints import FINAL_FILES, check_checkpoint, checkpoint_run, list_checkpoints

    source = Path(plan.model)
    if source.exists() and output_dir.resolve() == source.resolve():
        raise TrainingConfigError(
            f"output_dir={str(output_dir)!r} is the folder of the model being trained; the final save "
            "would overwrite its weights. Fix: pass another output_dir (e.g. --output my-finetune)."
        )
    if resume_from is not None:
        earlier = checkpoint_run(resume_from)
        if earlier and earlier.get("kind") != run["kind"]:
            raise TrainingConfigError(
                f"Cannot resume from {resume_from!r}: it was written by a {earlier.get('kind')} run and this "
                f"is a {run['kind']} run, whose weights and optimizer state do not match it. Fix: resume "
                f"with the same kind ({_KIND_FLAGS.get(earlier.get('kind'), earlier.get('kind'))}), "
                "or start this run in a new output_dir."
            )
        return
    found = [name for name in FINAL_FILES if (output_dir / name).is_file()]
    # complete checkpoints only: a partial one (a save that crashed) holds nothing to keep, and
    # resume='auto' skips it and starts fresh, as documented
    found += [folder.name for _, folder in list_checkpoints(output_dir) if check_checkpoint(folder) is None]
    if found:
        raise TrainingConfigError(
            f"output_dir={str(output_dir)!r} already holds an earlier run ({', '.join(sorted(found)[:6])}"
            f"{', ...' if len(found) > 6 else ''}) and this run starts fresh: its final save and checkpoint "
            "rotation would replace or delete those files. Fix: resume='auto' (--resume) to continue that "
            "run, a new output_dir, or move the old folder away yourself."
        )


def _deepspeed_zero3(args: Any) -> bool:
    """True when `args` train with DeepSpeed ZeRO-3 (from deepspeed=..., or from `accelerate launch
    --use_deepspeed`'s plugin); rejects, before the model loads, a ZeRO-3 config that would leave
    nothing to save at the end as one safetensors model."""
    plugin = getattr(args, "deepspeed_plugin", None)
    config = getattr(plugin, "hf_ds_config", None)
    if config is None or not config.is_zero3():
        return False
    if not config.is_true("zero_optimization.stage3_gather_16bit_weights_on_model_save"):
        source = (f"deepspeed={args.deepspeed!r}" if args.deepspeed else
                  "accelerate's DeepSpeed plugin (accelerate launch --use_deepspeed)")
        _release_zero3()  # these arguments are abandoned: leave no ZeRO-3 flag for later loads
        raise TrainingConfigError(
            f"{source} uses ZeRO stage 3 without "
            "zero_optimization.stage3_gather_16bit_weights_on_model_save=true: each rank then holds only "
            "its shard and neither Trainer's checkpoints nor hwrun's final model could be written as "
            "safetensors. Fix: set \"stage3_gather_16bit_weights_on_model_save\": true in the "
            "zero_optimization section (accelerate: --zero3_save_16bit_model true), or use stage 2."
        )
    return True


def _init_deepspeed_comm(args: Any) -> None:
    """Start deepspeed.comm on the process group Trainer's arguments started, before zero.Init
    partitions the weights at load. accelerate does this itself only for accelerator groups; on a
    CPU (gloo) group deepspeed.comm would still be down and zero.Init would see a world of 1."""
    if args.world_size <= 1:
        return
    from deepspeed import comm

    if not comm.is_initialized():
        logger.info("ZeRO-3 on a %s group of %d: starting deepspeed.comm on it before the model loads",
                    args.ddp_backend or "default", args.world_size)
        comm.init_distributed(dist_backend=args.ddp_backend, auto_mpi_discovery=False)


def _release_zero3() -> None:
    """Clear Transformers' process-wide ZeRO-3 flag (a weak reference to the arguments' DeepSpeed
    config, set when they were built), which would make every later from_pretrained partition."""
    from transformers.integrations import deepspeed

    deepspeed.unset_hf_deepspeed_config()


@contextlib.contextmanager
def _zero3_suspended() -> Iterator[None]:
    """While active, from_pretrained loads whole weights even if Trainer's arguments enabled
    ZeRO-3: under it zero.Init partitions at load, a collective that hangs when one rank loads
    alone (the merge after training). Transformers' ZeRO-3 flag is restored on exit."""
    from transformers.integrations import deepspeed

    saved = deepspeed._hf_deepspeed_config_weak_ref
    _release_zero3()
    try:
        yield
    finally:
        deepspeed._hf_deepspeed_config_weak_ref = saved


def _use_causal_sdpa(model: Any, dataset: Any) -> str | None:
    """Switch an sdpa model to hwattn's causal SDPA when every batch is an unpadded packed block
    (no mask to build); returns the implementation to restore afterwards, or None (unchanged)."""
    from .data import PackedDataset

    if not isinstance(dataset, PackedDataset) or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return None
    import hwattn

    model.set_attn_implementation(hwattn.register_causal_sdpa())
    return "sdpa"


def _adapted(config: Any) -> str:
    """What PEFT adapted, as module names: it resolves "all-linear" to full module paths (listed here by
    their last part) and, for MoE experts kept as 3-D parameters, adds `target_parameters`."""
    modules = config.target_modules
    names = [modules] if isinstance(modules, str) else sorted({name.rsplit(".", 1)[-1] for name in modules})
    text = ",".join(names)
    parameters = sorted(getattr(config, "target_parameters", None) or ())
    return f"{text} and parameters {','.join(parameters)}" if parameters else text


def _fusion_blocker(args: Any, qlora: bool) -> str | None:
    """Why the projections of this run stay separate, or None: fusing shares one storage between
    frozen weights, which FSDP and DeepSpeed shard per parameter, and 4-bit layers cannot concatenate."""
    if qlora:
        return "not fused: the 4-bit base layers are not plain Linear layers"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        return "not fused: FSDP shards each weight on its own"
    if getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None) is not None:
        return "not fused: DeepSpeed partitions each weight on its own"
    return None


def _tokens_per_step(dataset: Any, batch_size: int, grad_accum: int, world: int) -> int:
    blocks = getattr(dataset, "blocks", None)
    block = int(blocks.shape[1]) if blocks is not None else 0
    return block * batch_size * grad_accum * world


def _retie_gathered(state_dict: dict[str, Any], model: Any) -> None:
    """Gathering FSDP shards copies every parameter, so weights the model ties (lm_head = embed_tokens)
    come back as separate tensors; save_pretrained finds ties by shared storage and would then write
    both. Point each alias at one tensor again, so the saved model is what a single-process run saves."""
    first: dict[int, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in state_dict:
            primary = first.setdefault(id(parameter), name)
            if primary != name:
                state_dict[name] = state_dict[primary]


def _save_final(trainer: Any, tokenizer: Any, output_dir: Path, is_lora: bool, merge: bool, qlora: bool,
                plan: RunPlan, zero3: bool) -> bool:
    """Save the final model into `output_dir` (main process only); returns True when merged."""
    from ..model.adapters import merge_adapter_folder, save_adapter, save_merged
    from .checkpoints import final_staging, publish_final

    trainer.accelerator.wait_for_everyone()
    # Under FSDP (DTensors) and DeepSpeed ZeRO-3 (partitioned parameters) every rank holds shards:
    # gather the full state dict first (a collective, so on all ranks; rank 0 gets it). Merging needs
    # whole weights, so there it goes through a saved adapter, as for QLoRA.
    sharded = bool(getattr(trainer, "is_fsdp_enabled", False)) or zero3
    engine = trainer.deepspeed if getattr(trainer, "is_deepspeed_enabled", False) else trainer.model
    state_dict = trainer.accelerator.get_state_dict(engine) if sharded else None
    merged = False
    if trainer.is_world_process_zero():
        model = trainer.accelerator.unwrap_model(trainer.model)
        if state_dict:
            _retie_gathered(state_dict, model)
        # written into output_dir/.staging-final first and moved into place only when complete,
        # so a failure mid-save leaves output_dir (a resumed run's earlier final model) as it was
        staging = final_staging(output_dir)
        if not is_lora:
            model.save_pretrained(staging, safe_serialization=True, state_dict=state_dict)
            tokenizer.save_pretrained(staging)
        elif not merge:
            save_adapter(model, tokenizer, staging, state_dict=state_dict)
        elif qlora or sharded:
            adapter_dir = staging / "adapter"
            save_adapter(model, tokenizer, adapter_dir, state_dict=state_dict)
            with _zero3_suspended():  # rank 0 alone loads the whole base to merge into
                merge_adapter_folder(adapter_dir, staging, plan)
            merged = True
        else:
            save_merged(model, tokenizer, staging)
            merged = True
        publish_final(staging, output_dir)
        logger.info("Final %s saved to %s", "merged model" if merged else
                    ("adapter" if is_lora else "model"), output_dir)
    trainer.accelerator.wait_for_everyone()
    return merged or (merge and is_lora)
