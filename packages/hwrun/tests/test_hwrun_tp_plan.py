"""`plan(tp=N)` (issue 37.1): how the model is split and why; every refusal before any process starts (no tp_plan,
heads or KV heads not divisible, more processes than devices, MPS, bad values); the XPU and Gaudi paths under
hwenv.testing's fakes (backend, devices, the ranks' environment); the CLI's refusals as one line, exit 2."""

from __future__ import annotations

import hwenv
import hwrun
import pytest
from hwenv.testing import fake_gaudi, fake_xpu
from hwrun.errors import TensorParallelError
from hwrun.parallel.launch import RANK_MARK, rank_launch
from hwrun.parallel.ranks import launched_ranks
from hwrun.testing.families import build_tiny_family


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-plan")
    llama = build_tiny_family("llama", root / "llama")
    return {"llama": llama, "gpt2": build_tiny_family("gpt2", root / "gpt2", tokenizer_source=llama),
            "qwen3_moe": build_tiny_family("qwen3_moe", root / "qwen3_moe", tokenizer_source=llama)}


def test_tp2_plan_says_how_llama_is_split(models):
    plan = hwrun.plan(str(models["llama"]), device="cpu", tp=2)
    assert plan.tp == 2 and plan.parallel.backend == "gloo" and plan.parallel.model_class == "LlamaForCausalLM"
    assert plan.device_map is None and "each rank loads only its shards" in plan.reasons["device_map"]
    assert "attention: 4 query / 2 KV heads -> 2 / 1 per rank" in plan.parallel.split[0]
    assert any(line.startswith("lm_head: column-wise") for line in plan.parallel.split)
    assert plan.parallel.tp_plan["model.layers.*.self_attn.o_proj"] == "rowwise"
    assert "DistributedConfig(tp_size=2)" in plan.reasons["tensor_parallel"]
    rows = {name: (value, reason) for name, value, reason in plan.rows()}
    assert rows["tensor_parallel"][0] == "tp=2, gloo"
    assert plan.to_dict()["tensor_parallel"]["split"] == list(plan.parallel.split)
    one = hwrun.plan(str(models["llama"]), device="cpu")
    assert one.tp == 1 and one.parallel is None and "tensor_parallel" not in {r[0] for r in one.rows()}
    from hwrun.cli.main import decode_rows

    for _label, value, reason in decode_rows(plan):  # `hwrun plan --tp 2`: hwrun's engine on every rank
        assert value == "graphs, continuous batching", reason
        assert reason.startswith("tensor parallel (tp=2): every rank runs hwrun's engine (EngineCore.generate)")
        assert "eager steps (cpu has no CUDA, XPU or HPU graphs)" in reason


def test_moe_experts_are_said_to_stay_whole_or_split_as_the_installed_plan_says(models):
    """Transformers 5.25's qwen3_moe tp_plan names no expert weights (they stay whole on every rank); 5.22.2's splits
    them: the plan says what the installed release's tp_plan does."""
    plan = hwrun.plan(str(models["qwen3_moe"]), device="cpu", tp=2)
    if any(".experts" in key for key in plan.parallel.tp_plan):
        assert any(line.startswith("mlp.experts: experts split") for line in plan.parallel.split), plan.parallel.split
    else:
        assert any("experts: all 4 replicated on every rank" in line for line in plan.parallel.split)


@pytest.mark.parametrize(("tp", "words"), [
    (3, "tp=3 does not divide LlamaForCausalLM's 4 attention heads"),
    (4, "tp=4 does not divide LlamaForCausalLM's 2 KV heads"),
])
def test_heads_not_divisible_are_refused_naming_which(models, tp, words):
    with pytest.raises(TensorParallelError, match="Use tp in \\[1, 2\\]") as error:
        hwrun.plan(str(models["llama"]), device="cpu", tp=tp)
    assert words in str(error.value)


def test_a_class_without_a_tp_plan_is_refused_by_name(models):
    with pytest.raises(TensorParallelError, match="GPT2LMHeadModel declares no tensor-parallel plan"):
        hwrun.plan(str(models["gpt2"]), device="cpu", tp=2)


@pytest.mark.parametrize("tp", [0, -1, True, 2.0, "2"])
def test_bad_tp_values_are_refused(models, tp):
    with pytest.raises(TensorParallelError, match="must be a positive integer"):
        hwrun.plan(str(models["llama"]), device="cpu", tp=tp)


def test_more_processes_than_devices_is_refused(models):
    two = hwenv.Accelerator("cuda", 2, memory=(80 * 2**30,) * 2)
    with pytest.raises(TensorParallelError, match="exceeds the 2 cuda device"):
        hwrun.plan(str(models["llama"]), device=two, tp=4)
    with pytest.raises(TensorParallelError, match="exceeds 8"):  # CPU: the per-core bound hwdist launch applies
        hwrun.plan(str(models["llama"]), device="cpu", tp=16)


def test_mps_and_quantized_and_adapter_combinations_are_refused(models):
    with pytest.raises(TensorParallelError, match="no MPS mesh"):
        hwrun.plan(str(models["llama"]), device=hwenv.Accelerator("mps", 1), tp=2)
    with pytest.raises(TensorParallelError, match="quantization='8bit'"):
        hwrun.plan(str(models["llama"]), device="cpu", tp=2, quantization="8bit")


def test_cuda_plan_elsewhere_picks_nccl(models):
    plan = hwrun.plan(str(models["llama"]), device=hwenv.Accelerator("cuda", 4, memory=(80 * 2**30,) * 4), tp=2)
    assert plan.parallel.backend == "nccl"
    assert "local ranks 0..1 of the 4 visible" in plan.parallel.processes


def test_xpu_under_fakes_affinity_mask_backend_and_rank_env(models, monkeypatch):
    with fake_xpu(4, affinity_mask="0,1"):
        plan = hwrun.plan(str(models["llama"]), device="xpu", tp=2)
        assert plan.parallel.backend == "xccl"
        assert "ZE_AFFINITY_MASK=0,1" in plan.parallel.processes
        launch = rank_launch(plan, ["generate", "--tp", "2", "hi"])
        assert "--nproc-per-node=2" in launch.argv and "--standalone" in launch.argv
        assert launch.argv[-6:] == ["-m", "hwrun.cli", "generate", "--tp", "2", "hi"]
        assert launch.env["ZE_AFFINITY_MASK"] == "0,1" and launch.env[RANK_MARK] == "1"
        assert launch.env["OMP_NUM_THREADS"] == "1"  # an accelerator's rank only launches kernels
        assert "RANK" not in launch.env and "WORLD_SIZE" not in launch.env
        with pytest.raises(TensorParallelError, match="exceeds the 2 xpu device"):
            hwrun.plan(str(models["llama"]), device="xpu", tp=4)


def test_gaudi_under_fakes_groups_and_modules(models, monkeypatch):
    with fake_gaudi(8):
        plan = hwrun.plan(str(models["llama"]), device="hpu", tp=2)
        assert plan.parallel.backend == "hccl" and "Gaudi modules [0, 1]" in plan.parallel.processes
        launch = rank_launch(plan, ["serve", "--tp", "2"])
        assert "HLS_MODULE_ID" not in launch.env  # the bridge pins each rank itself
    with fake_gaudi(8, visible_modules="4,5"):
        plan = hwrun.plan(str(models["llama"]), device="hpu", tp=2)
        assert "HABANA_VISIBLE_MODULES=4,5" in plan.parallel.processes
        assert rank_launch(plan, ["serve"]).env["HABANA_VISIBLE_MODULES"] == "4,5"


def test_ranks_env_is_read_and_checked():
    assert not launched_ranks(2, {})
    assert launched_ranks(2, {"WORLD_SIZE": "2", "RANK": "1"})
    with pytest.raises(TensorParallelError, match="WORLD_SIZE=4"):
        launched_ranks(2, {"WORLD_SIZE": "4", "RANK": "0"})


@pytest.mark.parametrize(("extra", "words"), [
    (["--tp", "3"], "does not divide LlamaForCausalLM's 4 attention heads"),
    (["--tp", "2", "--decode", "graphs", "--batching", "static"], "decode='graphs' with batching='static' on tp=2"),
    (["--tp", "2", "--decode", "generate", "--batching", "continuous"],
     "batching='continuous' with decode='generate' on tp=2"),
])
def test_cli_refuses_before_launch_in_one_line(models, capsys, extra, words):
    from hwrun.cli.main import main

    code = main(["generate", "--model", str(models["llama"]), "--device", "cpu", *extra, "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0]


@pytest.mark.slow
def test_a_failing_rank_is_its_own_one_line_error_and_exit_status(tmp_path):
    """The ranks' torchrun (`hwrun.parallel.torchrun`) ends with the failed rank's status and no traceback box."""
    import os
    import subprocess
    import sys

    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n"
                      "    print('hwrun: error: boom on rank 1', file=sys.stderr)\n    sys.exit(2)\ntime.sleep(60)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "hwrun.parallel.torchrun", "--nproc-per-node=2", "--standalone",
                           str(script)], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["hwrun: error: boom on rank 1"]


def test_weights_per_rank_are_counted_and_must_fit_one_device(models):
    """Per rank: the split weights' 1/tp slice plus what stays whole (from the safetensors headers and the plan),
    held to one device's budget like a single-device plan (85%)."""
    roomy = hwenv.Accelerator("cuda", 2, memory=(80 * 1024,) * 2, bf16=True)
    plan = hwrun.plan(str(models["llama"]), device=roomy, tp=2, dtype="bfloat16")
    whole, rank = plan.weight_bytes, None
    import re

    found = re.search(r"([\d.]+) KiB per rank", plan.reasons["tensor_parallel"])
    rank = float(found.group(1)) * 1024
    assert whole / 2 < rank < whole  # the embeddings and norms stay whole on every rank
    assert "offloads" not in plan.reasons["device_map"]
    with pytest.raises(TensorParallelError, match="more than one cuda device's budget"):
        hwrun.plan(str(models["llama"]), device=hwenv.Accelerator("cuda", 2, memory=(40 * 1024,) * 2, bf16=True),
                   tp=2, dtype="bfloat16")


def test_the_one_decision_for_a_tp_plan(models, monkeypatch):
    """`decide_serving` and `decide` answer for tensor-parallel plans too: hwrun's engine on every rank, the model's
    own forward; generate() takes Transformers' loop where it is asked for or where the engine cannot run the model
    (logged), and refuses what would not pair the ranks' steps; rank 0 alone prints, and streams only that loop."""
    from hwrun.errors import EngineStartError, GenerateError
    from hwrun.inference.decision import decide, decide_serving, planned
    from hwrun.parallel.generate import rank_roles
    from transformers import AutoModelForCausalLM

    plan = hwrun.plan(str(models["llama"]), device="cpu", tp=2)
    model = AutoModelForCausalLM.from_pretrained(models["llama"])
    decision = decide_serving(plan, model)
    assert decision.engine == "slots" and "tensor parallel (tp=2)" in decision.reason and "lockstep" in decision.reason
    assert decide_serving(plan, model, "slots").reason == decision.reason
    with pytest.raises(EngineStartError, match="--engine transformers with --tp 2"):
        decide_serving(plan, model, "transformers")
    for n in (1, 64):
        assert planned(plan, n).runner == planned(plan, n, decode="graphs").runner == "engine"
    engine = decide(plan, model, n_prompts=2, needed=40)
    assert engine.runner == "engine" and "step: the model's own forward" in engine.reason
    assert decide(plan, model, n_prompts=2, needed=40, decode="generate").runner == "generate"
    assert decide(plan, model, n_prompts=2, needed=40, batching="static").runner == "generate"
    with pytest.raises(GenerateError, match="stream=True \\(or a streamer\\) on tp=2"):
        planned(plan, 1, stream=True)
    assert planned(plan, 1, decode="generate", stream=True).runner == "generate"  # Transformers' loop streams
    monkeypatch.setattr(model.config, "sliding_window", 8, raising=False)  # a window the engine cannot attend over
    fallback = decide(plan, model, n_prompts=2, needed=40)
    assert fallback.runner == "generate" and "hwrun's engine cannot run LlamaForCausalLM" in fallback.reason
    with pytest.raises(GenerateError, match="decode='graphs' on tp=2: hwrun's engine cannot run LlamaForCausalLM"):
        decide(plan, model, n_prompts=2, needed=40, decode="graphs")
    monkeypatch.delenv("RANK", raising=False)
    assert rank_roles(planned(plan, 1), 1) == (True, False)  # hwrun's engine: printed at the end
    assert rank_roles(planned(plan, 1, decode="generate"), 1) == (True, True)
    monkeypatch.setenv("RANK", "1")
    assert rank_roles(planned(plan, 1, decode="generate"), 1) == (False, False)
