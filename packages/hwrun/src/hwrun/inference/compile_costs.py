"""Whether compiling hwrun's decode step pays for a run (`compile="auto"`): measured costs only, each with its file and
date (`COMPILE_COSTS`), and the break-even rule over them (`compile_pays`): tokens x (eager step - compiled step)
against the compile's cost. `inference.decision` asks it; nothing here touches a device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model.plan import RunPlan


@dataclass(frozen=True)
class CompileCost:
    """One measured pair on one device: hwrun's eager step captured as one graph against the same step compiled by
    Inductor (total tokens/s at `batch` prompts), the compile's cost (cold cache; warm where measured), and where."""

    device: str  # matched against the accelerator's names ("H100" in "NVIDIA H100 80GB HBM3")
    dtype: str
    weight_bytes: int  # the model measured; a plan within a factor of 2 of it uses the row
    batch: int
    eager_tps: float
    compiled_tps: float
    compile_s: float
    warm_compile_s: float | None
    source: str


#: Measured figures only (the random 1.24B Llama of tools/bench: bf16, 2.47 GB, 128-token prompts, 256 new tokens).
#: H100: quantization.md's eager-step run (2026-12-06 14:00, fd0983a) and compiled run (17:15, c08e3bd); compile =
#: the compiled row's elapsed_s (warm-up and repeats, load excluded: 123.6 s at batch 1, 115.4 s at 64) less the
#: eager row's (2.2 s, 3.6 s). At 64 prompts the compiled engine was slower, across a change of the engine (paged
#: KV between the runs): the rule reads it as "does not pay". H200: decode.md's batch-1 table of 2026-12-03 (fused
#: step, CUDA graph 452.3 tok/s with 0.2 s warm-up; + inductor 827.5 with 26.1 s). No warm-cache compile was timed.
COMPILE_COSTS: tuple[CompileCost, ...] = (
    CompileCost("H100", "bfloat16", 2_471_629_056, 1, 410.2, 767.5, 121.4, None,
                "docs/benchmarks/quantization.md 2026-12-06"),
    CompileCost("H100", "bfloat16", 2_471_629_056, 64, 14_287.1, 8_282.5, 111.8, None,
                "docs/benchmarks/quantization.md 2026-12-06"),
    CompileCost("H200", "bfloat16", 2_471_629_056, 1, 452.3, 827.5, 25.9, None,
                "docs/benchmarks/decode.md 2026-12-03"),
)


def _cost_row(plan: RunPlan, batch: int, costs: tuple[CompileCost, ...]) -> CompileCost | None:
    """The measured row for the plan's device, dtype and model size (within 2x) nearest to `batch` (within 2x)."""
    names = " ".join(plan.accelerator.names).lower()
    size = getattr(plan, "weight_bytes", 0) or 0
    rows = [row for row in costs if row.device.lower() in names and row.dtype == plan.dtype and not plan.quantization
            and row.weight_bytes / 2 <= size <= row.weight_bytes * 2 and row.batch / 2 <= batch <= row.batch * 2]
    return min(rows, key=lambda row: max(row.batch, batch) / min(row.batch, batch), default=None)


def _bytes_text(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def _table_text(costs: tuple[CompileCost, ...]) -> str:
    """The measured rows, grouped by device, dtype and model size, for a reason."""
    held: dict[tuple[str, str, int], list[str]] = {}
    for row in costs:
        held.setdefault((row.device, row.dtype, row.weight_bytes), []).append(str(row.batch))
    return "; ".join(f"{device} {dtype}, {_bytes_text(size)} of weights, batch {', '.join(batches)}"
                     for (device, dtype, size), batches in held.items())


def compile_pays(plan: RunPlan, tokens: int, batch: int, *, cache_warm: bool | None = None,
                 costs: tuple[CompileCost, ...] | None = None) -> tuple[bool | None, str]:
    """(whether compiling hwrun's step pays for `tokens` new tokens at `batch` prompts, why): it pays where the
    measured saving, tokens x (eager step - compiled step), exceeds the compile's measured cost (the warm-cache
    cost where measured and `cache_warm`; `None`: looked up when needed). None where nothing measured applies."""
    costs = COMPILE_COSTS if costs is None else costs
    row = _cost_row(plan, batch, costs)
    if row is None:
        device = plan.accelerator.names[0] if plan.accelerator.names else plan.accelerator.name
        what = (f"{device}, {plan.dtype}{f', {plan.quantization} weights' if plan.quantization else ''}, "
                f"{_bytes_text(getattr(plan, 'weight_bytes', 0) or 0)} of weights, batch {batch}")
        return None, (f"no measured compile costs for {what} (measured: {_table_text(costs)}): compile stays off "
                      "unless asked (compile=True, --compile)")
    saved = tokens * (1 / row.eager_tps - 1 / row.compiled_tps)
    cost, cache = row.compile_s, "cold cache"
    if row.warm_compile_s is not None:
        if cache_warm is None:
            from hwcompile.cache import persistent_cache_warm

            cache_warm = persistent_cache_warm()
        if cache_warm:
            cost, cache = row.warm_compile_s, "warm cache"
    else:
        cache = "cold cache; no warm-cache compile measured"
    pays = saved > cost
    if saved <= 0:
        gain = f"the compiled step measured slower ({row.compiled_tps:,.0f} vs {row.eager_tps:,.0f} tokens/s)"
    else:
        gain = f"{tokens:,} tokens save ~{saved:.2g} s"
    return pays, (f"{'compiled step' if pays else 'captured eager step'}: {gain} against ~{cost:.0f} s of compile "
                  f"({row.device}, batch {row.batch}: eager step {row.eager_tps:,.0f}, compiled {row.compiled_tps:,.0f} "
                  f"tokens/s, {cache}; {row.source})")
