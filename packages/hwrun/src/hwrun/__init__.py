"""hwrun: plan, load and run Transformers models on Intel GPU (XPU), Intel Gaudi (HPU), CUDA and CPU,
with every decision explained (see README.md).

Importing hwrun imports neither torch nor transformers; `train` and `training_arguments` come from
the training half (`hwrun.training`) on first use.
"""

from .errors import (
    CheckpointError,
    ContinuousBatchingError,
    FastDecodeError,
    GenerateError,
    HwrunError,
    ModelSourceError,
    PlanError,
    QLoRAUnsupportedError,
    QuantizationError,
    TrainingConfigError,
    TrainingDataError,
    TrainingError,
)
from .inference.batching import BatchingChoice, choose_batching
from .inference.generate import GenerationResult, generate
from .inference.pipeline import pipeline
from .model.load import from_pretrained_kwargs, load
from .model.plan import RunPlan, plan
from .model.source import DEFAULT_MODEL

__version__ = "0.2.0"

_TRAINING = ("train", "training_arguments")

__all__ = [
    "BatchingChoice", "CheckpointError", "ContinuousBatchingError", "DEFAULT_MODEL", "FastDecodeError", "GenerateError", "GenerationResult", "HwrunError",
    "ModelSourceError", "PlanError", "QLoRAUnsupportedError", "QuantizationError",
    "TrainingConfigError", "TrainingDataError", "TrainingError", "RunPlan", "choose_batching", "from_pretrained_kwargs",
    "generate", "load", "pipeline", "plan", "train", "training_arguments", "__version__",
]


def __getattr__(name: str):
    """`hwrun.train` / `hwrun.training_arguments`, imported lazily from `hwrun.training`."""
    if name in _TRAINING:
        from . import training

        return getattr(training, name)
    raise AttributeError(f"module 'hwrun' has no attribute {name!r}")
