"""FSDP and DeepSpeed through `hwrun.train(..., **training_overrides)` on CPU.

accelerate 1.16 drops an FSDP plugin under MULTI_CPU (use_cpu, gloo) and trains plain DDP instead,
so hwrun refuses fsdp= on CPU before the model loads; deepspeed= without the deepspeed package is
refused the same way. The FSDP2 path itself (torch's fully_shard, which does run on CPU with gloo)
is still exercised for real: a 2-process `hwdist launch` run, as in test_hwrun_train_ddp.py, whose
worker lifts accelerate's CPU gate: LoRA saves the adapter gathered from the shards, full fine-tuning
the whole model in one safetensors file, merge=True a plain model equal to base + adapter, and
resume='auto' continues the uninterrupted loss curve; weights are equal on both ranks throughout. These runs keep
Transformers' default FULL_STATE_DICT (no fsdp_checkpoint=): their checkpoints hold the weights only as
safetensors, and the resume loads exactly those tensors (no pickle of the weights is written)."""

from __future__ import annotations

import importlib.util
import math
import textwrap

import hwenv
import hwrun
import pytest
from hwrun.testing import (
    assert_adapter_matches,
    assert_merged_is_base_plus_adapter,
    assert_same_on_both_ranks,
    assert_same_training,
    assert_saved_full_model,
    launch_worker_runs,
    rank_outputs,
    relaunch_after_gloo_abort,
)
from hwrun.training import TrainingConfigError, training_keywords

WORKER = textwrap.dedent('''
    import json, os, sys
    import accelerate.state as accelerate_state
    from accelerate.utils import DistributedType

    # accelerate keeps an FSDP plugin only for GPU-like process groups; record what it does on CPU,
    # then switch the state to FSDP as it does for cuda/xpu/hpu, so fully_shard really runs here.
    seen = {}
    original_init = accelerate_state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            seen["accelerate_kept_fsdp_on_cpu"] = getattr(self, "fsdp_plugin", None) is not None
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            accelerate_state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    accelerate_state.AcceleratorState.__init__ = init

    import hwrun
    import hwrun.training.arguments
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor
    from transformers import TrainerCallback

    hwrun.training.arguments.FSDP_SUPPORT["cpu"] = True  # the gate is lifted above
    # argv: model, data, then a JSON list of runs {"out": folder, "options": train() keywords}, done in order
    model, data, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    rank = int(os.environ["RANK"])
    for run in runs:
        out, options, captured = run["out"], run["options"], {}

        class Capture(TrainerCallback):
            def on_train_end(self, args, state, control, model=None, **kwargs):
                captured["types"] = sorted({type(p).__name__ for p in model.parameters()})
                # full_tensor() is a collective: both ranks gather every trainable shard
                captured["state"] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                                     for k, v in model.named_parameters() if v.requires_grad}
                captured["world"] = args.world_size

            def on_epoch_begin(self, args, state, control, model=None, **kwargs):
                # a resumed run, before its first step: what Trainer loaded from the checkpoint (a collective)
                if state.global_step and "loaded" not in captured:
                    captured["loaded"] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                                          for k, v in model.named_parameters() if v.requires_grad}

        plan = hwrun.plan(model, device="cpu")
        result = hwrun.train(plan, data, output_dir=out, disable_tqdm=True, plot=False, callbacks=[Capture()],
                             fsdp=True, fsdp_config={"fsdp_version": 2}, **options)
        save_file(captured["state"], os.path.join(out, f"rank{rank}.safetensors"))
        if "loaded" in captured:
            save_file(captured["loaded"], os.path.join(out, f"rank{rank}-loaded.safetensors"))
        with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
            json.dump({"world": captured["world"], "step": result.global_step, "losses": result.losses,
                       "types": captured["types"], "resumed_from": result.resumed_from,
                       "merged": result.merged, **seen}, handle)
    import hwdist
    hwdist.shutdown(adopted=True)  # destroy Trainer's gloo group before exit (gloo can abort at exit otherwise)
''')


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    return path


@pytest.fixture()
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the option was rejected")

    monkeypatch.setattr("hwrun.training.run._load_model", refuse)


@pytest.mark.parametrize("fsdp", [
    {"fsdp": True, "fsdp_config": {"fsdp_version": 2}},
    {"fsdp": "full_shard", "fsdp_config": {"fsdp_version": 2}},
    {"fsdp": ["full_shard", "auto_wrap"]},
])
def test_fsdp_on_cpu_is_refused_before_the_model_loads(tmp_path, data, no_model_load, fsdp):
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(plan, data, lora=True, max_steps=2, block_size=32, output_dir=tmp_path / "out",
                    plot=False, **fsdp)
    message = str(caught.value)
    assert f"fsdp={fsdp['fsdp']!r}" in message and "accelerate" in message and "plain DDP" in message
    assert "hwdist launch" in message and "cuda, xpu or hpu" in message  # what to do instead
    assert not (tmp_path / "out").exists()


def test_fsdp_passes_on_accelerators_and_is_refused_for_use_cpu(tmp_path):
    cuda = hwrun.plan(hwrun.DEFAULT_MODEL, device=hwenv.Accelerator("cuda", 2, capability=(9, 0)))
    keywords = training_keywords(cuda, tmp_path, fsdp=True, fsdp_config={"fsdp_version": 2})
    assert keywords["fsdp"] is True and keywords["fsdp_config"] == {"fsdp_version": 2}
    assert "fsdp" not in training_keywords(cuda, tmp_path)
    assert training_keywords(cuda, tmp_path, fsdp=False)["fsdp"] is False  # off is not refused
    with pytest.raises(TrainingConfigError, match=r"fsdp=True cannot shard on cpu"):
        training_keywords(cuda, tmp_path, fsdp=True, use_cpu=True)  # use_cpu trains on CPU


@pytest.mark.parametrize("deepspeed", ["ds_zero2.json", {"zero_optimization": {"stage": 2}}])
def test_deepspeed_without_the_package_is_refused_before_anything_loads(tmp_path, data, monkeypatch,
                                                                        no_model_load, deepspeed):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "deepspeed" else real_find_spec(name, *a))
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(plan, data, lora=True, max_steps=2, block_size=32, output_dir=tmp_path / "out",
                    plot=False, deepspeed=deepspeed)
    message = str(caught.value)
    assert f"deepspeed={deepspeed!r}" in message and "not installed" in message
    assert "pip install deepspeed" in message and "fsdp=True" in message
    assert not (tmp_path / "out").exists()


LORA = {"lora": True, "max_steps": 3, "lr": 3e-3, "batch_size": 2, "block_size": 32}


def launch_fsdp(tmp_path, data, *runs):
    """One 2-process `hwdist launch` of WORKER doing `runs` ((out, train() options), in order). A rank killed by
    SIGABRT inside gloo (no Python error: the C++ TCP transport aborted, its peer then reading "connection reset") is
    launched once more from empty output folders, with a warning that keeps the first launch's lines: it happened in
    2 of ~10 CI runs on 2026-12-06, only in the oldest-pair step (transformers 5.22.2) with both workers busy, never in
    a dozen runs of this file alone (the family of torch PR #179291); any other failure, a second abort, or an abort
    of a launch that resumes (its folders hold what it resumes from) fails."""
    def launch():
        return launch_worker_runs(WORKER, tmp_path, hwrun.DEFAULT_MODEL, data, list(runs))

    fresh = not any(options.get("resume") for _, options in runs)
    done = relaunch_after_gloo_abort(launch, [out for out, _ in runs]) if fresh else launch()
    assert done.returncode == 0, _failure(done)


def _failure(done) -> str:
    """The launch's output tails, plus every line of rank 0's or an abort's own words: one rank's long traceback
    (a peer's "connection reset") otherwise pushes the first failing rank's message out of the tail (CI at 15:36
    on 2026-12-06 lost a rank-0 SIGABRT's cause that way)."""
    marks = ("[rank0]", "terminate called", "Aborted", "what():", "Error", "error_file")
    firsts = [line for line in (done.stdout + done.stderr).splitlines()
              if any(mark in line for mark in marks) and "[rank1]" not in line][:40]
    return "\n".join(["first error lines:", *firsts, "tails:", done.stdout[-3000:], done.stderr[-3000:]])


def assert_sharded(info, *, steps):
    """Both ranks of a 2-process run trained `steps` steps on sharded parameters (DTensors only)."""
    assert all(i["world"] == 2 and i["step"] == steps and i["types"] == ["DTensor"] for i in info), info


#: The resume test's two modes (a constant LR, so that changing max_steps does not change the schedule).
RESUME_MODES = {"lora": {**LORA, "lr_scheduler_type": "constant"},
                "full": {**LORA, "lora": None, "lr": 3e-4, "lr_scheduler_type": "constant"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 2-process launches serve every test below (each launch is ~30 s of two processes starting on 2 cores,
    far more than its 3-step runs; issue 40.2). The first, in order: LoRA into lora/, full fine-tuning into full/,
    LoRA with merge=True into merged/, then for the resume test each mode 6 steps straight and 3 steps into
    MODE-resumed/; the second launch resumes MODE-resumed/ to 6 steps (a new process, as after a real stop)."""
    root = tmp_path_factory.mktemp("fsdp")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    launch_fsdp(root, data, (root / "lora", LORA), (root / "full", {**LORA, "lora": None, "lr": 3e-4}),
                (root / "merged", {**LORA, "merge": True}),
                *[(root / f"{mode}-straight", {**o, "max_steps": 6}) for mode, o in RESUME_MODES.items()],
                *[(root / f"{mode}-resumed", o) for mode, o in RESUME_MODES.items()])
    first = {mode: rank_outputs(root / f"{mode}-resumed")[0] for mode in RESUME_MODES}  # before the resume
    # overwrite=True: the first launch's workers wrote rank{r}.json/.safetensors into the folder, files hwrun's
    # own record does not list (they stay as they are)
    launch_fsdp(root, data, *[(root / f"{mode}-resumed", {**o, "max_steps": 6, "resume": "auto", "overwrite": True})
                              for mode, o in RESUME_MODES.items()])
    return root, first


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_two_process_fsdp2_lora_saves_the_gathered_adapter(runs):
    import torch
    from hwrun.training import check_checkpoint

    out = runs[0] / "lora"
    info, (rank0, rank1) = rank_outputs(out)
    # If this fails, accelerate now builds FSDP on CPU: set FSDP_SUPPORT["cpu"] to True.
    assert all(i["accelerate_kept_fsdp_on_cpu"] is False for i in info)
    assert_sharded(info, steps=3)
    assert all(len(i["losses"]) == 3 and all(math.isfinite(loss) for _, loss in i["losses"]) for i in info)
    assert_same_on_both_ranks(rank0, rank1)
    assert any("lora_B" in k for k in rank0)
    assert any(torch.count_nonzero(v) for k, v in rank0.items() if "lora_B" in k)  # it trained

    assert_adapter_matches(out, rank0)  # the whole gathered adapter, not one rank's shard
    assert check_checkpoint(out / "checkpoint-3") is None  # the FSDP checkpoint is complete


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_two_process_fsdp2_full_fine_tuning_saves_the_whole_model(runs):
    from hwrun.training import check_checkpoint

    out = runs[0] / "full"
    info, (rank0, rank1) = rank_outputs(out)
    assert_sharded(info, steps=3)
    assert all(not i["merged"] and all(math.isfinite(loss) for _, loss in i["losses"]) for i in info)
    assert_same_on_both_ranks(rank0, rank1)  # every parameter trainable, gathered, equal on both ranks

    # One plain safetensors file with the base model's tensors at full shape; a tied lm_head is
    # stored once, as without FSDP (gathering copies it apart from embed_tokens).
    assert_saved_full_model(out, rank0)
    assert check_checkpoint(out / "checkpoint-3") is None


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_two_process_fsdp2_merge_saves_a_plain_model_equal_to_base_plus_adapter(runs):
    out = runs[0] / "merged"
    info, (rank0, rank1) = rank_outputs(out)
    assert_sharded(info, steps=3)
    assert all(i["merged"] for i in info)  # TrainResult.merged on both ranks
    assert_same_on_both_ranks(rank0, rank1)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists() and not (out / "adapter_model.safetensors").exists()
    assert "hwattn_causal_sdpa" not in (out / "config.json").read_text()

    # Under FSDP the merge goes through the gathered adapter, saved in out/adapter: that adapter is
    # the trained one, and the merged model computes what base + that adapter computes.
    assert_merged_is_base_plus_adapter(out, rank0)


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_two_process_fsdp2_resume_continues_the_uninterrupted_loss_curve(runs):
    """First launch: 3 steps (checkpoint-3) and, for reference, 6 uninterrupted steps; second launch:
    resume='auto' to max_steps=6. LoRA and full fine-tuning. A constant LR, so that changing
    max_steps does not change the schedule; the losses after the resume then depend only on the
    restored weights, AdamW state, RNG and data position."""
    root, first = runs
    for mode in RESUME_MODES:
        assert all(i["step"] == 3 and i["resumed_from"] is None for i in first[mode]), mode
        out = root / f"{mode}-resumed"
        resumed, (rank0, rank1) = rank_outputs(out)
        straight, (reference, _) = rank_outputs(root / f"{mode}-straight")
        assert all(i["resumed_from"] == str(out / "checkpoint-3") and i["step"] == 6 for i in resumed), mode
        assert all(i["types"] == ["DTensor"] for i in resumed + straight), mode  # sharded, both launches
        assert_same_on_both_ranks(rank0, rank1)
        # the losses and final weights of the run that was never stopped
        assert_same_training(resumed[0]["losses"], straight[0]["losses"], rank0, reference, steps=6)
        assert_resumed_from_the_safetensors(out, mode)


def assert_resumed_from_the_safetensors(out, mode):
    """checkpoint-3 (FULL_STATE_DICT, written at world size 2) holds the weights once, as save_pretrained's
    safetensors, and no pickle of them (Accelerate's pytorch_model_fsdp.bin); what both ranks held after the resume,
    before its first step, is exactly those tensors: the model's under its own names, the adapter's under PEFT's."""
    import torch
    from hwrun.training import check_checkpoint
    from safetensors.torch import load_file

    checkpoint = out / "checkpoint-3"
    assert check_checkpoint(checkpoint, verify=True) is None
    # the pickles left are Trainer's and Accelerate's non-weight states: arguments, AdamW (full_checkpoints.py)
    assert sorted(p.name for p in checkpoint.glob("*.bin")) == ["optimizer.bin", "training_args.bin"], mode
    assert not (checkpoint / "pytorch_model_fsdp_0").exists()  # not a sharded checkpoint either
    saved = load_file(checkpoint / ("model.safetensors" if mode == "full" else "adapter_model.safetensors"))
    for rank in (0, 1):
        loaded = load_file(out / f"rank{rank}-loaded.safetensors")
        as_saved = {name.replace(".default.", ".") if mode == "lora" else name: value for name, value in loaded.items()}
        # every saved tensor but a tied lm_head (named_parameters names it once, as embed_tokens)
        assert as_saved and set(saved) - set(as_saved) <= {"lm_head.weight"}, (mode, sorted(set(saved) - set(as_saved)))
        assert set(as_saved) <= set(saved), (mode, sorted(set(as_saved) - set(saved))[:4])
        assert all(torch.equal(value, saved[name]) for name, value in as_saved.items()), (mode, rank)
    final = load_file(out / "rank0.safetensors")  # and step 6 moved on from there
    assert any(not torch.equal(final[name], loaded[name]) for name in loaded), mode
