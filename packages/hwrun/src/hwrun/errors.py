"""Every error hwrun raises: one base, `HwrunError`, and a subclass per kind of bad input.

Each also subclasses the builtin Transformers raises for the same input (ValueError, OSError,
RuntimeError), so `except ValueError` code keeps working.
"""

from __future__ import annotations


class HwrunError(Exception):
    """Base of every hwrun error."""


class PlanError(HwrunError, ValueError):
    """A `plan()` argument is invalid for this device or this model (bad device, dtype, attention...)."""


class QuantizationError(PlanError):
    """The requested quantization is unknown, or bitsandbytes cannot run it on the chosen device."""


class ModelSourceError(HwrunError, OSError):
    """The model cannot be found or read: missing path, no safetensors, Hub not reachable."""


class ModelIntegrityError(ModelSourceError):
    """A model file is damaged: it differs from the checksums `hwrun train` recorded when it wrote it
    (`hwrun_output.json`), or its safetensors header is not whole (any model). Raised before it loads."""


class GenerateError(HwrunError, ValueError):
    """A `generate()` argument is invalid: no prompts, empty prompt, max_new_tokens <= 0, ..."""


class StructuredOutputError(GenerateError):
    """A structured-output request cannot be constrained: its JSON schema uses a keyword the grammar engine does not
    enforce, or does not compile (the message names the schema problem); raised when the request is admitted."""


class GrammarBackendError(HwrunError, ImportError):
    """No grammar engine for structured output is installed, or the one asked for is not
    (`pip install 'hwrun[structured]'` installs xgrammar and llguidance)."""


class ContinuousBatchingError(GenerateError):
    """Transformers' continuous batching (`generate_batch`) failed for this model; `batching='auto'`
    falls back to static batching, an explicit `batching='continuous'` raises it."""


class FastDecodeError(HwrunError, RuntimeError):
    """The graph decode path cannot run this model or input (see `hwrun.inference.decode.static`)."""


class TrainingError(HwrunError):
    """Base of every error raised by `hwrun.training`."""


class TrainingDataError(TrainingError, ValueError):
    """The training data cannot be read: missing, empty, not UTF-8, or a JSONL line without `text`."""


class TrainingConfigError(TrainingError, ValueError):
    """A training option is invalid for this plan or device (e.g. bf16 where it is unsupported)."""


class QLoRAUnsupportedError(TrainingError, ValueError):
    """4-bit QLoRA was asked for on a device that bitsandbytes does not support."""


class QuantizedTrainingError(TrainingConfigError):
    """Training was asked on a base quantized with a method hwrun does not train through (full fine-tuning, or LoRA
    where PEFT's layer or torch's autograd cannot): refused before the model loads, naming what to use instead."""


class CheckpointError(TrainingError, RuntimeError):
    """A checkpoint could not be written or no usable checkpoint exists to resume from."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint or the final model could not be written (the disk is full, read-only, an I/O error): the partial
    save was removed and the last complete checkpoint is untouched, so `--resume` continues from it once the cause
    is fixed. Also an OSError, as the write's own error was."""


class NonFiniteLossError(TrainingError, FloatingPointError):
    """Training met a non-finite loss or non-finite weights (NaN or inf) and stopped (`on_nonfinite="stop"`):
    nothing was saved after it, so the last good checkpoint and any earlier final model stay as they were."""


class TrainingDivergedError(NonFiniteLossError):
    """Training diverged with finite values (`on_nonfinite="stop"` or "skip"): a loss worse than guessing or far above
    its start, an exploding gradient norm, or weights grown far beyond their start (hwrun.training.guard's rules).
    Nothing was saved after it, as for a non-finite value."""


class AdapterFormatError(TrainingConfigError):
    """An adapter folder holds its weights only as a pickle file (`adapter_model.bin`) and the caller did not
    opt in with `allow_pickle=True`; hwrun loads safetensors only."""


class ServeError(HwrunError):
    """Base of every error raised by `hwrun serve` and `hwrun chat` (`hwrun.serve`)."""


class ServeConfigError(ServeError, ValueError):
    """A `hwrun serve` / `hwrun chat` option is invalid (port, concurrency, API key variable, ...); raised before
    the model loads."""


class EngineStartError(ServeError, RuntimeError):
    """No serving engine can run this model here, or the one asked for cannot (the message says why for each)."""


class RequestError(ServeError, ValueError):
    """An HTTP request to `hwrun serve` is invalid; carries the OpenAI error fields (`status`, `type`, `param`,
    `code`) the server answers with."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400,
                 error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, error_type


class ChatClientError(ServeError, OSError):
    """`hwrun chat` cannot reach the server, or the server answered with an error (`status` and OpenAI `code` then
    set)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


__all__ = [
    "AdapterFormatError", "CheckpointError", "CheckpointWriteError", "ContinuousBatchingError", "FastDecodeError", "GenerateError", "HwrunError",
    "ModelIntegrityError", "ModelSourceError",
    "NonFiniteLossError", "PlanError", "TrainingDivergedError", "QLoRAUnsupportedError", "QuantizationError", "TrainingConfigError", "TrainingDataError",
    "TrainingError", "ServeError", "StructuredOutputError", "GrammarBackendError", "ServeConfigError", "EngineStartError", "RequestError", "ChatClientError",
]


class TensorParallelError(PlanError):
    """Tensor parallelism (`tp=N`, `--tp N`) cannot run this model here: N is not a process count these devices take,
    the model class has no tensor-parallel plan, N does not divide its attention or KV heads, or an option does not
    combine with it. Raised by `plan()`, before any process starts."""


class RankDivergenceError(HwrunError, RuntimeError):
    """Two tensor-parallel ranks produced different tokens for the same step: every rank must run the same decode
    (greedy or seeded), so their sharded caches would no longer agree."""


__all__ += ["TensorParallelError", "RankDivergenceError", "QuantizedTrainingError"]
