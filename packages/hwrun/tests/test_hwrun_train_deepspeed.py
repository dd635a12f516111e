"""DeepSpeed ZeRO through `hwrun.train(..., deepspeed=config)`: 2 CPU processes (gloo) under
`hwdist launch`, DeepSpeed's CPU accelerator, no gate lifted.

ZeRO-2 LoRA trains with DeepSpeed's ZeRO optimizer and saves the adapter. ZeRO-3 partitions the
weights while they load (hwrun drops the plan's device_map for it, which Transformers refuses
under ZeRO-3) and gathers them for the final save: full fine-tuning matches a plain DDP run of the
same settings (losses and weights), merge=True gives base + adapter, resume='auto' continues the
uninterrupted loss curve. A ZeRO-3 config that would leave only shards to save is refused first."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

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
)
from hwrun.training import TrainingConfigError

WORKER = textwrap.dedent('''
    import json, os, sys
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator, comm over gloo
    import deepspeed
    import deepspeed.ops

    # DeepSpeed's CPU backend JIT-compiles its shared-memory all-reduce at start, a C++ op that only inference's
    # tensor parallelism calls (inference_all_reduce); ZeRO's collectives go through torch.distributed (gloo) either
    # way. torch caches the build per source path, so each new venv or clone built it again: ~90 s of the 2 cores in
    # a clean clone's `uv run pytest` (2026-12-06). Marked unbuildable, as on a host without a compiler (issue 40.2).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    import hwdist, hwrun
    from safetensors.torch import save_file
    from transformers import TrainerCallback
    from transformers.integrations import is_deepspeed_zero3_enabled

    # argv: model, data, then a JSON list of runs {"out": folder, "options": train() keywords}, done in order;
    # options {"cli": argv} run `hwrun ARGV` through the CLI's main() instead; "files": a prefix for the files below
    # (a run resumed later into the same folder keeps its first half's)
    model, data, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    rank = int(os.environ["RANK"])
    for run in runs:
        out, options, captured = run["out"], dict(run["options"]), {}
        files = options.pop("files", "")
        if "cli" in options:
            from accelerate.state import AcceleratorState, PartialState
            from hwrun.cli.main import main

            AcceleratorState._reset_state(True)  # each run ended its process group; the command starts its own
            PartialState._reset_state()
            assert main(options["cli"]) == 0, options["cli"]
            continue

        class Capture(TrainerCallback):
            def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
                captured["optimizer"] = type(getattr(optimizer, "optimizer", optimizer)).__name__
                trainable = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
                captured["partitioned"] = all(hasattr(p, "ds_id") for _, p in trainable)
                # ZeRO-3 ranks hold shards: gather them (a collective, every rank) to compare whole weights
                with deepspeed.zero.GatheredParameters([p for _, p in trainable], modifier_rank=None):
                    captured["state"] = {k: p.detach().clone().contiguous() for k, p in trainable}
                captured["world"] = args.world_size

        plan = hwrun.plan(model, device="cpu")
        result = hwrun.train(plan, data, output_dir=out, disable_tqdm=True, plot=False, save_steps=3,
                             callbacks=[Capture()], **options)
        save_file(captured["state"], os.path.join(out, f"{files}rank{rank}.safetensors"))
        with open(os.path.join(out, f"{files}rank{rank}.json"), "w") as handle:
            json.dump({"world": captured["world"], "step": result.global_step, "losses": result.losses,
                       "merged": result.merged, "resumed_from": result.resumed_from, "reasons": result.reasons,
                       "optimizer": captured["optimizer"], "partitioned": captured["partitioned"],
                       "zero3_flag_after": is_deepspeed_zero3_enabled()}, handle)
    hwdist.shutdown(adopted=True)  # destroy Trainer's gloo group before exit
''')

ZERO2 = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto",
         "gradient_accumulation_steps": "auto", "train_batch_size": "auto", "gradient_clipping": "auto"}
ZERO3 = {**ZERO2, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}
LORA = {"lora": True, "max_steps": 3, "lr": 3e-3, "batch_size": 2, "block_size": 32}
FULL = {**LORA, "lora": None, "lr": 3e-4}
CONSTANT = {"lr_scheduler_type": "constant"}  # changing max_steps then leaves the schedule alone


def launch(root, *runs):
    done = launch_worker_runs(WORKER, root, hwrun.DEFAULT_MODEL, root / "train.txt", list(runs))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def cli_command(root) -> list[str]:
    """`hwrun train --deepspeed zero3` (full fine-tuning, 3 steps) into root/cli-zero3."""
    return ["train", "--data", str(root / "train.txt"), "--max-steps", "3", "--save-steps", "3", "--batch-size", "2",
            "--block-size", "32", "--no-progress", "--deepspeed", "zero3", "--lr", "3e-4", "--output",
            str(root / "cli-zero3")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch, in order: full fine-tuning with plain DDP (the reference) and with ZeRO-3, LoRA
    with ZeRO-2, LoRA + merge with ZeRO-3, ZeRO-3 full fine-tuning for 3 steps (its files kept as
    `first-rank*`), for 6 steps straight, the 3-step run resumed to 6, then `hwrun train --deepspeed
    zero3` through the CLI. (One launch serves every test: each is ~20 s of two processes importing
    torch, Transformers and DeepSpeed on 2 cores, more than its runs; the resumed run builds its model,
    engine and optimizer anew and takes its weights, optimizer partitions and step from checkpoint-3
    alone, like any run of the launch after the first; issue 40.2.) Returns the folder and the launch's
    stdout."""
    root = tmp_path_factory.mktemp("deepspeed")
    (root / "train.txt").write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    resumed = root / "zero3-resumed"
    done = launch(root, (root / "ddp-full", FULL), (root / "zero3-full", {**FULL, "deepspeed": ZERO3}),
                  (root / "zero2-lora", {**LORA, "deepspeed": ZERO2}),
                  (root / "zero3-merge", {**LORA, "merge": True, "deepspeed": ZERO3}),
                  (resumed, {**FULL, **CONSTANT, "deepspeed": ZERO3, "files": "first-"}),
                  (root / "zero3-straight", {**FULL, **CONSTANT, "max_steps": 6, "deepspeed": ZERO3}),
                  # overwrite=True: the first half's workers wrote first-rank{r}.* there, files that are not hwrun's
                  (resumed, {**FULL, **CONSTANT, "max_steps": 6, "resume": "auto", "deepspeed": ZERO3,
                             "overwrite": True}),
                  (root / "cli-zero3", {"cli": cli_command(root)}))  # last: a train() run after it hung (seen once)
    first = [json.loads((resumed / f"first-rank{r}.json").read_text()) for r in range(2)]
    assert all(i["step"] == 3 and i["resumed_from"] is None for i in first), first
    return root, done.stdout


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_zero2_lora_trains_with_deepspeeds_optimizer_and_saves_the_adapter(runs):
    import torch
    from hwrun.training import check_checkpoint

    out = runs[0] / "zero2-lora"
    info, (rank0, rank1) = rank_outputs(out)
    assert all(i["world"] == 2 and i["step"] == 3 and i["optimizer"] == "DeepSpeedZeroOptimizer" for i in info)
    assert all(not i["partitioned"] and "sharding" not in i["reasons"] for i in info)  # ZeRO-2 keeps whole weights
    losses = [loss for _, loss in info[0]["losses"]]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert_same_on_both_ranks(rank0, rank1)
    assert any(torch.count_nonzero(v) for k, v in rank0.items() if "lora_B" in k)  # it trained
    assert_adapter_matches(out, rank0)
    assert check_checkpoint(out / "checkpoint-3") is None


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_zero3_full_fine_tuning_matches_plain_ddp_and_saves_the_whole_model(runs):
    from hwrun.training import check_checkpoint

    out = runs[0] / "zero3-full"
    info, (rank0, rank1) = rank_outputs(out)
    reference, (ddp, _) = rank_outputs(runs[0] / "ddp-full")
    assert all(i["optimizer"] == "DeepSpeedZeroOptimizer_Stage3" and i["partitioned"] for i in info)
    assert all("ZeRO-3" in i["reasons"]["sharding"] and "device_map" in i["reasons"]["sharding"] for i in info)
    assert not any(i["zero3_flag_after"] for i in info)  # later loads in the process get whole weights
    assert all(i["optimizer"] == "AdamW" and not i["partitioned"] for i in reference)  # the reference is plain DDP
    assert_same_on_both_ranks(rank0, rank1)  # gathered from the two ranks' partitions
    assert_same_training(info[0]["losses"], reference[0]["losses"], rank0, ddp, steps=3)
    assert_saved_full_model(out, rank0)
    assert check_checkpoint(out / "checkpoint-3") is None


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_zero3_merge_saves_a_plain_model_equal_to_base_plus_adapter(runs):
    out = runs[0] / "zero3-merge"
    info, (rank0, rank1) = rank_outputs(out)
    assert all(i["merged"] and i["partitioned"] for i in info)
    assert_same_on_both_ranks(rank0, rank1)
    assert_merged_is_base_plus_adapter(out, rank0)  # through the gathered adapter, saved first


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_zero3_resume_continues_the_uninterrupted_loss_curve(runs):
    out = runs[0] / "zero3-resumed"
    resumed, (rank0, rank1) = rank_outputs(out)
    straight, (reference, _) = rank_outputs(runs[0] / "zero3-straight")
    assert all(i["resumed_from"] == str(out / "checkpoint-3") and i["step"] == 6 and i["partitioned"] for i in resumed)
    assert_same_on_both_ranks(rank0, rank1)
    assert_same_training(resumed[0]["losses"], straight[0]["losses"], rank0, reference, steps=6)


@pytest.fixture()
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the option was rejected")

    monkeypatch.setattr("hwrun.training.run._load_model", refuse)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def test_zero3_without_gathered_save_is_refused_before_the_model_loads(tmp_path, no_model_load):
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    config = {**ZERO3, "zero_optimization": {"stage": 3}}
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(plan, data, lora=True, max_steps=2, block_size=32, output_dir=tmp_path / "out",
                    plot=False, deepspeed=config)
    message = str(caught.value)
    assert message.startswith("deepspeed={") and "ZeRO stage 3" in message
    from transformers.integrations import is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()  # no ZeRO-3 flag left for later loads in this process
    assert "stage3_gather_16bit_weights_on_model_save" in message and "use stage 2" in message
    assert not (tmp_path / "out").exists()


def test_zero3_from_accelerate_launch_is_checked_the_same_way(tmp_path, no_model_load, monkeypatch):
    # `accelerate launch --use_deepspeed --zero_stage 3` without --zero3_save_16bit_model: no deepspeed=
    # keyword, TrainingArguments builds the plugin from these variables
    for name, value in {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                        "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "false"}.items():
        monkeypatch.setenv(name, value)
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError, match=r"accelerate's DeepSpeed plugin .* ZeRO stage 3 .*"
                       r"--zero3_save_16bit_model true"):
        hwrun.train(plan, data, lora=True, max_steps=2, block_size=32, output_dir=tmp_path / "out", plot=False)
    assert not (tmp_path / "out").exists()
    from transformers.integrations import is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_cli_deepspeed_zero3_at_world_size_2(runs):
    """`hwrun train --deepspeed zero3` (full fine-tuning) through the CLI under `hwdist launch` (2 CPU processes, the
    last command of the module's first launch): a checkpoint that verifies and the final model gathered into one
    safetensors file (zero2 and LoRA: the same configs through train(deepspeed=...) above; the flag's mapping:
    test_hwrun_train_sharding_flags.py)."""
    from hwrun.training import check_checkpoint

    root, stdout = runs
    assert stdout.count("done: 3 steps") == 1, stdout[-3000:]  # rank 0 prints, rank 1 is quiet
    assert check_checkpoint(root / "cli-zero3" / "checkpoint-3", verify=True) is None
    from safetensors.torch import load_file

    saved = load_file(root / "cli-zero3" / "model.safetensors")
    base = load_file(Path(hwrun.DEFAULT_MODEL) / "model.safetensors")
    assert saved.keys() == base.keys() and all(saved[k].shape == base[k].shape for k in base)  # whole, not shards
