"""The loss-curve PNG written beside the checkpoints at the end of a run (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def loss_points(log_history: Sequence[dict]) -> list[tuple[int, float]]:
    """(step, loss) pairs from a Trainer `log_history` (training losses only, one per step)."""
    points: dict[int, float] = {}
    for entry in log_history:
        if "loss" in entry and "step" in entry:
            points[int(entry["step"])] = float(entry["loss"])
    return sorted(points.items())


def eval_points(log_history: Sequence[dict]) -> list[tuple[int, float]]:
    """(step, eval loss) pairs from a Trainer `log_history` (evaluations on the held-out split)."""
    points: dict[int, float] = {}
    for entry in log_history:
        if "eval_loss" in entry and "step" in entry:
            points[int(entry["step"])] = float(entry["eval_loss"])
    return sorted(points.items())


def write_loss_plot(points: Sequence[tuple[int, float]], path: str | Path, *, title: str = "",
                    eval_points: Sequence[tuple[int, float]] = ()) -> Path:
    """Plot training loss (and eval loss, when given) against step into `path` (PNG) and return the path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=110)
    if points:
        steps = [p[0] for p in points]
        losses = [p[1] for p in points]
        axes.plot(steps, losses, marker="." if len(points) < 60 else None, linewidth=1.2, label="training loss")
    if eval_points:
        axes.plot([p[0] for p in eval_points], [p[1] for p in eval_points], marker="o", linewidth=1.2,
                  label="eval loss (held-out split)")
        axes.legend()
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_title(title or "hwrun train: loss")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
