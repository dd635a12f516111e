"""hwrun asks the device platform (issue 24) and reads memory and bf16 as the stacks report them
(issue 23 points 4 and 7): per-kind tables cover every registered kind, ROCm plans as an AMD GPU,
graph decoders capture through the platform's graph tools, memory and bf16 reasons say their source."""

from __future__ import annotations

import contextlib
import json

import hwenv
import hwrun
import pytest
from hwenv.platforms import Platform, get_platform, platforms, unregister
from hwrun import devices
from hwrun.errors import FastDecodeError, QuantizationError
from hwrun.testing import build_tiny_model

GiB = 2**30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-platforms")))


# ---- per-kind tables -----------------------------------------------------------------------

@pytest.mark.parametrize("path", devices.TABLES)
def test_every_table_has_a_row_for_every_registered_kind(path):
    table = devices.platform_tables()[path]
    missing = [p.kind for p in platforms() if p.kind not in table]
    assert not missing, f"{path} has no row for {missing}: add one (a new kind needs a row in every table)"
    assert "rocm" in table


def test_the_readme_shows_every_table():
    from pathlib import Path

    readme = (Path(devices.__file__).resolve().parents[2] / "README.md").read_text()
    for path in devices.TABLES:
        module, _, name = path.partition(":")
        assert f"`{module.removeprefix('hwrun.')}.{name}`" in readme, f"README's device table lacks {path}"


@contextlib.contextmanager
def dummy_platform():
    """A plug-in-like kind hwrun has no rows for, registered for the duration."""
    platform = Platform(kind="dummynpu", device_type="dummynpu", display_name="Dummy NPU",
                        probe="hwrun.devices:kinds", priority=45, dist_backend="gloo")
    hwenv.register_platform(platform, origin="test")
    try:
        yield platform
    finally:
        unregister("dummynpu")


def test_a_new_kind_is_reported_missing_from_every_table_and_gets_conservative_defaults(tiny):
    assert devices.missing_rows() == {}
    with dummy_platform():
        missing = devices.missing_rows()
        assert set(missing) == set(devices.TABLES) and all(kinds == ("dummynpu",) for kinds in missing.values())
        accel = hwenv.Accelerator("dummynpu", 1, names=("npu0",), bf16=True)
        with pytest.raises(QuantizationError, match="no bitsandbytes row"):
            hwrun.plan(tiny, device=accel, quantization="4bit")
        from hwrun.inference.batching import continuous_warmup
        from hwrun.training.patches.fused_loss import chunk_function

        assert not continuous_warmup("dummynpu")
        assert chunk_function(True, "auto", "dummynpu").__name__ == "_chunk_loss_grad"  # unmeasured: torch form
    assert devices.missing_rows() == {}


def test_plan_accepts_every_registered_kind_by_name(tiny):
    for platform in platforms():
        if platform.kind == hwenv.detect().kind:
            continue
        with pytest.raises(hwrun.PlanError, match="not usable here") as info:
            hwrun.plan(tiny, device=platform.kind)
        assert "not a device kind" not in str(info.value)


# ---- ROCm ----------------------------------------------------------------------------------

def test_rocm_accelerator_plans_as_an_amd_gpu_on_torch_cuda_device(tiny):
    accel = hwenv.Accelerator("rocm", 2, names=("AMD Instinct MI300X",) * 2, memory=(192 * GiB,) * 2)
    plan = hwrun.plan(tiny, device=accel, compile=True)
    assert plan.device == "cuda:0" and plan.device_map == "cuda" and plan.dtype == "bfloat16"
    assert plan.reasons["device"].startswith("given: AMD GPU (ROCm); planned for the given accelerator")
    assert "rocm supports bf16" in plan.reasons["dtype"]
    assert "cuda:0 (2 x rocm)" in plan.render()
    assert "ROCm" in hwrun.plan(tiny, device=accel, quantization="4bit").reasons["quantization"]
    from hwrun.inference.batching import choose_batching, continuous_warmup

    assert choose_batching(plan, 4).mode == "continuous" and continuous_warmup("rocm")
    from hwrun.inference.decision import planned

    assert planned(plan, 1).decode == "graphs"  # HIP graphs behind CUDA's graph API


def test_hwrun_plan_names_a_detected_rocm_gpu(tiny, fake_cuda, monkeypatch, capsys):
    import torch

    fake_cuda(1, name="AMD Instinct MI300X", memory=192 * GiB)
    monkeypatch.setattr(torch.version, "hip", "6.3.42131")
    from hwrun.cli.main import main

    assert main(["plan", tiny]) == 0
    table = capsys.readouterr().out
    assert "AMD GPU (ROCm)" in table and "cuda:0 (1 x rocm)" in table and "NVIDIA" not in table
    assert main(["plan", tiny, "--device", "rocm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "cuda:0" and data["accelerator"]["kind"] == "rocm" and data["device_map"] == "cuda"


# ---- memory (issue 23 point 4) ---------------------------------------------------------------

#: Llama-3-70B's shape, built as a config (never weights): about 70.6e9 parameters, 131 GiB in bf16.
def llama_70b_config() -> dict:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False).to_dict()


@pytest.fixture
def cached_70b(tmp_path, monkeypatch):
    """A Hub id whose config.json (only) sits in a temporary Hub cache, as after `hf download --include config.json`."""
    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--meta-llama--Llama-3-70B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(llama_70b_config()))
    refs = snapshot.parents[1] / "refs"
    refs.mkdir()
    (refs / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return "meta-llama/Llama-3-70B"


@pytest.mark.facts("G9", "G11")
def test_a_70b_llama_on_eight_gaudi_cards_is_one_card_per_process_not_a_split(fake_gaudi, cached_70b):
    """One Gaudi card per process: gaudi-pytorch-bridge 1.19 `backend/habana_device/HPUGuardImpl.h`
    (`TORCH_CHECK(allocator_active_device_id == 0, "habana active device: ...")`) and `hpu/csrc/bindings.cpp`
    (every query ignores the index); Accelerate 1.16 `utils/modeling.py` `get_max_memory` drops the indices
    whose `torch.tensor(0, device=f"hpu:{i}")` raises, so `device_map="auto"` keeps hpu:0 and the CPU (issue 41.1)."""
    fake_gaudi(8, memory=96 * GiB)
    plan = hwrun.plan(cached_70b)
    assert plan.accelerator.memory == (96 * GiB,) * 8  # torch.hpu.mem_get_info(), not the property string
    assert 130 * GiB < plan.weight_bytes < 133 * GiB and "config.json" in plan.reasons["device_map"]
    assert plan.device_map == "auto"  # what Accelerate then does: hpu + CPU offload, never hpu:0..7
    reason = plan.reasons["device_map"]
    assert "split across" not in reason and "it does not split" in reason
    assert "a process uses only its own Gaudi card" in reason and "HPUGuardImpl.h" in reason
    assert "of the 8 visible devices accelerate keeps hpu and offloads the rest to CPU memory" in reason
    assert "QLoRA (quantization='4bit'" in reason and "tensor parallelism with one process per card: tp=N" in reason
    assert "mem_get_info" in reason  # where the card size came from
    assert hwrun.from_pretrained_kwargs(plan)["device_map"] == "auto"
    one = hwrun.plan(cached_70b, device=hwenv.Accelerator("hpu", 1, names=("GAUDI3",), memory=(128 * GiB,)))
    assert one.device_map == "auto" and "offloads the rest to CPU" in one.reasons["device_map"]
    assert "tensor parallelism with one process per card: tp=N" in one.reasons["device_map"]
    # a platform whose processes use every visible device still splits (X9), and says nothing of issue 37
    xpus = hwrun.plan(cached_70b, device=hwenv.Accelerator("xpu", 4, memory=(64 * GiB,) * 4))
    assert "split across the 4 selected devices" in xpus.reasons["device_map"]
    assert "issue 37" not in xpus.reasons["device_map"]


def test_devices_per_process_is_platform_data():
    """hwrun asks the platform (`Platform.devices_per_process`), never the kind string (issue 41.1)."""
    assert get_platform("hpu").devices_per_process == 1 and get_platform("hpu").usable_devices(8) == 1
    for kind in ("xpu", "cuda", "rocm"):
        assert get_platform(kind).devices_per_process is None and get_platform(kind).usable_devices(8) == 8
    with pytest.raises(ValueError, match="devices_per_process=0"):
        Platform(kind="bad", device_type="bad", display_name="Bad", probe="m:f", priority=1, devices_per_process=0)


@pytest.mark.facts("X9")
def test_xpu_memory_from_mem_get_info_is_named_in_the_plan(fake_xpu, tiny):
    fake_xpu(2, memory=64 * GiB)
    plan = hwrun.plan(tiny)
    assert plan.device_map == "xpu" and "memory: torch.xpu.mem_get_info" in plan.reasons["device_map"]


def test_unreadable_memory_is_said_with_what_was_assumed(cached_70b):
    why = "torch.xpu.mem_get_info failed (RuntimeError: not supported); get_device_properties has no total_memory"
    accel = hwenv.Accelerator("xpu", 2, names=("Intel(R) Arc(TM) Graphics",) * 2, memory_source=why)
    plan = hwrun.plan(cached_70b, device=accel)
    assert plan.device_map == "xpu"
    reason = plan.reasons["device_map"]
    assert "device memory unknown" in reason and why in reason and "assumed the weights" in reason


@pytest.mark.facts("X9", "X17")
def test_an_integrated_xpu_plans_fp32_and_says_memory_was_assumed(fake_xpu, tiny):
    fake_xpu(1, integrated=True, native_bf16=False, name="Intel(R) Arc(TM) Graphics", memory=16 * GiB)
    plan = hwrun.plan(tiny)
    assert plan.dtype == "float32"
    reason = plan.reasons["dtype"]  # hwenv's bf16_source: the including_emulation=False reading, integrated GPU
    assert "including_emulation=False" in reason and "integrated GPU" in reason and "emulated only" in reason
    assert "assumed" in plan.reasons["device_map"] and "total_memory" in plan.reasons["device_map"]


# ---- bf16 (issue 23 point 7) -----------------------------------------------------------------

@pytest.mark.facts("X17")
def test_dtype_reason_uses_the_accelerators_bf16_source(tiny):
    emulated = hwenv.Accelerator("xpu", 1, bf16=False, bf16_source=(
        "torch.xpu.is_bf16_supported(including_emulation=False): emulated only (integrated GPU)"))
    plan = hwrun.plan(tiny, device=emulated)
    assert plan.dtype == "float32" and "emulated only (integrated GPU)" in plan.reasons["dtype"]
    with pytest.raises(hwrun.PlanError, match="emulated only"):
        hwrun.plan(tiny, device=emulated, dtype="bfloat16")
    native = hwenv.Accelerator("xpu", 1, bf16=True, bf16_source="torch.xpu.is_bf16_supported(including_emulation=False): native")
    assert "X10, X17; read by torch.xpu.is_bf16_supported(including_emulation=False): native" in (
        hwrun.plan(tiny, device=native).reasons["dtype"])


def test_training_bf16_refusal_names_the_bf16_source(tmp_path, tiny):
    from hwrun.errors import TrainingConfigError

    emulated = hwenv.Accelerator("xpu", 1, bf16=False, bf16_source="emulated only (integrated GPU)")
    plan = hwrun.plan(tiny, device=emulated)
    with pytest.raises(TrainingConfigError, match="emulated only"):
        hwrun.training_arguments(plan, tmp_path, bf16=True)


# ---- Gaudi generations (issue 24 point 6) -----------------------------------------------------

@pytest.mark.facts("G10")
def test_gaudi_quantization_follows_the_generation_table(tiny):
    with pytest.raises(QuantizationError, match="Gaudi 1.*Gaudi 2 and Gaudi 3 only"):
        hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI",)), quantization="8bit")
    future = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI4",)), quantization="4bit")
    assert future.quantization == "4bit" and future.dtype == "bfloat16"
    assert "'GAUDI4' is not a Gaudi name hwenv knows" in future.reasons["quantization"]
    assert "Gaudi 3" in future.reasons["quantization"]
    known = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI3",)), quantization="4bit")
    assert "not a Gaudi name" not in known.reasons["quantization"]


# ---- graph decode through the platform --------------------------------------------------------

def test_graph_tools_per_platform():
    import torch
    from hwrun.inference.decode.static import decoder_graph_tools

    xpu = decoder_graph_tools(get_platform("xpu"))
    assert xpu.graph_class is torch.xpu.XPUGraph and xpu.capture is torch.xpu.graph
    cuda = decoder_graph_tools(get_platform("cuda"))
    assert cuda.graph_class is torch.cuda.CUDAGraph and cuda.use_stream is torch.cuda.stream
    assert decoder_graph_tools(get_platform("rocm")).graph_class is torch.cuda.CUDAGraph
    assert decoder_graph_tools(get_platform("hpu")) is None and decoder_graph_tools(get_platform("cpu")) is None


def test_decode_choice_per_platform(tiny, fake_xpu):
    from hwrun.inference.decision import planned

    cuda = hwrun.plan(tiny, device=hwenv.Accelerator("cuda", 1, memory=(80 * GiB,)), compile=True)
    one = planned(cuda, 1)
    assert (one.batching, one.decode, one.runner) == ("static", "graphs", "static_graphs")
    assert one.reason == ("CUDA (compile on): static cache + CUDA graph replay per token "
                          "(hwrun.inference.decode.static), no host work per token")
    eager = planned(hwrun.plan(tiny, device=hwenv.Accelerator("cuda", 1, memory=(80 * GiB,))), 1)
    assert eager.runner == "static_graphs" and eager.reason.startswith("CUDA (compile off: the eager step captured")
    fake_xpu(1)
    xpu = planned(hwrun.plan(tiny, compile=True), 4)
    assert xpu.runner == "engine" and xpu.reason.startswith("XPU (compile on)") and "one XPU graph replay" in xpu.reason
    gaudi = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 8, names=("GAUDI2",)), compile=True)
    auto = planned(gaudi, 1)
    assert auto.decode == "generate" and "CUDA or XPU graphs" in auto.reason
    given = planned(gaudi, 1, decode="graphs")
    assert given.decode == "graphs" and "hpu_graphs" in given.reason and "runs eagerly" in given.reason


class RecordingTools:
    """GraphTools-shaped stand-in: capture records the step, replay runs it; every call is logged."""

    api = "xpu_graphs"

    def __init__(self, events: list[str]) -> None:
        self.events = events
        outer = self

        class Stream:
            def __init__(self, device=None):
                outer.events.append("stream")

            def wait_stream(self, other):
                outer.events.append("wait")

        class Graph:
            def __init__(self):
                self.step = None

            def replay(self):
                outer.events.append("replay")
                self.step()

        self.stream_class, self.graph_class = Stream, Graph

    def current_stream(self, device=None):
        return self.stream_class()

    @contextlib.contextmanager
    def use_stream(self, stream):
        self.events.append("use_stream")
        yield

    @contextlib.contextmanager
    def capture(self, graph):
        self.events.append("capture")
        # the step runs inside the capture (as the real one is recorded there); keep it for replay
        graph.step = self.last_step
        yield


def test_graph_decoder_captures_and_replays_through_the_platform_tools(tiny, monkeypatch):
    import torch
    from hwrun.inference.decode import static as fastdecode
    from hwrun.inference.decode.static import GraphDecoder
    from hwrun.inference.engine import EngineCore
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True).eval()
    prompt = torch.tensor([[1, 5, 9, 4]])
    eager = GraphDecoder(model, max_cache_len=32, use_graphs=False).generate(prompt, 12, eos_token_id=None)

    events: list[str] = []
    tools = RecordingTools(events)
    monkeypatch.setattr(fastdecode, "decoder_graph_tools", lambda platform: tools)
    synced = []
    from hwenv.platforms import runtime

    monkeypatch.setattr(runtime, "synchronize", lambda platform, device=None: synced.append(platform.kind))
    decoder = GraphDecoder(model, max_cache_len=32, check_every=4)
    assert decoder.use_graphs and decoder.platform.kind == "cpu"
    tools.last_step = decoder._step_fn
    graphed = decoder.generate(prompt, 12, eos_token_id=None)
    assert torch.equal(graphed, eager)
    first_capture, first_replay = events.index("capture"), events.index("replay")
    assert events.index("use_stream") < first_capture < first_replay and events.count("capture") == 1
    assert events.count("replay") == 11 and synced == ["cpu"]

    events.clear()
    from hwrun.inference.engine import core as engine_core

    monkeypatch.setattr(engine_core, "decoder_graph_tools", lambda platform: tools)
    slots = EngineCore(model, slots=2, max_cache_len=32, check_every=4)
    tools.last_step = slots.runner.step_function(False, 2, 32)
    rows = slots.generate([[1, 5, 9, 4], [2, 7]], 6, eos_token_id=None)
    assert rows[0] == eager[0, :6].tolist() and events.count("capture") == 1 and "replay" in events


def test_use_graphs_without_graph_tools_is_refused_naming_the_graph_api(tiny):
    from hwrun.inference.decode.static import GraphDecoder
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    with pytest.raises(FastDecodeError, match=r"CUDA or XPU graphs.*cpu: none"):
        GraphDecoder(model, max_cache_len=8, use_graphs=True)


# ---- device types and Triton ------------------------------------------------------------------

def test_kind_of_device_type(fake_cuda, monkeypatch):
    import torch

    assert devices.kind_of_device_type("cpu") == "cpu" and devices.kind_of_device_type("xpu") == "xpu"
    assert devices.kind_of_device_type("cuda", hint="rocm") == "rocm"
    monkeypatch.setattr(devices, "_KIND_OF_DEVICE_TYPE", {})
    assert devices.kind_of_device_type("cuda", hint="xpu") == "cuda"  # the hint is another type; none detected
    monkeypatch.setattr(devices, "_KIND_OF_DEVICE_TYPE", {})
    fake_cuda(1)
    monkeypatch.setattr(torch.version, "hip", "6.3.42131")
    assert devices.kind_of_device_type("cuda") == "rocm"  # the one hwenv detects


def test_the_triton_loss_kernel_only_where_it_was_measured():
    import importlib.util

    from hwrun.training.patches.fused_loss import chunk_function

    has_triton = importlib.util.find_spec("triton") is not None
    assert (chunk_function(True, "auto", "cuda").__name__ == "chunk_ce_triton") is has_triton
    for kind in ("rocm", "xpu", "hpu", "mps", "cpu"):
        assert chunk_function(True, "auto", kind).__name__ == "_chunk_loss_grad"


def test_training_keywords_per_kind(tmp_path, tiny):
    from hwrun.training.arguments import training_keywords

    rocm = hwrun.plan(tiny, device=hwenv.Accelerator("rocm", 1, memory=(192 * GiB,)))
    keywords = training_keywords(rocm, tmp_path)
    assert keywords["optim"] == "adamw_torch_fused" and keywords["accelerator_config"] == {"non_blocking": True}
    assert keywords["use_cpu"] is False and keywords["bf16"] is True
    gaudi = hwrun.plan(tiny, device=hwenv.Accelerator("hpu", 1, names=("GAUDI2",)))
    keywords = training_keywords(gaudi, tmp_path)
    assert keywords["optim"] == "adamw_torch" and "accelerator_config" not in keywords
    cpu = training_keywords(hwrun.plan(tiny, device="cpu"), tmp_path)
    assert cpu["use_cpu"] is True and cpu["bf16"] is False
    from hwrun.training.run import train_plan

    assert train_plan(tiny, device=hwenv.Accelerator("rocm", 1, memory=(192 * GiB,))).compile is not None
    assert train_plan(tiny, device="cpu").compile is None
