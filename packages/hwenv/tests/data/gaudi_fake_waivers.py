"""Every public name of the Gaudi bridge (`gaudi_bridge_1.19_manifest.json`, generated from its source) that
`hwenv.testing.fake_gaudi` does not provide, each with the reason (issue 41.8).

A name is waived only when neither hwstack nor a library it drives (Transformers, Accelerate, PEFT, torch's
Dynamo, as installed) calls it: `test_hwenv_gaudi_fake_drift.py::test_no_library_hwstack_drives_calls_a_waived_name`
scans their source and fails when one does, so a waiver cannot hide a name that matters. A waiver for a name
the fake provides, or one the bridge does not have, fails too (stale). Keys: `module.name`, and for a class
method `module.Class.method`.
"""

from __future__ import annotations

H = "habana_frameworks.torch.hpu"
G = "habana_frameworks.torch.hpu.graphs"
C = "habana_frameworks.torch.core"


def _names(module: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{module}.{name}" for name in names)


#: reason -> the names it covers.
WAIVERS: dict[str, tuple[str, ...]] = {
    "graph-compiler and execution switches (dynamic shapes, inference mode, quantization, recipe serialization, "
    "matmul reshape, optimizer SIF, fused-SDPA recompute, determinism, stream debug mode): they change how the "
    "device compiles and runs, which a fake that cannot run ops has nothing to change; no caller in hwstack or "
    "the libraries it drives": _names(
        H, "enable_dynamic_shape", "disable_dynamic_shape", "get_dynamic_shape_status", "enable_inference_mode",
        "disable_inference_mode", "enable_quantization", "disable_quantization", "enable_const_section_serialization",
        "disable_const_section_serialization", "enable_matmul3d_2d_reshape", "disable_matmul3d_2d_reshape",
        "enable_optim_output_sif", "disable_optim_output_sif", "enable_recompute_sdp", "recompute_sdp_enabled",
        "sdp_kernel", "setDeterministic", "getDeterministic", "set_sync_debug_mode", "get_sync_debug_mode"),
    "HPU autocast controls (`_hpu_C.set_autocast_hpu_*`): torch's own `torch.autocast('hpu')` is what Transformers "
    "and Accelerate use; nothing calls these": _names(
        H, "set_autocast_hpu_enabled", "is_autocast_hpu_enabled", "set_autocast_hpu_dtype", "get_autocast_hpu_dtype"),
    "legacy typed-tensor constructors (`torch.hpu.FloatTensor(...)` always copies onto the device): the fake cannot "
    "hold tensors on a device (hwenv README: it reports devices, it cannot allocate)": _names(
        H, "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
        "IntTensor", "LongTensor", "ShortTensor"),
    "device queries hwstack does not make and no driven library calls (capability is a string from `_hpu_C`, "
    "the arch list is the device name, peers are always reachable, utilization needs pyhlml, memory_usage is "
    "hl-smi's InUse): hwenv reads the name, count, bf16 and `mem_get_info` instead": _names(
        H, "get_device_capability", "get_arch_list", "get_gencode_flags", "can_device_access_peer", "utilization",
        "memory_usage"),
    "`device` / `device_of` context managers: one card per process (HPUGuardImpl.h) makes them no-ops for index 0 "
    "and errors for others; hwstack and the driven libraries never enter them": _names(H, "device", "device_of"),
    "memory summaries and the allocator's reserved/cached counters (`memory_summary`, `memory_reserved`, ...): "
    "the fake's memory is `memory_stats()` with the bridge's keys, which `mem_get_info`, `memory_allocated` and "
    "`max_memory_allocated` read; these others are read by nothing hwstack drives": _names(
        H, "memory_summary", "memory_reserved", "max_memory_reserved", "memory_cached", "max_memory_cached",
        "reset_accumulated_memory_stats"),
    "stream internals beyond the ones hwrun's graph capture uses (`Stream`, `current_stream`, `stream`, "
    "`default_stream`): setting a stream by id, stream info, `record_stream` (a Tensor method patch), "
    "the context class, the lazy-mode flag read at import": _names(
        H, "set_stream", "get_stream_info", "record_stream", "StreamContext", "is_lazy_mode"),
    "bridge metrics (`hpu/metrics`: graph compilation, recipe cache, CPU fallback counters): they count what the "
    "device compiles; the fake compiles nothing": _names(
        H, "metric_global", "metric_localcontext", "metrics_dump", "MetricNotFound", "InvalidMetricDumpFileFormat",
        "InvalidMetricDumpTrigger"),
    "HPU-graph helpers internal to `wrap_in_hpu_graph` / `ModuleCacher` (input hashing, copying, tensor packing, "
    "the per-input cache record, the graphed module, debug printing): the fake's `wrap_in_hpu_graph`, "
    "`make_graphed_callables` and `ModuleCacher` carry their own equivalents; star-exported by "
    "`hpu/__init__.py` in lazy mode but called by nothing outside the bridge": (
        *_names(G, "CachedParams", "GraphModel", "TensorPacker", "copy_to", "extract_tensors", "get_tensor_info",
                "get_user_input_tensor_list", "input_hash", "is_current_stream_capturing", "stringify",
                "wrap_in_hpu_graph_func", "wrapped_hpugraph_forward"),
        *_names(H, "CachedParams", "GraphModel", "TensorPacker", "copy_to", "extract_tensors", "get_tensor_info",
                "get_user_input_tensor_list", "input_hash", "is_current_stream_capturing", "stringify",
                "wrap_in_hpu_graph_func", "wrapped_hpugraph_forward")),
    "`HPUGraph` methods for the bridge's tensor-cache-off path (`replayV2`/`replayV3`, marking user inputs and "
    "outputs, input match indices, `clear_inputs`): hwrun captures with the tensor cache on and replays with "
    "`replay()`; the fake models that path": (
        *_names(f"{H}.HPUGraph", "replayV2", "replayV3", "mark_user_inputs", "mark_user_outputs",
                "get_user_input_match_indices", "clear_inputs"),
        *_names(f"{G}.HPUGraph", "replayV2", "replayV3", "mark_user_inputs", "mark_user_outputs",
                "get_user_input_match_indices", "clear_inputs")),
    "`ModuleCacher`'s bookkeeping methods (cache insert/replay, LFU recording, statistics): the bridge calls them "
    "from the forward it installs; the fake's `__call__` installs its own forward with the same caching rule": (
        *_names(f"{H}.ModuleCacher", "cache_insert", "cache_replay", "capture_start", "capture_end", "forward",
                "forward_lfs", "is_hpugraph_tracing", "log_stats", "record", "set_iteration_count"),
        *_names(f"{G}.ModuleCacher", "cache_insert", "cache_replay", "capture_start", "capture_end", "forward",
                "forward_lfs", "is_hpugraph_tracing", "log_stats", "record", "set_iteration_count")),
    "`Stream` / `Event` synchronisation methods: the fake queues no work, so there is nothing to wait for or "
    "time; hwrun's capture uses `Stream.wait_stream` only, and Dynamo only needs the classes to exist "
    "(torch/_dynamo/variables/user_defined.py)": (
        *_names(f"{H}.Stream", "query", "synchronize", "record_event", "wait_event", "device_index", "id"),
        *_names(f"{H}.Event", "record", "wait", "query", "synchronize", "elapsed_time")),
    "`core` set-up the plugin runs on import (torch overrides, pt2e quantization wrappers, compiler imports, "
    "the import hook) and its quantization/inference environment helpers: importing the fake is the set-up; "
    "hwcompile registers its own `hpu_backend` stand-in": _names(
        C, "overwrite_torch_functions", "overwrite_capture_pre_autograd_graph",
        "overwrite_native_pt2e_quantization_interface", "import_compilers", "import_hpu_partition",
        "create_and_apply_on_import_wrapper", "hpu_initialize", "hpu_inference_initialize", "hpu_reset_env",
        "hpu_set_env", "hpu_set_inference_env", "hpu_teardown_inference_env"),
    "lazy-mode step closures (`add_step_closure`, `iter_mark_step`): callbacks run at `mark_step`, which the "
    "fake's no-op `mark_step` never flushes; nothing hwstack drives registers one": _names(
        C, "add_step_closure", "iter_mark_step"),
    "distributed emulation (`PT_HPU_EMULATE_DISTRIBUTED`): a bridge testing mode, not modelled (hwenv README)": _names(
        "habana_frameworks.torch.distributed.hccl", "distributed_emulation_apply_if_enabled",
        "is_distributed_emulation_enabled"),
    "Dynamo's device interface for `hpu` (registered by importing `dynamo`): torch's Dynamo reads it only while "
    "compiling for `hpu`, which the fake's tests do through hwcompile's registered `hpu_backend` stand-in": (
        "habana_frameworks.torch.dynamo.HpuInterface",),
    "`utils/internal.py` helpers besides `is_lazy` (a lazy-only decorator, a timer, the module logger)": _names(
        "habana_frameworks.torch.utils.internal", "lazy_only", "Timer", "logger"),
}


def waived() -> dict[str, str]:
    """name -> reason; a name listed under two reasons is an error."""
    out: dict[str, str] = {}
    for reason, names in WAIVERS.items():
        for name in names:
            if name in out:
                raise ValueError(f"{name} is waived twice")
            out[name] = reason
    return out
