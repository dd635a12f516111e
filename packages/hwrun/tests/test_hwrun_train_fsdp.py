"""FSDP and DeepSpeed through `hwrun.train(..., **training_overrides)` on CPU.

accelerate 1.16 drops an FSDP plugin under MULTI_CPU (use_cpu, gloo) and trains plain DDP instead,
so hwrun refuses fsdp= on CPU before the model loads; deepspeed= without the deepspeed package is
refused the same way. The FSDP2 path itself (torch's fully_shard, which does run on CPU with gloo)
is still exercised for real: a 2-process `hwdist launch` run, as in test_hwrun_train_ddp.py, whose
worker lifts accelerate's CPU gate, checks that the final adapter is gathered from the shards, saved
once, loadable, and equal on both ranks."""

from __future__ import annotations

import importlib.util
import json
import math
import textwrap

import hwenv
import hwrun
import pytest
from hwrun.testing import launch_cpu_workers
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

    hwrun.training.arguments.FSDP_UNSUPPORTED_KINDS = frozenset({"mps"})  # the gate is lifted above
    model, data, out = sys.argv[1:4]
    captured = {}

    class Capture(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            captured["types"] = sorted({type(p).__name__ for p in model.parameters()})
            # full_tensor() is a collective: both ranks gather every trainable shard
            captured["state"] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
                                 for k, v in model.named_parameters() if v.requires_grad}
            captured["world"] = args.world_size

    plan = hwrun.plan(model, device="cpu")
    result = hwrun.train(plan, data, lora=True, max_steps=3, lr=3e-3, batch_size=2, block_size=32,
                         output_dir=out, disable_tqdm=True, plot=False, callbacks=[Capture()],
                         fsdp=True, fsdp_config={"fsdp_version": 2})
    rank = int(os.environ["RANK"])
    save_file(captured["state"], os.path.join(out, f"rank{rank}.safetensors"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"world": captured["world"], "step": result.global_step, "losses": result.losses,
                   "types": captured["types"], **seen}, handle)
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


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed")
def test_transformers_own_deepspeed_error_is_what_hwrun_replaces(tmp_path):
    from transformers import TrainingArguments

    with pytest.raises(ImportError, match="deepspeed"):
        TrainingArguments(output_dir=str(tmp_path), deepspeed="ds_zero2.json", use_cpu=True, report_to="none")


@pytest.mark.slow
@pytest.mark.facts("X18")
def test_two_process_fsdp2_lora_saves_the_gathered_adapter(tmp_path, data):
    import torch
    from hwrun.training import check_checkpoint, load_adapter_model
    from safetensors.torch import load_file

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    out = tmp_path / "out"
    done = launch_cpu_workers(worker, hwrun.DEFAULT_MODEL, str(data), str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    info = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    # If this fails, accelerate now builds FSDP on CPU: drop "cpu" from FSDP_UNSUPPORTED_KINDS.
    assert all(i["accelerate_kept_fsdp_on_cpu"] is False for i in info)
    assert all(i["world"] == 2 and i["step"] == 3 and i["types"] == ["DTensor"] for i in info)  # sharded
    assert all(len(i["losses"]) == 3 and all(math.isfinite(loss) for _, loss in i["losses"]) for i in info)
    rank0, rank1 = (load_file(out / f"rank{r}.safetensors") for r in (0, 1))
    assert rank0.keys() == rank1.keys() and any("lora_B" in k for k in rank0)
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert any(torch.count_nonzero(v) for k, v in rank0.items() if "lora_B" in k)  # it trained

    model, _ = load_adapter_model(out, hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"))
    saved = {k: v for k, v in model.named_parameters() if "lora_" in k}
    assert saved.keys() == rank0.keys()
    for name, value in saved.items():  # the whole gathered adapter, not one rank's shard
        assert value.shape == rank0[name].shape and torch.equal(value, rank0[name]), name
    assert check_checkpoint(out / "checkpoint-3") is None  # the FSDP checkpoint is complete
