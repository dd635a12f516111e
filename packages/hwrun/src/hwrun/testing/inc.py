"""`fake_inc`: a fake Intel Neural Compressor (`neural_compressor.torch.quantization`) that records calls, for
testing hwrun's fp8-inc path on a machine without Gaudi software.

What it models, from neural-compressor-pt 3.10 (the wheel on PyPI, read at these paths):
- `torch/quantization/quantize.py`: `prepare(model, quant_config, inplace=True, example_inputs=None)`,
  `convert(model, quant_config=None, inplace=True, **kwargs)` (converts in place by default, sets
  `model.is_quantized = True` and returns the model), `finalize_calibration(model)`. The real `prepare`/`convert`
  are wrapped by `log_process` (no functools.wraps), so their visible signature is `(*args, **kwargs)`; the drift
  test compares these with the functions inside the real wrappers.
- `common/base_config.py` `BaseConfig.from_json_file(filename)`: `json.load` of the file, then
  `cls.from_dict(**config)`, which builds `FP8Config(**config)`; `torch/quantization/config.py` `FP8Config.__init__`
  (its parameters and defaults, copied below).
Not modelled: any FP8 patching of modules (the fake `convert` leaves every layer as it is, so a converted model
computes what it computed before), INC's measurement files (`finalize_calibration` records only), Gaudi detection.
`packages/hwrun/tests/test_hwrun_quant_inc.py` holds these signatures to the installed neural-compressor-pt's.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: The modules the fake installs into sys.modules (and restores on exit).
MODULES = ("neural_compressor", "neural_compressor.torch", "neural_compressor.torch.quantization")


@dataclass
class IncCalls:
    """What hwrun asked of the fake: ("convert" | "prepare" | "finalize_calibration" | "from_json_file", args)."""

    calls: list[tuple[str, tuple]] = field(default_factory=list)

    def named(self, name: str) -> list[tuple]:
        return [args for called, args in self.calls if called == name]


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # so importlib.util.find_spec answers
    module.HWRUN_FAKE = True
    return module


def _build(record: IncCalls) -> types.ModuleType:
    class FP8Config:
        """The fake of INC's FP8Config: keeps every parameter as an attribute (real parameters and defaults)."""

        name = "fp8_quant"

        def __init__(self, dump_stats_path: str = "./hqt_output/measure", fp8_config: str = "E4M3",
                     hp_dtype: str = "bf16", blocklist: dict = {"names": [], "types": ()},  # noqa: B006 - INC's
                     allowlist: dict = {"names": [], "types": ["Linear", "Conv2d", "EmbeddingBag"]},  # noqa: B006
                     mode: str = "AUTO", scale_method: str | dict = "maxabs_hw", scale_params: dict = {},  # noqa: B006
                     observer: str = "maxabs", mod_dict: dict = {}, measure_exclude: str = "OUTPUT",  # noqa: B006
                     fake_quant: bool = False, use_qdq: bool = False, scale_format: str = "scalar",
                     measure_on_hpu: bool = True, **kwargs):
            self.dump_stats_path, self.fp8_config, self.hp_dtype = dump_stats_path, fp8_config, hp_dtype
            self.blocklist, self.allowlist, self.mode, self.scale_method = blocklist, allowlist, mode, scale_method
            self.scale_params, self.observer, self.mod_dict = scale_params, observer, mod_dict
            self.measure_exclude, self.fake_quant, self.use_qdq = measure_exclude, fake_quant, use_qdq
            self.scale_format, self.measure_on_hpu, self.kwargs = scale_format, measure_on_hpu, kwargs

        @classmethod
        def from_json_file(cls, filename):
            record.calls.append(("from_json_file", (filename,)))
            with open(filename, encoding="utf-8") as file:
                return cls(**json.load(file))

    def prepare(model: Any, quant_config: Any, inplace: bool = True, example_inputs: Any = None):
        record.calls.append(("prepare", (model, quant_config)))
        model.is_prepared = True
        return model

    def convert(model: Any, quant_config: Any = None, inplace: bool = True, **kwargs):
        record.calls.append(("convert", (model, quant_config)))
        model.is_quantized = True  # as INC 3.10's convert does
        return model

    def finalize_calibration(model):
        record.calls.append(("finalize_calibration", (model,)))

    quantization = _module("neural_compressor.torch.quantization")
    quantization.FP8Config, quantization.prepare, quantization.convert = FP8Config, prepare, convert
    quantization.finalize_calibration = finalize_calibration
    return quantization


@contextlib.contextmanager
def fake_inc() -> Iterator[IncCalls]:
    """Install the fake `neural_compressor.torch.quantization` (and its parents) into sys.modules; yields the record
    of calls. Whatever was there (the real INC, or nothing) is put back on exit."""
    record = IncCalls()
    saved = {name: sys.modules.get(name) for name in MODULES}
    root, torch_pkg = _module("neural_compressor"), _module("neural_compressor.torch")
    quantization = _build(record)
    root.__path__, torch_pkg.__path__ = [], []  # packages, so `import neural_compressor.torch.quantization` resolves
    root.torch, torch_pkg.quantization = torch_pkg, quantization
    sys.modules.update(zip(MODULES, (root, torch_pkg, quantization), strict=True))
    try:
        yield record
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
