"""hwrun: plan, load and run Transformers models on Intel GPU (XPU), Intel Gaudi (HPU), CUDA and CPU,
with every decision explained (see README.md).

Importing hwrun imports neither torch nor transformers, and only the errors module: every other public
name is imported from its room on first use (PEP 562), so `import hwrun` and `hwrun --help` stay fast.
"""

from .errors import (
    AdapterFormatError,
    ChatClientError,
    CheckpointError,
    CheckpointWriteError,
    ContinuousBatchingError,
    EngineStartError,
    FastDecodeError,
    GenerateError,
    GrammarBackendError,
    HwrunError,
    ModelIntegrityError,
    ModelSourceError,
    NonFiniteLossError,
    PlanError,
    QLoRAUnsupportedError,
    QuantizationError,
    QuantizedTrainingError,
    RankDivergenceError,
    RequestError,
    ServeConfigError,
    ServeError,
    StructuredOutputError,
    TensorParallelError,
    TrainingConfigError,
    TrainingDataError,
    TrainingDivergedError,
    TrainingError,
)

__version__ = "0.2.0"

#: Public name -> the module it lives in (imported on first use).
_EXPORTS = {
    "BatchingChoice": "inference.batching", "choose_batching": "inference.batching",
    "GenerationResult": "inference.generate", "generate": "inference.generate",
    "pipeline": "inference.pipeline",
    "from_pretrained_kwargs": "model.load", "load": "model.load",
    "RunPlan": "model.plan", "plan": "model.plan",
    "DEFAULT_MODEL": "model.source",
    "train": "training", "training_arguments": "training",
}

__all__ = [
    "AdapterFormatError", "ChatClientError", "CheckpointError", "CheckpointWriteError", "ContinuousBatchingError",
    "EngineStartError", "FastDecodeError", "GenerateError", "GrammarBackendError", "HwrunError",
    "ModelIntegrityError", "ModelSourceError", "NonFiniteLossError", "PlanError", "QLoRAUnsupportedError",
    "QuantizationError", "QuantizedTrainingError", "RankDivergenceError", "RequestError", "ServeConfigError", "ServeError",
    "StructuredOutputError", "TensorParallelError", "TrainingConfigError", "TrainingDataError",
    "TrainingDivergedError", "TrainingError", "BatchingChoice", "DEFAULT_MODEL", "GenerationResult", "RunPlan",
    "choose_batching", "from_pretrained_kwargs", "generate", "load", "pipeline", "plan", "train",
    "training_arguments", "__version__",
]


def __getattr__(name: str):
    """A public name, imported from its room on first use and then kept on the module."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hwrun' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
