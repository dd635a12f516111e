"""`pipeline(task, plan)`: a Transformers pipeline whose model sits where the plan put it.

`transformers.pipeline()` with no device picks the XPU / Gaudi by itself (X9, G9); hwrun places the
model by the plan instead (device_map, dtype, attention), so the same decisions as `load()` hold
and `hwrun plan` shows them before anything loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import PlanError

if TYPE_CHECKING:
    from ..model.plan import RunPlan


def pipeline(task: str = "text-generation", plan: RunPlan | None = None, **pipeline_kwargs: Any) -> Any:
    """A `transformers.Pipeline` for `task` with the model loaded by `plan` (default: `plan()` here)."""
    import transformers

    from ..model.load import from_pretrained_kwargs, load
    from ..model.plan import plan as make_plan

    if not isinstance(task, str) or not task:
        raise PlanError(f"task={task!r} must be a pipeline task name such as 'text-generation'.")
    for key in ("device", "device_map", "model", "dtype", "torch_dtype"):
        if key in pipeline_kwargs:
            raise PlanError(f"pipeline(..., {key}=...) conflicts with the plan, which decides it; change the plan.")
    plan = make_plan() if plan is None else plan
    if task == "text-generation":
        model, tokenizer = load(plan)
        return transformers.pipeline(task, model=model, tokenizer=tokenizer, **pipeline_kwargs)
    kwargs = from_pretrained_kwargs(plan)
    top = {key: kwargs.pop(key) for key in ("dtype", "device_map", "trust_remote_code") if key in kwargs}
    return transformers.pipeline(task, model=plan.model, model_kwargs=kwargs, **top, **pipeline_kwargs)
