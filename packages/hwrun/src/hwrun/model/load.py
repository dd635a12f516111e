"""`load(plan)`: model and tokenizer through `from_pretrained`, safetensors only, as the plan says.

`from_pretrained_kwargs(plan)` is exactly what `load()` passes, so training can add to it (QLoRA).
Local folders load with `local_files_only=True` (nothing asks the Hub); a Hub id loads from the
cache when `HF_HUB_OFFLINE=1` and says so clearly when it is neither cached nor reachable.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelSourceError
from .source import model_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from .plan import RunPlan

logger = logging.getLogger(__name__)

_OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}


def hub_offline(environ: Any = None) -> bool:
    """True when `HF_HUB_OFFLINE` (or the older `TRANSFORMERS_OFFLINE`) is set to a true value."""
    env = os.environ if environ is None else environ
    return any(env.get(name, "").upper() in _OFFLINE_VALUES for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def from_pretrained_kwargs(plan: RunPlan) -> dict[str, Any]:
    """The keyword arguments `load()` passes to `AutoModelForCausalLM.from_pretrained` for `plan`."""
    import hwattn

    kwargs: dict[str, Any] = {
        "dtype": plan.torch_dtype(),
        "use_safetensors": True,
        "trust_remote_code": plan.trust_remote_code,
    }
    source = plan.model_source()
    # the same config plan() gave hwattn, so the load asks for the attention the plan chose
    kwargs.update(hwattn.load_kwargs(plan.accelerator, plan.attention.requested, plan.use_kernels,
                                     model_config=model_config(source), fallback=plan.attention.fallback))
    if plan.device_map is not None:
        kwargs["device_map"] = plan.device_map
    if getattr(plan, "tp", 1) > 1:  # each rank loads its shards onto its own device (Transformers' plan; device_map is exclusive)
        kwargs.pop("device_map", None)
        kwargs.update(tensor_parallel_kwargs(plan.tp))
    if plan.quantization:
        from .quantization import quantization_config

        # bitsandbytes, torchao or hqq on load; none for a pre-quantized checkpoint (Transformers reads its own)
        config = quantization_config(plan, model_config(source))
        if config is not None:
            kwargs["quantization_config"] = config
    if source.local or hub_offline():
        kwargs["local_files_only"] = True
    return kwargs


def tensor_parallel_kwargs(tp: int) -> dict[str, Any]:
    """`from_pretrained` keywords that split the model across `tp` ranks with its own tensor-parallel plan:
    `distributed_config=DistributedConfig(tp_size=tp)` (Transformers 5.x; its `tp_plan="auto"` argument is the
    deprecated spelling of the same), or `tp_plan="auto", tp_size=tp` where `DistributedConfig` does not exist yet."""
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:  # pragma: no cover - Transformers before the distributed package
        return {"tp_plan": "auto", "tp_size": tp}
    return {"distributed_config": DistributedConfig(tp_size=tp)}


def load_tokenizer(plan: RunPlan, source: str | os.PathLike | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `source` (default: the plan's model) with the plan's `trust_remote_code`,
    local files only where `from_pretrained_kwargs` loads the weights so (a local folder, or offline)."""
    from transformers import AutoTokenizer

    offline = from_pretrained_kwargs(plan).get("local_files_only")
    return AutoTokenizer.from_pretrained(source if source is not None else plan.model,
                                         trust_remote_code=plan.trust_remote_code,
                                         **({"local_files_only": True} if offline else {}))


def apply_env(plan: RunPlan) -> dict[str, str]:
    """Set the plan's variables (e.g. PT_ENABLE_INT64_SUPPORT=1 on Gaudi, G4) that are not set yet; returns those set."""
    changed = {}
    for name, value in plan.env.items():
        if os.environ.get(name) != value:
            if name in os.environ:
                logger.warning("%s=%s is set; the plan needs %s=%s, leaving the user's value", name,
                               os.environ[name], name, value)
                continue
            os.environ[name] = value
            changed[name] = value
            logger.info("set %s=%s for this process (%s)", name, value, plan.reasons.get("env", ""))
    return changed


def load(plan: RunPlan, *, tokenizer: PreTrainedTokenizerBase | None = None, verify: bool = False
         ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the plan's model and tokenizer (eval mode). Raises ModelSourceError when the model cannot be read.
    `tokenizer`: one already loaded with `load_tokenizer(plan)`, used instead of loading it again.
    A model `hwrun train` wrote is first compared with the checksums it recorded (`hwrun.model.integrity`: every
    byte up to 512 MiB, else sizes and safetensors headers; every byte with `verify=True`): ModelIntegrityError."""
    from .integrity import verify_output

    source = plan.model_source()
    apply_env(plan)
    if getattr(plan, "tp", 1) > 1:  # the ranks' group first (hwdist: backend, devices checked), Transformers' mesh is built on it
        from ..parallel.ranks import ensure_group

        ensure_group(plan)
    kwargs = from_pretrained_kwargs(plan)
    from transformers import AutoModelForCausalLM

    if plan.adapter is not None:
        model, tokenizer = load_adapter_model(plan.adapter, plan, verify=verify)
        return _finish(model, tokenizer, plan)
    if source.local:
        verify_output(source.path, full=verify)
    try:
        if tokenizer is None:
            tokenizer = load_tokenizer(plan)
        model = AutoModelForCausalLM.from_pretrained(plan.model, **kwargs)
    except OSError as exc:
        if source.local:
            raise ModelSourceError(f"model={plan.model!r} could not be loaded: {exc}") from exc
        if hub_offline():
            raise ModelSourceError(
                f"model={plan.model!r} is a Hub id, HF_HUB_OFFLINE is set and it is not in the local Hub cache "
                f"({exc.__class__.__name__}). Download it on a machine with network "
                "(`huggingface-cli download ...`), or pass a local folder."
            ) from exc
        raise ModelSourceError(
            f"model={plan.model!r} is a Hub id that is neither in the local Hub cache nor reachable "
            f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}). Check the network or the id, set "
            "HF_HUB_OFFLINE=1 to use the cache only, or pass a local folder."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - only safetensors' own error is translated here
        if type(exc).__name__ != "SafetensorError":
            raise
        from .integrity import safetensors_header

        for file in source.safetensors:
            safetensors_header(file)  # names the damaged file (ModelIntegrityError)
        raise ModelSourceError(f"model={plan.model!r}: safetensors could not read its weights "
                               f"({' '.join(str(exc).split())[:200]}): a weight file is damaged. Fix: download or "
                               "save the model again.") from exc
    return _finish(model, tokenizer, plan)


def _finish(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, plan: RunPlan):
    """Pad token, left padding, eval mode and device placement, the same for every load path."""
    if tokenizer.pad_token_id is None:
        # Left-padded batches need a pad id; the EOS token is the usual stand-in and is never attended to.
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer has no pad token: using the EOS token %r for padding", tokenizer.eos_token)
    tokenizer.padding_side = "left"
    model.eval()
    if plan.device_map is None and getattr(plan, "tp", 1) <= 1:  # tensor-parallel shards are already on each rank's own device
        model.to(plan.device)
    from .quantization import after_load

    after_load(model, plan)  # bitsandbytes' CPU 4-bit layers its repacking cannot take (issue 43.4)
    return model, tokenizer


def load_adapter_model(path: str | os.PathLike, plan: RunPlan | None = None, *, quantized: bool | None = None,
                       allow_pickle: bool = False, verify: bool = False):
    """Load the base model named in `path`'s adapter_config.json (with `plan`'s device, dtype and
    attention via `hwrun.from_pretrained_kwargs`) and attach the adapter; returns (model, tokenizer).
    Adapter weights load from adapter_model.safetensors only; a folder with only adapter_model.bin (pickle)
    raises AdapterFormatError before anything loads unless `allow_pickle=True`. An adapter `hwrun train` wrote is
    compared with its recorded sha256 first (and a base it wrote too: every byte with `verify=True`); PEFT's own
    refusals (shapes of another base, target modules not found, a damaged file) are AdapterFormatErrors."""
    from .adapters import adapter_base_model, adapter_load_error, check_adapter_weights
    from .integrity import verify_output

    check_adapter_weights(path, allow_pickle=allow_pickle)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from .plan import plan as make_plan

    base = adapter_base_model(path)
    if plan is None:
        plan = make_plan(base)
    elif plan.model != base:
        # the same run for the adapter's base: quantization and kernels too (a quantized plan must not load an
        # unquantized base because the adapter names the base by another spelling of its path)
        plan = make_plan(base, device=plan.accelerator, dtype=plan.dtype, attention=plan.attention.requested,
                         use_kernels=plan.use_kernels, quantization=plan.quantization,
                         trust_remote_code=plan.trust_remote_code)
    kwargs = dict(from_pretrained_kwargs(plan))
    if quantized is False:
        kwargs.pop("quantization_config", None)
    verify_output(base, full=verify)  # a base that hwrun wrote (a merged model) is checked like the adapter
    model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
    try:
        model = PeftModel.from_pretrained(model, os.fspath(path), is_trainable=False)
    except Exception as error:  # noqa: BLE001 - PEFT's, torch's and safetensors' errors, translated
        raise adapter_load_error(path, base, error) from error
    model.eval()
    tokenizer_source = path if (Path(path) / "tokenizer_config.json").is_file() else base
    tokenizer = load_tokenizer(plan, tokenizer_source)
    logger.info("Loaded %s + LoRA adapter %s", base, path)
    return model, tokenizer


def merge_adapter_folder(adapter_dir: str | os.PathLike, output_dir: str | os.PathLike, plan: RunPlan) -> Path:
    """Load base (unquantized, plan dtype) + adapter from `adapter_dir`, merge, save to `output_dir`
    (used after QLoRA: merging into 4-bit weights would lose precision)."""
    from .adapters import save_merged

    model, tokenizer = load_adapter_model(adapter_dir, plan, quantized=False)
    return save_merged(model, tokenizer, output_dir)
