"""`hwrun train --fsdp` through `hwdist launch` on CPU with gloo (issue 37.2): FSDP2 LoRA and full fine-tuning at
world size 2 follow the single-process curve over 20 steps, and a world-size-2 sharded checkpoint resumes at world
size 1 on the curve of the run that was never stopped.

accelerate 1.16 builds FSDP only for GPU-like process groups (on CPU it would train plain DDP, so hwrun refuses
--fsdp on a CPU plan, see test_hwrun_train_fsdp.py); the worker lifts that gate, as test_hwrun_train_fsdp.py's does,
and then runs the real CLI (`hwrun.cli.main.main(argv)`) for each command.

Why the runs are comparable: at world size 2 each rank takes --batch-size 1 of the global batch and FSDP averages
the gradients over the ranks (reduce-scatter, then mean); the single process takes --batch-size 2. Accelerate's
seedable sampler gives both the same permutation of blocks, so step k sees the same two blocks in both runs, every
block has the same number of labelled tokens (plain text, packed), and the logged loss (the ranks' mean) equals the
single process's mean. What differs is the order of float32 additions (two partial sums vs one): ~1e-7 relative per
reduction (a float32 ulp at a loss of 4-7 is 5e-7), then carried through AdamW, whose first steps move every weight by
about lr whatever the gradient's size, so a weight whose gradient is near zero may step either way. Measured on the
2-core development machine (2026-12-06) over 20 steps: at most 1.4e-6 apart (LoRA, lr 3e-3), 9.5e-7 (full, lr 3e-4),
9.5e-7 (the resume), i.e. 2-3 ulps. The tolerance is 1e-4 absolute per step (the one hwrun.testing's
assert_same_training uses for DDP and ZeRO-3): 70x what was measured, room for another CPU's summation order and
thread count, while a wrong batch or a missed gradient average (a loss off by the ranks' spread, 1e-1 and more
here) or a lost optimizer state on resume (1e-2 and more) is far beyond it.

`--fsdp-checkpoint full` (the same launches): Accelerate's FSDP plugin with state_dict_type FULL_STATE_DICT. Trainer's
`save_model` gathers the model (or the adapter) onto rank 0 and writes it with `save_pretrained` (`model.safetensors` /
`adapter_model.safetensors` inside `checkpoint-N/`), the only copy of the weights: hwrun.training.full_checkpoints
keeps Accelerate from adding its pickle of them (`pytorch_model_fsdp.bin`), and the resume reads the safetensors on
rank 0 and hands them out across whatever world size resumes; the AdamW state is Accelerate's `optimizer.bin`; no
`.distcp` file. Its resumed LoRA run is compared with the sharded run that was never stopped (the same training: the
checkpoint kind changes what is written, not the steps); with no other copy of the adapter in the checkpoint, a
resume on that curve read the safetensors.
"""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from pathlib import Path

import hwrun
import pytest
from hwrun.testing import assert_losses_close, checkpoint_losses, run_cli_worker

WORKER = textwrap.dedent('''
    import json, sys
    import accelerate.state as accelerate_state
    from accelerate.utils import DistributedType

    original_init = accelerate_state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):  # accelerate's CPU gate lifted (module docstring)
        original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type in (DistributedType.MULTI_CPU, DistributedType.NO):
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            accelerate_state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    accelerate_state.AcceleratorState.__init__ = init
    import hwrun.training.arguments
    hwrun.training.arguments.FSDP_SUPPORT["cpu"] = True
    from hwrun.cli.main import main

    import os
    from accelerate.state import AcceleratorState, PartialState

    base = os.environ.get("MASTER_PORT")
    for index, argv in enumerate(json.loads(sys.argv[1])):
        AcceleratorState._reset_state(True)  # each command ended its process group; the next starts its own ...
        PartialState._reset_state()
        if base and index:  # ... with a store of its own on its own port, hosted by rank 0: in torchrun's agent
            # store a second group of the same name met keys of the first and hung (a rank ending first raced ahead)
            os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
            os.environ["MASTER_PORT"] = str(int(base) + index)
        assert main(argv) == 0, argv
''')

STEPS = 20
LOSS_TOLERANCE = 1e-4  # absolute, per step (module docstring)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _launch(root: Path, nproc: int | None, commands: list[list[str]]):  # hwrun.testing.run_cli_worker's doc
    # a launch of fresh runs (none resumes) is launched once more after a rank's SIGABRT inside gloo (the CI's
    # oldest-pair step at 00:21 on 2026-12-07: "malloc(): unaligned tcache chunk detected" in rank 0's checkpoint save)
    fresh = None if any("--resume" in c for c in commands) else [c[c.index("--output") + 1] for c in commands]
    return run_cli_worker(root, WORKER, commands, nproc, fresh_outputs=fresh if nproc else None)


def _close(losses, reference, steps):
    return assert_losses_close(losses, reference, steps, LOSS_TOLERANCE)


def _refuse_work_after_the_check(out: Path, monkeypatch) -> dict:
    """For a resume that must be refused before the model loads: the sha256 of every file in `out` (to compare after),
    no rank variables (recorded, so the values the CLI sets for its group of one are undone), and a model load that
    fails the test."""
    from hwrun.training.checkpoints import sha256_of

    for name in RANK_VARIABLES:
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.setattr("hwrun.training.run._load_model",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model loaded")))
    return {p: sha256_of(p) for p in out.rglob("*") if p.is_file()}


def _command(data, out, *extra):
    return ["train", "--data", str(data), "--block-size", "32", "--save-steps", "10", "--lr-scheduler", "constant",
            "--no-progress", "--output", str(out), *extra]



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """World size 2 (--fsdp, --batch-size 1 per rank): LoRA and full fine-tuning for 20 steps, LoRA stopped at 10
    steps, and with --fsdp-checkpoint full LoRA stopped at 10 and full fine-tuning for 10 (twice: full-ft is kept as
    written, full-ft-resumed resumes). Then one plain process (no launcher): the same two runs without FSDP at
    --batch-size 2, both 10-step LoRA runs and full-ft-resumed resumed with --fsdp to 20 (the CLI forms its process
    group of one)."""
    root = tmp_path_factory.mktemp("fsdp-cli")
    text = (Path(hwrun.DEFAULT_MODEL) / "sample_train.txt").read_text(encoding="utf-8")[:9000]
    data = root / "data.txt"
    data.write_text(text, encoding="utf-8")
    lora, full = ["--lora", "--lr", "3e-3"], ["--lr", "3e-4"]
    gathered = ["--fsdp", "--fsdp-checkpoint", "full"]  # safetensors checkpoints (FULL_STATE_DICT)
    _launch(root, 2, [_command(data, root / "fsdp-lora", *lora, "--fsdp", "--batch-size", "1", "--max-steps", "20"),
                      _command(data, root / "fsdp-full", *full, "--fsdp", "--batch-size", "1", "--max-steps", "20"),
                      _command(data, root / "resumed", *lora, "--fsdp", "--batch-size", "1", "--max-steps", "10"),
                      _command(data, root / "full-resumed", *lora, *gathered, "--batch-size", "1", "--max-steps", "10"),
                      _command(data, root / "full-ft", *full, *gathered, "--batch-size", "1", "--max-steps", "10"),
                      _command(data, root / "full-ft-resumed", *full, *gathered, "--batch-size", "1", "--max-steps",
                               "10")])
    alone = _launch(root, None, [_command(data, root / "one-lora", *lora, "--batch-size", "2", "--max-steps", "20"),
                      _command(data, root / "one-full", *full, "--batch-size", "2", "--max-steps", "20"),
                      _command(data, root / "resumed", *lora, "--fsdp", "--batch-size", "2", "--max-steps", "20",
                               "--resume"),
                      _command(data, root / "full-resumed", *lora, *gathered, "--batch-size", "2", "--max-steps",
                               "20", "--resume"),
                      _command(data, root / "full-ft-resumed", *full, *gathered, "--batch-size", "2", "--max-steps",
                               "20", "--resume")])
    assert "--fsdp in one process (no launcher): a process group of 1" in alone.stdout
    return root


@pytest.mark.slow
@pytest.mark.facts("X18")
@pytest.mark.parametrize("kind", ["lora", "full"])
def test_fsdp_at_world_size_2_follows_the_single_process_curve(runs, kind):
    fsdp, one = runs / f"fsdp-{kind}", runs / f"one-{kind}"
    _close(checkpoint_losses(fsdp, STEPS), checkpoint_losses(one, STEPS), range(1, STEPS + 1))
    checkpoint = fsdp / "checkpoint-20"
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):  # weights and AdamW state: one DCP shard per rank
        shards = sorted(p.name for p in (checkpoint / folder).iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], folder  # not a gathered copy
    from hwrun.training import check_checkpoint

    assert check_checkpoint(checkpoint, verify=True) is None  # manifest and sha256 cover every rank's shard
    # the final model: one safetensors file (full) or the adapter, whole, loadable in one process
    if kind == "full":
        from safetensors.torch import load_file

        names = sorted(p.name for p in fsdp.iterdir() if p.name.startswith("model"))
        assert names == ["model.safetensors"]
        saved, base = load_file(fsdp / "model.safetensors"), load_file(Path(hwrun.DEFAULT_MODEL) / "model.safetensors")
        assert saved.keys() == base.keys() and all(saved[k].shape == base[k].shape for k in base)
    else:
        assert (fsdp / "adapter_model.safetensors").is_file() and not (fsdp / "model.safetensors").exists()
        model, _ = hwrun.training.load_adapter_model(str(fsdp), hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))
        assert any("lora_B" in k for k, _ in model.named_parameters())


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_world_size_2_checkpoint_resumes_at_world_size_1(runs):
    resumed = runs / "resumed"
    losses = checkpoint_losses(resumed, STEPS)
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))  # steps 1-10 at world size 2, 11-20 at 1
    straight = checkpoint_losses(runs / "fsdp-lora", STEPS)
    _close(losses[:10], straight[:10], range(1, 11))
    _close(losses[10:], straight[10:], range(11, STEPS + 1))  # restored weights, AdamW state and data position
    assert all(math.isfinite(loss) for _, loss in losses)
    shards = sorted(p.name for p in (resumed / "checkpoint-20" / "pytorch_model_fsdp_0").iterdir())
    assert shards == [".metadata", "__0_0.distcp"]  # written by the one process
    assert (resumed / "adapter_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.facts("X18")
@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_world_size_2_checkpoint_converts_to_safetensors_under_the_state_dict_names(runs, kind, tmp_path):
    """The two ranks' DCP shards of checkpoint-20 become one safetensors file (in one process): the adapter under
    PEFT's names, or the model under its state_dict names; step 20's weights are the final model's, so they must
    equal what the final save gathered, bit for bit."""
    import torch
    from hwrun.training.sharded_checkpoints import fsdp_checkpoint_to_safetensors
    from safetensors import safe_open
    from safetensors.torch import load_file

    fsdp = runs / f"fsdp-{kind}"
    written = fsdp_checkpoint_to_safetensors(fsdp / "checkpoint-20", tmp_path)
    with safe_open(str(written), framework="pt") as handle:
        converted = {name: handle.get_tensor(name) for name in handle.keys()}
    if kind == "full":
        from transformers import AutoConfig, AutoModelForCausalLM

        assert written.name == "model.safetensors"
        config = AutoConfig.from_pretrained(hwrun.DEFAULT_MODEL)
        with torch.device("meta"):
            names = AutoModelForCausalLM.from_config(config).state_dict().keys()
        assert sorted(converted) == sorted(names)  # a tied lm_head.weight too, as the checkpoint holds it
        final = load_file(fsdp / "model.safetensors")  # the final save stores a tied lm_head once
    else:
        assert written.name == "adapter_model.safetensors"
        final = load_file(fsdp / "adapter_model.safetensors")
        assert sorted(converted) == sorted(final)  # PEFT's names, e.g. base_model.model.model.layers.0...lora_A.weight
    assert all(torch.equal(converted[name], final[name]) for name in final)


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_world_size_2_checkpoint_with_a_corrupted_shard_is_refused(runs, tmp_path, monkeypatch, capsys):
    """Rank 1's model shard of checkpoint-20 changed after the save (same size, one byte): `hwrun train --fsdp
    --resume` refuses it before the model loads, naming the shard (the manifest's sha256), and so does the
    conversion; nothing in the folder changes."""
    import shutil

    from hwrun.cli.main import main
    from hwrun.training.checkpoints import sha256_of
    from hwrun.training.sharded_checkpoints import fsdp_checkpoint_to_safetensors

    out = tmp_path / "run"
    shutil.copytree(runs / "fsdp-lora", out, ignore=shutil.ignore_patterns("checkpoint-10"))
    shard = out / "checkpoint-20" / "pytorch_model_fsdp_0" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    before = _refuse_work_after_the_check(out, monkeypatch)
    code = main(_command(runs / "data.txt", out, "--lora", "--lr", "3e-3", "--fsdp", "--batch-size", "2",
                         "--max-steps", "30", "--resume"))
    error = capsys.readouterr().err
    assert code == 2, error
    assert "No checkpoint" in error and "checkpoint-20: pytorch_model_fsdp_0/__1_0.distcp does not match its sha256" \
        in error
    with pytest.raises(hwrun.errors.CheckpointError, match=r"pytorch_model_fsdp_0/__1_0.distcp does not match"):
        fsdp_checkpoint_to_safetensors(out / "checkpoint-20", tmp_path / "converted")
    assert not (tmp_path / "converted").exists()
    assert {p: sha256_of(p) for p in out.rglob("*") if p.is_file()} == before


def _tensors(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_world_size_2_lora_run_writes_full_safetensors_checkpoints(runs):
    """--fsdp-checkpoint full: checkpoint-10 (written by the two ranks) holds the adapter once, as safetensors (what
    the resume reads), the gathered AdamW state, no DCP shard and no pickle of the weights; the manifest covers every
    file."""
    from hwrun.training import check_checkpoint
    from hwrun.training.checkpoints import MANIFEST_NAME

    run = runs / "full-resumed"
    assert not list(run.rglob("*.distcp")) and not list(run.rglob(".metadata"))
    assert not [p for p in run.iterdir() if p.name.startswith(".staging-")]  # every save was published
    checkpoint = run / "checkpoint-10"
    names = sorted(p.name for p in checkpoint.iterdir())
    for name in ("adapter_model.safetensors", "adapter_config.json", "optimizer.bin", "rng_state_0.pth",
                 "rng_state_1.pth", "scheduler.pt", "trainer_state.json", MANIFEST_NAME):
        assert name in names, (name, names)
    assert not [n for n in names if n.startswith("pytorch_model_fsdp") or n.startswith("optimizer_")]
    # the only pickles: Trainer's arguments and the AdamW state (no safetensors form for it; README)
    assert sorted(n for n in names if n.endswith(".bin")) == ["optimizer.bin", "training_args.bin"]
    assert check_checkpoint(checkpoint, verify=True) is None  # the manifest's sha256 covers every file
    listed = json.loads((checkpoint / MANIFEST_NAME).read_text(encoding="utf-8"))["files"]
    assert sorted(listed) == [n for n in names if n != MANIFEST_NAME]
    adapter = _tensors(checkpoint / "adapter_model.safetensors")  # whole, under PEFT's names
    assert adapter and all(".lora_A." in n or ".lora_B." in n for n in adapter)


@pytest.mark.slow
@pytest.mark.facts("X18")
@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_world_size_2_full_checkpoint_resumes_at_world_size_1_on_the_curve(runs, kind):
    """The checkpoint's safetensors are its only copy of the weights (no pickle of them, asserted above for the
    checkpoints these runs wrote), so a resume on the curve of the run that was never stopped read them: the adapter
    through PEFT's names, the whole model through from_pretrained."""
    import torch

    resumed = runs / ("full-resumed" if kind == "lora" else "full-ft-resumed")
    weights = "adapter_model.safetensors" if kind == "lora" else "model.safetensors"
    assert not list(resumed.rglob("pytorch_model_fsdp*")) and not list(resumed.rglob("*.distcp"))
    losses = checkpoint_losses(resumed, STEPS)
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))  # steps 1-10 at world size 2, 11-20 at 1
    straight = checkpoint_losses(runs / f"fsdp-{kind}", STEPS)  # the same training, never stopped (sharded)
    _close(losses[:10], straight[:10], range(1, 11))
    _close(losses[10:], straight[10:], range(11, STEPS + 1))  # restored weights, AdamW state and data position
    assert all(math.isfinite(loss) for _, loss in losses)
    names = sorted(p.name for p in (resumed / "checkpoint-20").iterdir())
    assert "rng_state.pth" in names and weights in names  # written by the one process
    from hwrun.training import check_checkpoint

    assert check_checkpoint(resumed / "checkpoint-20", verify=True) is None
    final = _tensors(resumed / weights)  # step 20 is the final model or adapter (the model's lm_head re-tied)
    last = _tensors(resumed / "checkpoint-20" / weights)
    assert final and set(final) <= set(last) and all(torch.equal(final[n], last[n]) for n in final)


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_a_full_fine_tuning_checkpoint_holds_the_model_as_safetensors(runs):
    """The checkpoint's model.safetensors holds every weight at full shape under the model's names (one file: the
    model is far below save_pretrained's 50GB shard size), the only copy of them (no pytorch_model_fsdp.bin), equal,
    step 10 being the last, to the final model; it loads with from_pretrained."""
    import torch
    from safetensors.torch import load_file

    checkpoint = runs / "full-ft" / "checkpoint-10"
    assert (checkpoint / "config.json").is_file() and not list(checkpoint.glob("model-*-of-*.safetensors"))
    saved = _tensors(checkpoint / "model.safetensors")
    base = load_file(Path(hwrun.DEFAULT_MODEL) / "model.safetensors")
    # the tied lm_head gathered as a weight of its own (hwrun's final save re-ties it, a checkpoint keeps it)
    assert sorted(saved) == sorted([*base, "lm_head.weight"]) and all(saved[k].shape == base[k].shape for k in base)
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    assert any(not torch.equal(saved[k].to(base[k].dtype), base[k]) for k in base)  # trained
    assert sorted(p.name for p in checkpoint.glob("*.bin")) == ["optimizer.bin", "training_args.bin"]
    assert sorted(p.name for p in checkpoint.glob("*.pt*")) == ["rng_state_0.pth", "rng_state_1.pth", "scheduler.pt"]
    final = _tensors(runs / "full-ft" / "model.safetensors")
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
    shutil.copytree(runs / "full-resumed", out, ignore=shutil.ignore_patterns("checkpoint-20"))
    before = _refuse_work_after_the_check(out, monkeypatch)
    monkeypatch.setattr("hwrun.training.run._prepare_data",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("the data was read")))
    code = main(_command(runs / "data.txt", out, "--lora", "--lr", "3e-3", "--fsdp", "--batch-size", "2",
                         "--max-steps", "30", "--resume"))
    error = capsys.readouterr().err
    assert code == 2, error
    assert "is a 'full' FSDP checkpoint (optimizer.bin)" in error and "--fsdp-checkpoint full" in error
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
