"""`fake_gaudi` and `fake_hl_smi`: a fake `habana_frameworks` / `torch.hpu` and a fake `hl-smi` on PATH.

What the Gaudi fake models, and from which source (gaudi-pytorch-bridge 1.19.0, the newest public
source, `python_packages/habana_frameworks/torch/...`; INTEL.md S8). Names and signatures are
checked against `tests/data/gaudi_bridge_1.19_manifest.json` by `tests/test_hwenv_gaudi_fake_drift.py`.
- `hpu/__init__.py`: `is_available()`, `device_count()`, `get_device_name(device=None)` (the
  same name for every index; `AssertionError("Invalid device id")` out of range),
  `is_bf16_supported()` (no parameter; `is_available()`), `synchronize()` (no parameter),
  `current_device()`, `init()`, `is_initialized()`, `get_device_properties(device=None)`
  returning a *string* `"(sramBaseAddress=..., dramSize=..., ...)"` (`device.cpp`), and
  `set_device(device)` with the bridge's rule: `HLS_MODULE_ID` wins; with neither it nor
  `HABANA_VISIBLE_MODULES` set and fewer than 8 devices only index 0 is allowed (nothing is
  pinned); otherwise it sets `HLS_MODULE_ID` to the index's module.
- `hpu/memory.py`: `memory_stats()` (`Limit`, `InUse`, `MaxInUse`, ...), `mem_get_info(device=None)`
  = `(Limit - InUse, Limit)`, `memory_allocated`, `max_memory_allocated`, `reset_peak_memory_stats`.
- `hpu/streams.py`, `hpu/events.py`: `Stream(device=None, priority=0, **kwargs)` with `wait_stream(stream)`,
  `current_stream(device=None)` (one cached stream per process), `stream(stream)` (a context that makes
  it current), `Event(enable_timing=False)`.
- `hpu/graphs.py`: `HPUGraph` (`capture_begin(dry_run=False)`, `capture_end()`, `replay(asynchronous=False)`,
  `reset()`) records the aten ops run between capture_begin and capture_end and replays them on the
  same tensors (`hwenv.testing.graphs.OpTape`: a graph's semantics on host tensors; a host read
  during capture raises). `graph(hpu_graph, stream=None, dry_run=False)` is the bridge's context
  statement for statement: `synchronize()`, `gc.collect()`, enter `stream(capture_stream)` (its own
  default capture stream when none is given), `is_capture = True`, `capture_begin(dry_run)`; on exit
  `capture_end()` and back. The bridge records HPU graphs in its lazy execution context
  (`backend/habana_device/HPUGraph.cpp` `HPUGraph::capture_begin`) and exports them from
  `habana_frameworks.torch.hpu` only in lazy mode, so the fake's `capture_begin` raises in eager mode
  (inferred from the source; not observed on a Gaudi). Every graph call is appended to the yielded
  namespace's `graph_events`. `wrap_in_hpu_graph(module, ...)` (replaces `forward` with a wrapper
  that calls it, adds `clear_cache`/`clear_inputs`; no graph is captured). Re-exported into
  `habana_frameworks.torch.hpu` only in lazy mode, as `hpu/__init__.py` does.
- `utils/internal.py` `is_lazy()`: fixed when the fake is entered ("imported"), as the bridge
  reads `PT_HPU_LAZY_MODE` once; unset follows the plugin version (`hwenv.gaudi.execution_mode`:
  lazy up to 1.20, eager from 1.21.0). A later change of the variable does not switch it.
- `distributed/hccl/__init__.py`: importing `habana_frameworks.torch` runs
  `initialize_distributed_hpu()`, whose `_setup_module_id` pins `HLS_MODULE_ID` from
  `LOCAL_RANK`/`WORLD_SIZE` (and `HABANA_VISIBLE_MODULES`); the fake runs it on entry.
- `core/__init__.py`: `mark_step(device_str="", sync=False)`; `torch._register_device_module("hpu", ...)`
  (so `torch.hpu` and `sys.modules["torch.hpu"]`).
Not modelled: allocation on the device, HCCL collectives, the C++ `_hpu_C` module, Dynamo's
`hpu_backend` (hwcompile's tests register a stand-in).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..gaudi import MODULE_ID_VARIABLE, MODULES_VARIABLE, execution_mode
from .common import (
    DEVICE_VARIABLES,
    GiB,
    _package,
    _Patches,
    clear_library_caches,
    override_versions,
)
from .graphs import OpTape

#: Canned `hl-smi -Q index,module_id -f csv` output for an 8-Gaudi server, in the format of
#: Intel's multi-tenant guide (header `index, module_id`, a space after the comma, rows not
#: sorted by index). The mapping itself is made up for tests.
HL_SMI_CSV_8 = """index, module_id
3, 6
1, 4
2, 7
0, 5
7, 2
5, 0
6, 3
4, 1
"""

#: Gaudi variables the fake clears on entry besides `DEVICE_VARIABLES` (tests start unpinned).
GAUDI_VARIABLES = (MODULE_ID_VARIABLE,)

def write_fake_hl_smi(directory: str | os.PathLike, csv: str = HL_SMI_CSV_8, *, exit_code: int = 0) -> Path:
    """Write an executable `hl-smi` into `directory` that prints `csv` for `-Q index,module_id -f csv`."""
    path = Path(directory) / "hl-smi"
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"expected = ['-Q', 'index,module_id', '-f', 'csv']\n"
        "if sys.argv[1:] != expected:\n"
        "    print('fake hl-smi: unexpected arguments', sys.argv[1:], file=sys.stderr); sys.exit(64)\n"
        f"sys.stdout.write({csv!r})\n"
        f"sys.exit({exit_code})\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@contextlib.contextmanager
def fake_hl_smi(csv: str = HL_SMI_CSV_8, *, exit_code: int = 0) -> Iterator[Path]:
    """Put a fake `hl-smi` first on PATH for the duration."""
    patches = _Patches()
    with tempfile.TemporaryDirectory(prefix="fake-hl-smi-") as directory:
        path = write_fake_hl_smi(directory, csv, exit_code=exit_code)
        try:
            patches.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
            yield path
        finally:
            patches.undo()


def _torch_globals_transformers_patches(torch: Any) -> list[tuple[Any, str]]:
    """The torch attributes transformers replaces on Gaudi (utils/import_utils.py, is_torch_hpu_available)."""
    return [(torch, "gather"), (torch.Tensor, "gather"), (torch, "take_along_dim"), (torch.linalg, "cholesky"),
            (torch, "scatter"), (torch.Tensor, "scatter"), (torch, "compile")]


# ---- the bridge's Python layer, as the fake runs it ------------------------------------------

_SYN_DEVICE_TYPE = {"GAUDI": 1, "GAUDI2": 3, "GAUDI3": 5}  # illustrative synDeviceType numbers for the string


def _available_modules() -> list[int]:
    """`hpu/_utils.py` `_get_available_modules_from_environ`: HABANA_VISIBLE_MODULES, default 0..7."""
    text = os.getenv(MODULES_VARIABLE, default="0,1,2,3,4,5,6,7")
    modules = [int(item) for item in text.split(",")] if text else []
    return modules or [0, 1, 2, 3, 4, 5, 6, 7]


def _module_id_from_environ() -> int:
    """`hpu/_utils.py` `_get_module_id_from_environ`: HLS_MODULE_ID, -1 when unset or empty."""
    value = os.getenv(MODULE_ID_VARIABLE, -1)
    return int(value) if value else -1


def _setup_module_id(local_rank: int = -1, world_size: int = 1) -> None:
    """`distributed/hccl/__init__.py` `_setup_module_id` (emulation mode not modelled)."""
    if MODULE_ID_VARIABLE in os.environ:
        return
    if local_rank == -1 or world_size == 1:
        return
    if MODULES_VARIABLE in os.environ:
        visible = os.environ[MODULES_VARIABLE].split(",")
        assert local_rank < len(visible), f"There is not enough devices available for training ({MODULES_VARIABLE})."
        os.environ[MODULE_ID_VARIABLE] = visible[local_rank]
        return
    os.environ[MODULE_ID_VARIABLE] = str(local_rank)


def _device_functions(count: int, name: str, memory: int) -> dict[str, Any]:
    """`habana_frameworks.torch.hpu`'s device and memory functions with the bridge's signatures and rules."""
    import torch

    state = {"current": 0, "initialized": False, "in_use": 0, "max_in_use": 0}

    def _get_device_index(device: Any, optional: bool = False) -> int:
        # hpu/_utils.py: ints as given, "hpu:1"/torch.device -> index, None/"hpu" -> current_device()
        if isinstance(device, str):
            device = torch.device(device)
        index = None
        if isinstance(device, torch.device):
            if device.type != "hpu":
                raise ValueError(f"Expected a hpu device, but got: {device}")
            index = device.index
        if isinstance(device, int):
            index = device
        if index is None:
            if optional:
                index = current_device()
            else:
                raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        return index

    def _checked(device: Any) -> int:
        init()
        index = _get_device_index(device, optional=True)
        if index < 0 or index >= device_count():
            raise AssertionError("Invalid device id")
        return index

    def init() -> None:
        state["initialized"] = True

    def is_initialized() -> bool:
        return state["initialized"]

    def is_available() -> bool:
        return count > 0

    def device_count():
        return count

    def get_device_name(device=None) -> str:
        if not is_available():
            return ""
        _checked(device)
        return name  # the bridge ignores the index: one device per process

    def current_device() -> int:
        init()
        return state["current"]

    def synchronize() -> None:
        init()

    def is_bf16_supported():
        return bool(is_available())

    def get_device_properties(device=None) -> str:
        if not is_available():
            return ""
        index = _checked(device)
        return (f"(sramBaseAddress=1153202979533225984, dramBaseAddress=1153203082662772736, sramSize=0, "
                f"dramSize={memory}, tpcEnabledMask=18446744073709551615, dramEnabled=1, fd=21, "
                f"device_id={index}, device_type={_SYN_DEVICE_TYPE.get(name, 0)})")

    def set_device(device) -> None:
        # hpu/__init__.py set_device, statement for statement
        device_idx = _get_device_index(device, optional=True)
        available_modules = _available_modules()
        if device_idx not in available_modules and device_idx > len(available_modules):
            raise AssertionError(
                f"Trying to open device with idx={device_idx} when only {available_modules} are avaliable)")
        current_module_id = _module_id_from_environ()
        if current_module_id >= 0:
            for index in range(device_count()):
                if available_modules[index] == current_module_id:
                    device_idx = index
                    break
            assert available_modules[device_idx] == current_module_id, (
                f"Requested module_id={available_modules[device_idx]} is different from "
                f"current_module_id={current_module_id} which was previously set.")
        if current_module_id == -1 and MODULES_VARIABLE not in os.environ and device_count() < 8:
            assert device_idx == 0, f"As {MODULES_VARIABLE} is not provided, the only supported device idx is 0."
        else:
            os.environ[MODULE_ID_VARIABLE] = str(available_modules[device_idx])
        state["current"] = device_idx

    def memory_stats(device=None) -> dict[str, Any]:
        _checked(device)
        return {"Limit": memory, "InUse": state["in_use"], "MaxInUse": state["max_in_use"], "NumAllocs": 0,
                "NumFrees": 0, "ActiveAllocs": 0, "MaxAllocSize": 0, "TotalSystemAllocs": 0,
                "TotalSystemFrees": 0, "TotalActiveAllocs": 0}

    def mem_get_info(device=None) -> tuple:
        stats = memory_stats(device)
        return (stats["Limit"] - stats["InUse"], stats["Limit"])

    def memory_allocated(device=None) -> int:
        return memory_stats(device=_checked(device)).get("InUse")

    def max_memory_allocated(device=None) -> int:
        return memory_stats(device=_checked(device)).get("MaxInUse")

    def reset_peak_memory_stats(device=None) -> None:
        _checked(device)
        state["max_in_use"] = state["in_use"]

    return {f.__name__: f for f in (
        init, is_initialized, is_available, device_count, get_device_name, current_device, synchronize,
        is_bf16_supported, get_device_properties, set_device, memory_stats, mem_get_info, memory_allocated,
        max_memory_allocated, reset_peak_memory_stats)}


class Stream:
    """`hpu/streams.py` `Stream(device=None, priority=0, **kwargs)` (one device per process; no work queued)."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device, self.priority = device, priority
        self.is_capture = False

    def wait_stream(self, stream):
        """`Stream.wait_stream`: later work on this stream waits for `stream`'s (nothing is queued here)."""
        _GRAPH_STATE["events"].append("wait_stream")


#: The fake's graph and stream state, reset on each `fake_gaudi` entry: the current stream, whether the
#: bridge runs lazy (HPU graphs capture only then), and the log of graph calls (`graph_events`).
_GRAPH_STATE: dict[str, Any] = {"events": [], "lazy": True, "current": None}


class _StreamContext:
    """`hpu/streams.py` `StreamContext`: makes `stream` current inside the `with` (None: no-op)."""

    def __init__(self, stream):
        self.stream, self.previous = stream, None

    def __enter__(self):
        if self.stream is not None:
            self.previous = current_stream()
            _GRAPH_STATE["current"] = self.stream
            _GRAPH_STATE["events"].append("use_stream")

    def __exit__(self, exc_type, exc_value, traceback):
        if self.stream is not None:
            _GRAPH_STATE["current"] = self.previous


def current_stream(device=None):
    """`hpu/streams.py` `current_stream(device=None)`: the current stream (cached, as in lazy mode)."""
    if _GRAPH_STATE["current"] is None:
        _GRAPH_STATE["current"] = Stream()
    return _GRAPH_STATE["current"]


def stream(stream):
    """`hpu/streams.py` `stream(stream)`: a context that makes `stream` the current stream."""
    return _StreamContext(stream)


def default_stream(device=None):
    """`hpu/streams.py` `default_stream(device=None)`: the device's default stream (one per process)."""
    if _GRAPH_STATE.get("default") is None:
        _GRAPH_STATE["default"] = Stream(device)
        _GRAPH_STATE["default"].is_default_stream = True
    return _GRAPH_STATE["default"]


# ---- hpu/random.py: one default generator, device 0 only (the bridge's rules) -----------------------------

_RANDOM_STATE: dict[str, Any] = {"generator": None}


def _generator():
    import torch

    if _RANDOM_STATE["generator"] is None:  # stands in for htcore._get_default_generator() (a device generator)
        _RANDOM_STATE["generator"] = torch.Generator()
    return _RANDOM_STATE["generator"]


def _device_zero(device, what):
    index = device if isinstance(device, int) else getattr(__import__("torch").device(device), "index", None)
    if (index or 0) != 0:
        raise RuntimeError(f"hpu {what} supports only device 0")


def get_rng_state(device="hpu"):
    """`hpu/random.py` `get_rng_state(device="hpu")`: only device 0."""
    _device_zero(device, "get_rng_state")
    return _generator().get_state()


def set_rng_state(new_state, device="hpu"):
    """`hpu/random.py` `set_rng_state(new_state, device="hpu")`: only device 0."""
    _device_zero(device, "set_rng_state")
    _generator().set_state(new_state)


def manual_seed(seed):
    """`hpu/random.py` `manual_seed(seed)`: seeds the default generator and returns it."""
    return _generator().manual_seed(int(seed))


def seed():
    """`hpu/random.py` `seed()`."""
    return _generator().seed()


def initial_seed():
    """`hpu/random.py` `initial_seed()`."""
    return _generator().initial_seed()


def get_rng_state_all():
    """`hpu/random.py` `get_rng_state_all()`: a list of one state (one device per process)."""
    return [get_rng_state(0)]


def set_rng_state_all(new_states):
    """`hpu/random.py` `set_rng_state_all(new_states)`: exactly one state."""
    if len(new_states) != 1:
        raise RuntimeError("hpu set_rng_state_all supports only states len of 1")
    for state in new_states:
        set_rng_state(state, 0)


def manual_seed_all(seed):
    """`hpu/random.py` `manual_seed_all(seed)`: the same as `manual_seed` (one device per process)."""
    manual_seed(seed)


def seed_all():
    """`hpu/random.py` `seed_all()`."""
    _generator().seed()
    _generator().initial_seed()


#: `hpu/random.py` `__all__`, star-imported into `habana_frameworks.torch.hpu`.
RANDOM_NAMES = ("get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
                "manual_seed_all", "seed", "seed_all", "initial_seed")


class Event:
    """`hpu/events.py` `Event(enable_timing=False)`."""

    def __init__(self, enable_timing=False):
        self.enable_timing = enable_timing


class HPUGraph:
    """`hpu/graphs.py` `HPUGraph`: records the ops run during capture and replays them (`OpTape`)."""

    def __init__(self):
        self.captured = False
        self.tape = OpTape("fake HPUGraph")

    def capture_begin(self, dry_run=False):
        _GRAPH_STATE["events"].append("capture_begin")
        if not _GRAPH_STATE["lazy"]:
            raise RuntimeError("fake HPUGraph: HPU graphs are recorded by the bridge's lazy execution context "
                               "(HPUGraph.cpp capture_begin); this process runs eager (PT_HPU_LAZY_MODE=0)")
        self.captured = False
        self.tape.begin()

    def capture_end(self):
        _GRAPH_STATE["events"].append("capture_end")
        self.tape.end()
        self.captured = True

    def replay(self, asynchronous=False):
        _GRAPH_STATE["events"].append("replay")
        if not self.captured:
            raise RuntimeError("fake HPUGraph: replay() before capture_end()")
        self.tape.replay()

    def reset(self):
        self.captured = False
        self.tape = OpTape("fake HPUGraph")


class graph:  # noqa: N801 - the bridge's name
    """`hpu/graphs.py` `graph(hpu_graph, stream=None, dry_run=False)`: the bridge's capture context."""

    default_capture_stream = None

    def __init__(self, hpu_graph, stream=None, dry_run=False):
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = Stream()
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = _StreamContext(self.capture_stream)
        self.hpu_graph, self.dry_run = hpu_graph, dry_run

    def __enter__(self):
        import gc

        import habana_frameworks.torch as htorch  # the fake's, as the bridge imports its own

        htorch.hpu.synchronize()
        gc.collect()
        self.stream_ctx.__enter__()
        self.capture_stream.is_capture = True
        self.hpu_graph.capture_begin(self.dry_run)

    def __exit__(self, exc_type, exc_value, traceback):
        self.hpu_graph.capture_end()
        self.capture_stream.is_capture = False
        self.stream_ctx.__exit__(exc_type, exc_value, traceback)


def _input_key(obj):
    """`hpu/graphs.py` `input_hash`: the structure, each tensor's shape (and here dtype and strides), other values."""
    import torch

    if isinstance(obj, dict):
        return ("dict", tuple((key, _input_key(value)) for key, value in obj.items()))
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return ("seq", tuple(_input_key(item) for item in obj))
    if torch.is_tensor(obj):
        return ("tensor", tuple(obj.shape), obj.dtype, obj.stride())
    return ("value", obj)


def _copy_to(dst, src):
    """`hpu/graphs.py` `copy_to`: copy the new inputs into the tensors the graph captured."""
    import torch

    if isinstance(dst, dict):
        for (_, dv), (_, sv) in zip(dst.items(), src.items(), strict=True):
            _copy_to(dv, sv)
    elif isinstance(dst, (list, tuple)) and not isinstance(dst, torch.Size):
        for d, v in zip(dst, src, strict=True):
            _copy_to(d, v)
    elif torch.is_tensor(dst):
        dst.copy_(src)


def _graphed_forward(cache, capture_stream, orig_fwd, args, kwargs, max_graphs):
    """`hpu/graphs.py` `wrapped_hpugraph_forward` (tensor cache on, no dry run): capture on the first call per
    input key, then copy the inputs into the captured ones and replay; `bypass_hpu_graphs=True` calls through,
    `warmup_mode=True` returns the cached outputs without a replay, a full cache (`max_graphs`) calls through."""
    warmup_mode = kwargs.pop("warmup_mode", False)
    if kwargs.pop("bypass_hpu_graphs", False):
        return orig_fwd(*args, **kwargs)
    inputs = (args, kwargs)
    key = _input_key(inputs)
    cached = cache.get(key)
    if cached is None:
        if max_graphs is not None and len(cache) == max_graphs:
            return orig_fwd(*args, **kwargs)
        with stream(capture_stream):
            hpu_graph = HPUGraph()
            hpu_graph.capture_begin(dry_run=False)
            outputs = orig_fwd(*args, **kwargs)
            hpu_graph.capture_end()
        cache[key] = (inputs, outputs, hpu_graph)
        return outputs
    captured_inputs, outputs, hpu_graph = cached
    if warmup_mode:
        return outputs
    _copy_to(captured_inputs, inputs)
    hpu_graph.replay()
    return outputs


def wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False, max_graphs=None):
    """`hpu/graphs.py` `wrap_in_hpu_graph`: `module.forward` captures one HPU graph per input shape and replays it
    (the fake's `HPUGraph`, `OpTape`); adds `clear_cache()` and `clear_inputs()`. Returns the module."""
    capture_stream = default_stream()
    cache: dict = {}
    orig_fwd = module.forward

    def forward(*args, **kwargs):
        return _graphed_forward(cache, capture_stream, orig_fwd, args, kwargs, max_graphs)

    module.forward = forward
    module.clear_cache = cache.clear
    module.clear_inputs = lambda: None  # tensor cache on: nothing to drop
    module.hpu_graph_cache = cache  # the fake's own: what was captured, for tests
    return module


def make_graphed_callables(callables, sample_args, warmups=0, allow_unused_input=False, asynchronous=False,
                           disable_tensor_cache=False, dry_run=False):
    """`hpu/graphs.py` `make_graphed_callables`: the bridge's argument checks and warm-ups; each callable is
    returned as a function that captures its forward on the first call per input shape and replays it after
    (`wrap_in_hpu_graph`'s cache). The bridge also captures the backward pass into a second graph; the fake
    runs backward through autograd on the captured forward's first run, so use the result for inference."""
    import torch

    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    for function, args in zip(callables, sample_args, strict=True):
        if isinstance(function, torch.nn.Module):
            assert not (function._backward_hooks or function._forward_hooks or function._forward_pre_hooks), (
                "Modules must not have hooks registered at the time they are passed.")
        assert all(isinstance(arg, torch.Tensor) for arg in args), (
            "In the beta API, sample_args for each callable must be a tuple of Tensors.")
    for function, args in zip(callables, sample_args, strict=True):
        for _ in range(warmups):
            function(*args)
    graphed = []
    for function in callables:
        cache: dict = {}
        capture_stream = default_stream()

        def run(*args, _function=function, _cache=cache, _stream=capture_stream, **kwargs):
            return _graphed_forward(_cache, _stream, _function, args, kwargs, None)

        graphed.append(run)
    return graphed[0] if just_one else tuple(graphed)


class ModuleCacher:
    """`hpu/graphs.py` `ModuleCacher(max_graphs=10)`: `ModuleCacher(n)(model, ...)` replaces `model.forward`; the
    bridge caches a graphed copy per input while training with gradients in lazy mode. The fake keeps the bridge's
    signatures and counts what the bridge counts (`cached_hits_dict`, `uncached_train_hits`, `uncached_eval_hits`),
    capturing through `wrap_in_hpu_graph`'s cache for forward only."""

    def __init__(self, max_graphs=10):
        self.max_graphs = max_graphs
        self.cached_hits_dict: dict = {}
        self.uncached_train_hits = 0
        self.uncached_eval_hits = 0
        self.model = None

    def __call__(self, model, use_lfu=False, inplace=True, allow_unused_input=False, asynchronous=False,
                 have_grad_accumulation=False, log_frequency=100, verbose=False, disable_tensor_cache=False,
                 dry_run=False):
        import copy

        import torch

        if not inplace:
            model = copy.copy(model)
        self.model = model
        model.orig_forward = model.forward
        cache: dict = {}
        capture_stream = default_stream()

        def forward(*args, **kwargs):
            use_cache = model.training and torch.is_grad_enabled() and _GRAPH_STATE["lazy"]
            key = _input_key((args, kwargs))
            if use_cache and (key in cache or len(cache) < self.max_graphs):
                self.cached_hits_dict[key] = self.cached_hits_dict.get(key, 0) + (key in cache)
                return _graphed_forward(cache, capture_stream, model.orig_forward, args, kwargs, self.max_graphs)
            if model.training:
                self.uncached_train_hits += 1
            else:
                self.uncached_eval_hits += 1
            return model.orig_forward(*args, **kwargs)

        model.forward = forward
        return model


def mark_step(device_str="", sync=False):
    """`core/step_closure.py` `mark_step`: in lazy mode it flushes the accumulated graph; here a no-op."""
    return None


def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    """`distributed/hccl/__init__.py` `initialize_distributed_hpu` (MPI variables not modelled)."""
    if all(value is not None for value in (world_size, rank, local_rank)):
        os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"] = str(world_size), str(rank), str(local_rank)
    world_size = int(os.getenv("WORLD_SIZE", 1))
    rank = int(os.getenv("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    _setup_module_id(local_rank=local_rank, world_size=world_size)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


#: Graph names `hpu/__init__.py` re-exports into `habana_frameworks.torch.hpu` in lazy mode only.
LAZY_ONLY_HPU_NAMES = ("HPUGraph", "graph", "wrap_in_hpu_graph", "make_graphed_callables", "ModuleCacher")


@contextlib.contextmanager
def fake_gaudi(count: int = 8, *, name: str = "GAUDI2", memory: int = 96 * GiB, plugin_version: str = "1.22.0",
               accelerate_version: str | None = None, hl_smi: str | None = HL_SMI_CSV_8,
               lazy_mode: str | None = None, hls_module_id: str | None = None,
               visible_modules: str | None = None) -> Iterator[types.SimpleNamespace]:
    """Install a fake `habana_frameworks` (`.torch`, `.torch.core`, `.torch.hpu`, `.torch.hpu.graphs`,
    `.torch.utils.internal`, `.torch.distributed.hccl`) and `torch.hpu`, as the real plugin registers
    them, plus a fake `hl-smi` on PATH. `lazy_mode` sets `PT_HPU_LAZY_MODE` before the fake
    "imports" (None: unset, so `plugin_version` decides); `hls_module_id` sets `HLS_MODULE_ID`
    (None: unset; `LOCAL_RANK`/`WORLD_SIZE` in the environment may then pin one, as the bridge does);
    `visible_modules` sets `HABANA_VISIBLE_MODULES` before that (the fake clears selection variables).
    `accelerate_version` overrides the version hwenv reads (G5 tests). The namespace it yields
    has `count`, `names`, `memory`, `hpu`, `modules`, `hl_smi`, `functions`, `lazy`, `mode`, `graph_events`.
    """
    import torch

    patches = _Patches()
    overrides = {"habana-torch-plugin": plugin_version}
    if accelerate_version is not None:
        overrides["accelerate"] = accelerate_version
    with contextlib.ExitStack() as stack:
        try:
            for variable in (*DEVICE_VARIABLES, *GAUDI_VARIABLES):
                patches.setenv(variable, None)
            patches.setenv("ID", os.environ.get("ID"))  # initialize_distributed_hpu may set it: restore on exit
            if lazy_mode is not None:
                patches.setenv("PT_HPU_LAZY_MODE", lazy_mode)
            if hls_module_id is not None:
                patches.setenv(MODULE_ID_VARIABLE, hls_module_id)
            if visible_modules is not None:
                patches.setenv(MODULES_VARIABLE, visible_modules)
            mode = execution_mode(os.environ, plugin_version=plugin_version)  # read once, as at plugin import
            functions = _device_functions(count, name, memory)
            graphs = _package("habana_frameworks.torch.hpu.graphs", HPUGraph=HPUGraph, graph=graph,
                              wrap_in_hpu_graph=wrap_in_hpu_graph, make_graphed_callables=make_graphed_callables,
                              ModuleCacher=ModuleCacher)
            random = _package("habana_frameworks.torch.hpu.random", **{n: globals()[n] for n in RANDOM_NAMES})
            lazy_names = {key: getattr(graphs, key) for key in LAZY_ONLY_HPU_NAMES} if mode.lazy else {}
            # Stream/Event: torch._dynamo reads them from torch.hpu while tracing (_in_graph_classes).
            _GRAPH_STATE.update(events=[], lazy=mode.lazy, current=None, default=None)
            _RANDOM_STATE["generator"] = None
            graph.default_capture_stream = None
            hpu = _package("habana_frameworks.torch.hpu", **functions, Stream=Stream, Event=Event, graphs=graphs,
                           current_stream=current_stream, stream=stream, default_stream=default_stream,
                           random=random, **{n: getattr(random, n) for n in RANDOM_NAMES}, **lazy_names)
            def is_lazy():
                """`utils/internal.py` `is_lazy()`: fixed when the plugin is imported (here: on entry)."""
                return mode.lazy

            pin_names = {"HABANA_VISIBLE_MODULES_VAR": MODULES_VARIABLE, "HLS_MODULE_ID_VAR": MODULE_ID_VARIABLE}
            hpu.is_lazy = is_lazy  # hpu/__init__.py and core/__init__.py import it from utils.internal
            hpu.__dict__.update(pin_names)  # hpu/_utils.py constants, imported by hpu/__init__.py
            internal = _package("habana_frameworks.torch.utils.internal", is_lazy=is_lazy)
            utils = _package("habana_frameworks.torch.utils", internal=internal)
            core = _package("habana_frameworks.torch.core", mark_step=mark_step, is_lazy=is_lazy)
            hccl = _package("habana_frameworks.torch.distributed.hccl", initialize_distributed_hpu=initialize_distributed_hpu,
                            **pin_names)
            distributed = _package("habana_frameworks.torch.distributed", hccl=hccl)
            htorch = _package("habana_frameworks.torch", core=core, hpu=hpu, distributed=distributed, utils=utils)
            root = _package("habana_frameworks", torch=htorch, __version__=plugin_version)
            # transformers.is_torch_hpu_available() patches these torch globals when it first
            # returns True; save them so the fake leaves torch as it found it.
            for owner, attribute in _torch_globals_transformers_patches(torch):
                patches.setattr(owner, attribute, getattr(owner, attribute))
            for module in (root, htorch, core, hpu, graphs, random, utils, internal, distributed, hccl):
                patches.module(module.__name__, module)
            patches.setattr(torch, "hpu", hpu)  # torch._register_device_module("hpu", hpu) (core/__init__.py)
            patches.module("torch.hpu", hpu)
            stack.enter_context(override_versions(**overrides))
            hl_smi_path = stack.enter_context(fake_hl_smi(hl_smi)) if hl_smi is not None else None
            initialize_distributed_hpu()  # importing habana_frameworks.torch imports hccl, which runs it
            clear_library_caches()
            yield types.SimpleNamespace(count=count, names=[name] * count, memory=memory, hpu=hpu, modules=root,
                                        hl_smi=hl_smi_path, functions=functions, lazy=mode.lazy, mode=mode,
                                        graph_events=_GRAPH_STATE["events"])
        finally:
            patches.undo()
            clear_library_caches()
