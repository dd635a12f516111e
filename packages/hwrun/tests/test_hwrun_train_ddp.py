"""Data-parallel `hwrun.train` through `hwdist launch` on CPU (2 processes, gloo): both ranks end
with identical weights, and the run really was distributed (X18, G16)."""

from __future__ import annotations

import json
import textwrap

import pytest

WORKER = textwrap.dedent('''
    import json, os, sys
    import torch
    import hwrun
    from safetensors.torch import save_file

    model, data, out = sys.argv[1:4]
    captured = {}

    from transformers import TrainerCallback

    class Capture(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            captured["state"] = {k: v.detach().clone().contiguous() for k, v in model.named_parameters()
                                 if v.requires_grad}
            captured["world"] = args.world_size
            captured["backend"] = args.ddp_backend
            captured["parallel_mode"] = str(args.parallel_mode)

    plan = hwrun.plan(model, device="cpu")
    result = hwrun.train(plan, data, lora=True, max_steps=3, lr=3e-3, batch_size=2, block_size=32,
                         output_dir=out, disable_tqdm=True, plot=False, callbacks=[Capture()])
    rank = int(os.environ["RANK"])
    save_file(captured["state"], os.path.join(out, f"rank{rank}.safetensors"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"world": captured["world"], "backend": captured["backend"], "step": result.global_step,
                   "mode": captured["parallel_mode"], "losses": result.losses}, handle)
    import hwdist
    hwdist.shutdown(adopted=True)  # destroy Trainer's gloo group before exit (gloo can abort at exit otherwise)
''')


@pytest.mark.slow
@pytest.mark.facts("X18", "G16")
def test_two_process_gloo_run_gives_identical_weights_on_both_ranks(tmp_path):
    import torch
    from hwrun.testing import build_tiny_model, launch_cpu_workers
    from safetensors.torch import load_file

    model = build_tiny_model(tmp_path / "model")
    data = tmp_path / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 30, encoding="utf-8")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    out = tmp_path / "out"
    done = launch_cpu_workers(worker, str(model), str(data), str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    info = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(i["world"] == 2 and i["backend"] == "gloo" and i["step"] == 3 for i in info)
    assert all("DISTRIBUTED" in i["mode"] for i in info)
    rank0, rank1 = (load_file(out / f"rank{r}.safetensors") for r in (0, 1))
    assert rank0.keys() == rank1.keys() and any("lora_B" in k for k in rank0)
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert any(torch.count_nonzero(v) for k, v in rank0.items() if "lora_B" in k)  # it trained
    assert (out / "adapter_model.safetensors").is_file()  # rank 0 saved the final adapter once
