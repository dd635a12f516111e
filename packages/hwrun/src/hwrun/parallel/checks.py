"""`plan(tp=N)`'s decision: can N processes, one per device, split this model with Transformers' tensor-parallel plan
here, and how. Everything is read from config.json, the model class's declared plan and hwdist/hwenv's device facts;
nothing loads and no process starts.

The split is Transformers' own (`base_model_tp_plan` of the config class, `_tp_plan` of the causal-LM class, applied by
`from_pretrained(distributed_config=DistributedConfig(tp_size=N))`, the successor of `tp_plan="auto"`): hwrun only
checks that it can run and says what it does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import devices
from ..errors import TensorParallelError

if TYPE_CHECKING:
    import hwenv

logger = logging.getLogger(__name__)

#: Per kind: None where tensor parallelism runs, else why it does not (a kind with no row: allowed, said so).
TP_BLOCKERS: dict[str, str | None] = {
    "hpu": None,
    "xpu": None,
    "rocm": None,
    "cuda": None,
    "mps": ("torch's DeviceMesh/DTensor stack has no MPS mesh and Transformers refuses tensor parallelism on MPS "
            "(initialize_distributed_mesh); run on one device"),
    "cpu": None,
}

#: Projection names whose column-wise split cuts the attention heads (their outputs are heads x head_dim).
QUERY_PROJECTIONS = ("q_proj", "query", "qkv_proj", "query_key_value", "c_attn", "Wqkv")
KEY_PROJECTIONS = ("k_proj", "key", "qkv_proj", "query_key_value", "c_attn", "Wqkv")
#: What each Transformers parallel style does to a layer, in words (styles of transformers/distributed/tensor_parallel).
STYLE_WORDS = {
    "colwise": "column-wise (output features split)",
    "colwise_rep": "column-wise, output gathered",
    "colwise_gather_output": "column-wise, output gathered",
    "unit_colwise": "column-wise by whole heads",
    "rowwise": "row-wise (input split, output all-reduced)",
    "unit_rowwise": "row-wise by whole heads, all-reduced",
    "rowwise_rep": "row-wise, output all-reduced",
    "rowwise_split_input": "row-wise, input split here, output all-reduced",
    "embedding_rowwise": "vocabulary split, looked up and all-reduced",
    "embedding_colwise": "embedding width split",
    "packed_colwise": "packed column-wise (fused gate/up split)",
    "packed_rowwise": "packed row-wise",
    "replicated_with_grad_allreduce": "replicated",
    "replicate": "replicated",
    "sequence_parallel": "sequence-parallel",
    "all_reduce": "output all-reduced",
    "moe_tp_experts": "experts split column/row-wise, all-reduced",
    "local_params": "local parameters",
}


@dataclass(frozen=True)
class TensorParallelPlan:
    """How `tp` processes split the model: the backend, the devices, the model class and its plan, the split in words."""

    tp: int
    backend: str
    processes: str  # which devices the ranks use, and why they are allowed
    model_class: str
    tp_plan: dict[str, str] = field(default_factory=dict)  # the model's plan as Transformers declares it
    split: tuple[str, ...] = ()  # one line per part of the model: how it is split
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"tp": self.tp, "backend": self.backend, "processes": self.processes, "model_class": self.model_class,
                "tp_plan": dict(self.tp_plan), "split": list(self.split), "reason": self.reason}


def check_tp_value(tp: object) -> int:
    """`tp` as a positive integer, or a TensorParallelError naming the value."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise TensorParallelError(f"tp={tp!r} must be a positive integer: the number of processes (one per device) "
                                  "the model is split across; 1 runs it in this process.")
    return tp


def text_config(config: dict | None) -> dict:
    """The decoder's settings of a config.json (its `text_config` for multimodal models)."""
    if not config:
        return {}
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def declared_tp_plan(config: dict | None) -> tuple[str, dict[str, str]]:
    """(causal-LM class name, its tensor-parallel plan) as the installed Transformers declares them, read from the
    classes (the config class's `base_model_tp_plan`, prefixed `model.`, and the model class's own `_tp_plan`)
    without loading weights; an empty plan when the class declares none."""
    config = config or {}
    model_type = config.get("model_type")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = config.get("architectures") or []
    name = (architectures[0] if architectures and isinstance(architectures[0], str)
            else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, f"{model_type} (no causal-LM class)"))
    plan: dict[str, str] = {}
    try:
        config_class = CONFIG_MAPPING[model_type]
    except KeyError:
        return name, plan
    base = getattr(config_class, "base_model_tp_plan", None) or {}
    plan.update({f"model.{key}": style for key, style in base.items()})
    import transformers

    model_class = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    own = getattr(model_class, "_tp_plan", None) or {}
    plan.update(own)
    return name, plan


def _styles(plan: dict[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {key: style for key, style in plan.items() if key.rsplit(".", 1)[-1] in names}


def check_heads(config: dict | None, plan: dict[str, str], tp: int, model_class: str) -> list[str]:
    """Refuse `tp` that does not divide the attention or KV heads the plan splits column-wise; the lines saying how
    the heads are split."""
    cfg = text_config(config)
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    kv = cfg.get("num_key_value_heads") or heads
    lines = []
    query = {k: s for k, s in _styles(plan, QUERY_PROJECTIONS).items() if s.startswith("colwise")}
    keys = {k: s for k, s in _styles(plan, KEY_PROJECTIONS).items() if s.startswith("colwise")}
    if not isinstance(heads, int) or not isinstance(kv, int):
        if query or keys:
            raise TensorParallelError(f"tp={tp}: {model_class}'s plan splits attention heads, but config.json gives no "
                                      f"integer num_attention_heads / num_key_value_heads ({heads!r} / {kv!r}) to check "
                                      "them against; fix config.json or run with tp=1.")
        return lines
    valid = [n for n in range(1, heads + 1) if heads % n == 0 and kv % n == 0]
    if query and heads % tp:
        raise TensorParallelError(f"tp={tp} does not divide {model_class}'s {heads} attention heads (num_attention_heads):"
                                  f" each rank must hold whole heads. Use tp in {valid} (dividing both the {heads} "
                                  f"attention and {kv} KV heads).")
    if keys and kv % tp:
        raise TensorParallelError(f"tp={tp} does not divide {model_class}'s {kv} KV heads (num_key_value_heads; grouped-"
                                  f"query attention): each rank must hold whole KV heads. Use tp in {valid}.")
    if query or keys:
        values = {k: s for k, s in _styles(plan, ("v_proj", "value")).items() if s.startswith("colwise")}
        names = sorted({k.rsplit(".", 1)[-1] for k in {**query, **keys, **values}})
        lines.append(f"attention: {heads} query / {kv} KV heads -> {heads // tp} / {kv // tp} per rank "
                     f"({', '.join(names)} column-wise)")
    return lines


def describe_split(config: dict | None, plan: dict[str, str], tp: int) -> list[str]:
    """One line per kind of layer in the plan (besides the heads) and what stays whole on every rank."""
    cfg = text_config(config)
    lines = []
    grouped: dict[str, list[str]] = {}
    for key, style in plan.items():
        leaf = key.rsplit(".", 1)[-1]
        if leaf in QUERY_PROJECTIONS or leaf in KEY_PROJECTIONS or leaf in ("v_proj", "value"):
            continue
        grouped.setdefault(STYLE_WORDS.get(style, style), []).append(key.replace("model.layers.*.", ""))
    for words, keys in grouped.items():
        lines.append(f"{', '.join(sorted(keys))}: {words}")
    inter = cfg.get("intermediate_size")
    if isinstance(inter, int) and any(k.endswith(("gate_proj", "up_proj")) for k in plan):
        lines.append(f"MLP: intermediate {inter} -> about {-(-inter // tp)} per rank")
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if isinstance(experts, int) and experts > 1 and not any(".experts" in k for k in plan):
        lines.append(f"experts: all {experts} replicated on every rank (Transformers' TP plan does not split them; "
                     "its expert-parallel plan is not used), so they do not shrink with tp")
    lines.append("embeddings, norms and anything the plan does not name: replicated on every rank")
    return lines


#: Parallel styles that leave every rank a 1/tp slice of the weight (the others keep it whole).
SPLIT_STYLES = ("colwise", "rowwise", "colwise_rep", "colwise_gather_output", "unit_colwise", "unit_rowwise",
                "rowwise_rep", "rowwise_split_input", "embedding_rowwise", "embedding_colwise", "packed_colwise",
                "packed_rowwise", "moe_tp_experts")


def _matches(name: str, pattern: str) -> bool:
    """Whether a weight name (`model.layers.3.mlp.up_proj.weight`) belongs to a plan key (`model.layers.*.mlp.up_proj`)."""
    import re

    regex = re.escape(pattern).replace(r"\*", r"\d+")
    return re.fullmatch(rf"{regex}(\.[A-Za-z_]+)?", name) is not None


def bytes_per_rank(tensors: list[tuple[str, int]], plan: dict[str, str], tp: int, per_element: float) -> int:
    """Bytes one rank holds: the split weights' 1/tp slice (rounded up), everything else whole. A weight named with
    another prefix than the plan's (`model.`) is matched by its name after the first dot too."""
    split = [key for key, style in plan.items() if style in SPLIT_STYLES]
    total = 0.0
    for name, count in tensors:
        bare = name.split(".", 1)[1] if "." in name else name
        if any(_matches(name, key) or _matches(f"model.{bare}", key) for key in split):
            total += -(-count // tp) * per_element
        else:
            total += count * per_element
    return int(total)


def plan_tensor_parallel(accel: hwenv.Accelerator, config: dict | None, tp: int, *, weight_bytes: int | None,
                         planned_elsewhere: bool, quantization: str | None = None,
                         adapter: str | None = None, tensors: list[tuple[str, int]] | None = None,
                         per_element: float | None = None, fit_fraction: float = 0.85) -> TensorParallelPlan:
    """Check `tp` processes for this model on `accel` (devices, backend, the model class's plan, its heads) and say
    how the model is split; TensorParallelError for anything that would fail after launch."""
    import hwdist
    from hwdist.launch import check_process_count

    tp = check_tp_value(tp)
    kind = accel.kind
    blocker = devices.row(TP_BLOCKERS, kind, None)
    if blocker is not None:
        raise TensorParallelError(f"tp={tp} on {kind}: {blocker}.")
    if quantization:
        raise TensorParallelError(f"tp={tp} with quantization={quantization!r}: hwrun has not run Transformers' "
                                  "tensor-parallel loading with quantized weights; use one or the other.")
    if adapter is not None:
        raise TensorParallelError(f"tp={tp} with the LoRA adapter {adapter}: PEFT's layers are not in Transformers' "
                                  "tensor-parallel plan; merge the adapter first (hwrun train --merge) and pass the "
                                  "merged model.")
    try:
        processes = check_process_count(tp, accel, read_selection=not planned_elsewhere)
    except hwdist.HwdistError as error:
        raise TensorParallelError(f"tp={tp}: {error}") from error
    backend = hwdist.backend_for(accel)
    model_class, plan = declared_tp_plan(config)
    if not plan:
        raise TensorParallelError(f"tp={tp}: {model_class} declares no tensor-parallel plan in this Transformers (no "
                                  "base_model_tp_plan on its config class, no _tp_plan on the class), so "
                                  "from_pretrained cannot split it. Run it with tp=1 (or device_map='auto' across "
                                  "devices), or pick a model family that has one.")
    split = [*check_heads(config, plan, tp, model_class), *describe_split(config, plan, tp)]
    size = "" if weight_bytes is None else f"; weights {_size(weight_bytes)} in all"
    if tensors and per_element:
        rank_bytes = bytes_per_rank(tensors, plan, tp, per_element)
        size += f", {_size(rank_bytes)} per rank (safetensors headers and the plan)"
        check_fit(accel, rank_bytes, tp, fit_fraction, model_class)
    reason = (f"tp={tp}: {processes.reason}; backend {backend.name} ({backend.reason}); {model_class}'s own "
              f"tensor-parallel plan, loaded with from_pretrained(distributed_config=DistributedConfig(tp_size={tp})): "
              f"every rank holds 1/{tp} of the split layers and runs every step, an all-reduce after each row-wise "
              f"layer{size}")
    if processes.kind != kind:  # pragma: no cover - check_process_count keeps the kind
        logger.warning("process check for %s answered for %s", kind, processes.kind)
    return TensorParallelPlan(tp, backend.name, processes.reason, model_class, plan, tuple(split), reason)


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def check_fit(accel: hwenv.Accelerator, rank_bytes: int, tp: int, fit_fraction: float, model_class: str) -> None:
    """Refuse a split whose per-rank weights exceed one device's budget (the same budget the single-device plan uses),
    where the device's memory is known."""
    per_device = accel.memory_per_device if accel.platform.is_accelerator else None
    if not per_device:
        return
    budget = int(per_device * fit_fraction)
    if rank_bytes > budget:
        raise TensorParallelError(
            f"tp={tp}: each rank would hold {_size(rank_bytes)} of {model_class}'s weights, more than one "
            f"{accel.kind} device's budget ({_size(budget)}: {fit_fraction:.0%} of {_size(per_device)}, the rest for "
            "the KV cache and activations). Split across more devices (a larger tp that divides the heads) or use "
            "smaller weights.")
