"""`hwrun train --fsdp --fsdp-checkpoint full` on CPU with gloo (issue 37.2: safetensors checkpoints that resume at
another world size, through public settings only: Accelerate's FSDP plugin with state_dict_type FULL_STATE_DICT,
no Trainer method overridden).

With a full state dict Trainer's `save_model` gathers the model (or the adapter) onto rank 0 and writes it with
`save_pretrained`: `model.safetensors` (or `adapter_model.safetensors`) inside `checkpoint-N/`; Accelerate's
`save_fsdp_model` / `save_fsdp_optimizer` add `pytorch_model_fsdp.bin` and `optimizer.bin` (the gathered state dicts,
torch.save), which Trainer's resume reads on rank 0 and broadcasts into the shards of whatever world size resumes.
No `.distcp` file is written.

One launch of two processes (`hwdist launch`, accelerate's CPU gate lifted as in test_hwrun_train_fsdp_cli.py, whose
worker is copied here: test modules are not importable under pytest's importlib mode) runs LoRA for 20 steps, LoRA
stopped at 10 and full fine-tuning for 10; one plain process then resumes the stopped LoRA run at world size 1 to 20
(`--batch-size 2`: the same global batch). Why the curves are comparable, and the tolerance (1e-4 per step, about
100x the measured 9.5e-7): test_hwrun_train_fsdp_cli.py's docstring.
"""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from pathlib import Path

import hwrun
import pytest

WORKER = textwrap.dedent('''
    import json, os, sys
    import accelerate.state as accelerate_state
    from accelerate.utils import DistributedType

    original_init = accelerate_state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):  # accelerate's CPU gate lifted (test_hwrun_train_fsdp_cli.py)
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type in (DistributedType.MULTI_CPU, DistributedType.NO):
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            accelerate_state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    accelerate_state.AcceleratorState.__init__ = init
    import hwrun.training.arguments
    hwrun.training.arguments.FSDP_SUPPORT["cpu"] = True
    from accelerate.state import AcceleratorState, PartialState
    from hwrun.cli.main import main

    base = os.environ.get("MASTER_PORT")
    for index, argv in enumerate(json.loads(sys.argv[1])):
        AcceleratorState._reset_state(True)  # each command ended its process group; the next starts its own
        PartialState._reset_state()
        if base and index:  # on a port of its own, its store hosted by rank 0 (test_hwrun_train_fsdp_cli.py)
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
            os.environ["MASTER_PORT"] = str(int(base) + index)
        assert main(argv) == 0, argv
''')

STEPS = 20
LOSS_TOLERANCE = 1e-4  # absolute, per step (module docstring)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _command(data, out, *extra):
    return ["train", "--data", str(data), "--block-size", "32", "--save-steps", "10", "--lr-scheduler", "constant",
            "--no-progress", "--output", str(out), *extra]


def _launch(root: Path, nproc: int | None, commands: list[list[str]]):
    """The commands in one worker: under `hwdist launch` with `nproc` processes, or (None) one plain process."""
    import os
    import subprocess
    import sys

    from hwrun.testing import launch_cpu_workers

    worker = root / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    if nproc is not None:
        done = launch_cpu_workers(worker, json.dumps(commands), nproc=nproc, timeout=540)
    else:
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
        env.update(OMP_NUM_THREADS="1", HWENV_DEVICE="cpu")
        done = subprocess.run([sys.executable, str(worker), json.dumps(commands)], env=env, capture_output=True,
                              text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _losses(out: Path, step: int = STEPS) -> list[tuple[int, float]]:
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text(encoding="utf-8"))
    return [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]


def _close(losses, reference, steps):
    assert [s for s, _ in losses] == list(steps) == [s for s, _ in reference]
    worst = max(abs(a - b) for (_, a), (_, b) in zip(losses, reference, strict=True))
    assert worst <= LOSS_TOLERANCE, (worst, losses, reference)
    return worst


def _tensors(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """World size 2 (--batch-size 1 per rank), full checkpoints: LoRA for 20 steps, LoRA stopped at 10, full
    fine-tuning for 10. Then one plain process resumes the stopped LoRA run at world size 1 (--batch-size 2) to 20."""
    root = tmp_path_factory.mktemp("fsdp-full-checkpoint")
    text = (Path(hwrun.DEFAULT_MODEL) / "sample_train.txt").read_text(encoding="utf-8")[:9000]
    data = root / "data.txt"
    data.write_text(text, encoding="utf-8")
    lora, full = ["--lora", "--lr", "3e-3", "--fsdp", "--fsdp-checkpoint", "full"], ["--fsdp", "--fsdp-checkpoint",
                                                                                    "full", "--lr", "3e-4"]
    _launch(root, 2, [_command(data, root / "lora", *lora, "--batch-size", "1", "--max-steps", "20"),
                      _command(data, root / "resumed", *lora, "--batch-size", "1", "--max-steps", "10"),
                      _command(data, root / "full", *full, "--batch-size", "1", "--max-steps", "10")])
    alone = _launch(root, None, [_command(data, root / "resumed", *lora, "--batch-size", "2", "--max-steps", "20",
                                          "--resume")])
    assert "resumed from" in alone.stdout and "a process group of 1" in alone.stdout
    return root


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_world_size_2_lora_run_writes_safetensors_checkpoints(runs):
    from hwrun.training import check_checkpoint
    from hwrun.training.checkpoints import MANIFEST_NAME

    run = runs / "lora"
    assert not list(run.rglob("*.distcp")) and not list(run.rglob(".metadata"))
    assert not [p for p in run.iterdir() if p.name.startswith(".staging-")]  # every save was published
    for step in (10, 20):
        checkpoint = run / f"checkpoint-{step}"
        names = sorted(p.name for p in checkpoint.iterdir())
        for name in ("adapter_model.safetensors", "adapter_config.json", "pytorch_model_fsdp.bin", "optimizer.bin",
                     "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json", MANIFEST_NAME):
            assert name in names, (name, names)
        assert not [n for n in names if n.startswith("pytorch_model_fsdp_") or n.startswith("optimizer_")]
        assert check_checkpoint(checkpoint, verify=True) is None  # the manifest's sha256 covers every file
        listed = json.loads((checkpoint / MANIFEST_NAME).read_text(encoding="utf-8"))["files"]
        assert sorted(listed) == [n for n in names if n != MANIFEST_NAME]
        adapter = _tensors(checkpoint / "adapter_model.safetensors")  # whole, under PEFT's names
        assert adapter and all(".lora_A." in n or ".lora_B." in n for n in adapter)
    final = _tensors(run / "adapter_model.safetensors")  # step 20 is the final adapter, gathered the same way
    import torch

    assert sorted(final) == sorted(adapter) and all(torch.equal(final[n], adapter[n]) for n in final)


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_world_size_2_full_checkpoint_resumes_at_world_size_1_on_the_curve(runs):
    resumed = runs / "resumed"
    losses = _losses(resumed)
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))  # steps 1-10 at world size 2, 11-20 at 1
    straight = _losses(runs / "lora")
    _close(losses[:10], straight[:10], range(1, 11))
    _close(losses[10:], straight[10:], range(11, STEPS + 1))  # restored adapter, AdamW state and data position
    assert all(math.isfinite(loss) for _, loss in losses)
    names = sorted(p.name for p in (resumed / "checkpoint-20").iterdir())
    assert "rng_state.pth" in names and "adapter_model.safetensors" in names  # written by the one process
    assert not list(resumed.rglob("*.distcp"))
    from hwrun.training import check_checkpoint

    assert check_checkpoint(resumed / "checkpoint-20", verify=True) is None


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_full_fine_tuning_checkpoint_holds_the_model_as_safetensors(runs):
    """The checkpoint's model.safetensors holds every weight at full shape under the model's names (one file: the
    model is far below save_pretrained's 50GB shard size), equal to the copy Trainer's resume reads
    (pytorch_model_fsdp.bin) and, step 10 being the last, to the final model; it loads with from_pretrained."""
    import torch
    from safetensors.torch import load_file

    checkpoint = runs / "full" / "checkpoint-10"
    assert (checkpoint / "config.json").is_file() and not list(checkpoint.glob("model-*-of-*.safetensors"))
    saved = _tensors(checkpoint / "model.safetensors")
    base = load_file(Path(hwrun.DEFAULT_MODEL) / "model.safetensors")
    # the tied lm_head gathered as a weight of its own (hwrun's final save re-ties it, a checkpoint keeps it)
    assert sorted(saved) == sorted([*base, "lm_head.weight"]) and all(saved[k].shape == base[k].shape for k in base)
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    assert any(not torch.equal(saved[k].to(base[k].dtype), base[k]) for k in base)  # trained
    gathered = torch.load(checkpoint / "pytorch_model_fsdp.bin", weights_only=True)
    assert all(torch.equal(saved[k], gathered[k]) for k in saved)
    final = _tensors(runs / "full" / "model.safetensors")
    assert all(torch.equal(saved[k], final[k]) for k in final)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)  # the checkpoint's own config.json beside it
    assert all(torch.equal(value, saved[name]) for name, value in model.state_dict().items())
    from hwrun.training import check_checkpoint
    from hwrun.training.sharded_checkpoints import fsdp_checkpoint_to_safetensors

    assert check_checkpoint(checkpoint, verify=True) is None
    with pytest.raises(hwrun.errors.CheckpointError, match="already holds the weights as safetensors"):
        fsdp_checkpoint_to_safetensors(checkpoint, runs / "converted")  # nothing to convert
    assert not (runs / "converted").exists()


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_resume_from_the_other_kind_is_refused_before_the_model_loads(runs, tmp_path, monkeypatch, capsys):
    """`--fsdp --resume` (sharded, the default) on a run whose checkpoints are full: refused naming the fix, before
    the data is read or the model loads (or a process group starts), and nothing in the folder changes."""
    from hwrun.cli.main import main
    from hwrun.training.checkpoints import sha256_of

    out = tmp_path / "run"
    shutil.copytree(runs / "lora", out, ignore=shutil.ignore_patterns("checkpoint-10"))
    before = {p: sha256_of(p) for p in out.rglob("*") if p.is_file()}
    for name in RANK_VARIABLES:
        monkeypatch.setenv(name, "x")  # recorded, so the values the CLI sets for its group of one are undone
        monkeypatch.delenv(name)
    monkeypatch.setattr("hwrun.training.run._prepare_data",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("the data was read")))
    monkeypatch.setattr("hwrun.training.run._load_model",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model loaded")))
    code = main(_command(runs / "data.txt", out, "--lora", "--lr", "3e-3", "--fsdp", "--batch-size", "2",
                         "--max-steps", "30", "--resume"))
    error = capsys.readouterr().err
    assert code == 2, error
    assert "is a 'full' FSDP checkpoint (pytorch_model_fsdp.bin)" in error and "--fsdp-checkpoint full" in error
    assert {p: sha256_of(p) for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("argv, named", [
    (["--fsdp", "--fsdp-checkpoint", "gathered"], "--fsdp-checkpoint gathered is not a kind of FSDP checkpoint"),
    (["--fsdp-checkpoint", "full"], "--fsdp-checkpoint full without --fsdp"),
])
def test_the_cli_refuses_a_bad_fsdp_checkpoint_before_any_work(argv, named, tmp_path, monkeypatch, capsys):
    from hwrun.cli.main import main

    monkeypatch.setattr("hwrun.training.train_plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("planned")))
    code = main(["train", "--data", str(tmp_path / "none.txt"), "--output", str(tmp_path / "out"), *argv])
    error = capsys.readouterr().err
    assert code == 2 and named in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keywords, named", [
    ({"fsdp_checkpoint": "gathered", "fsdp": True}, "fsdp_checkpoint='gathered' (must be 'sharded' or 'full'"),
    ({"fsdp_checkpoint": "full"}, "fsdp_checkpoint='full' without fsdp="),
    ({"fsdp_checkpoint": "full", "fsdp": True, "fsdp_config": {"state_dict_type": "SHARDED_STATE_DICT"}},
     "fsdp_config says state_dict_type=SHARDED_STATE_DICT"),
])
def test_train_refuses_a_bad_fsdp_checkpoint_before_any_work(keywords, named, tmp_path):
    from hwrun.errors import TrainingConfigError

    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError) as refused:
        hwrun.train(plan, tmp_path / "none.txt", output_dir=tmp_path / "out", **keywords)
    assert named in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_fsdp_checkpoint_sets_the_state_dict_type():
    from hwrun.training.sharding import FSDP_CONFIG, with_fsdp_checkpoint

    given = {"fsdp": True, "fsdp_config": {"fsdp_version": 2}}
    assert with_fsdp_checkpoint(None, given) == given  # Transformers' default (FULL_STATE_DICT) left alone
    assert with_fsdp_checkpoint("full", given)["fsdp_config"] == {"fsdp_version": 2,
                                                                  "state_dict_type": "FULL_STATE_DICT"}
    assert given["fsdp_config"] == {"fsdp_version": 2}  # not changed in place
    assert with_fsdp_checkpoint("sharded", {"fsdp": True})["fsdp_config"] == {"state_dict_type": "SHARDED_STATE_DICT"}
    assert FSDP_CONFIG["state_dict_type"] == "SHARDED_STATE_DICT"  # --fsdp's default (README: why)
