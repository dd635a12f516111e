"""HwrunAccelerateGuard in a real Accelerate loop (no Trainer) on the tiny model with a PEFT LoRA adapter, on CPU: a crash
mid-save leaves the previous checkpoint the newest, the resumed run's losses follow the uninterrupted run's, a NaN loss
stops with NonFiniteLossError and publishes nothing, SIGTERM saves and stops, the final adapter loads with PEFT; the
signal handlers are explicit, idempotent, reversible and main-thread only."""

from __future__ import annotations

import errno
import os
import re
import signal
import threading
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import (
    CheckpointError,
    CheckpointWriteError,
    NonFiniteLossError,
    TrainingConfigError,
    TrainingDivergedError,
)
from hwrun.training import HwrunAccelerateGuard, check_checkpoint
from hwrun.training.checkpoints import MANIFEST_NAME, write_manifest

TEXT = "The king said to the queen that the castle was cold. " * 60
README = Path(__file__).resolve().parents[1] / "README.md"


class Crash(Exception):
    """Stands for the process dying while Accelerate writes a checkpoint."""


def _accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


class Loop:
    """A user's own Accelerate loop: tiny model + LoRA, AdamW, a linear schedule, gradient clipping, unshuffled data."""

    def __init__(self, out: Path, **guard):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import (
            AutoModelForCausalLM,
            AutoTokenizer,
            get_linear_schedule_with_warmup,
        )

        torch.manual_seed(0)  # the LoRA A matrices: same seed, same adapter at the start
        tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                          task_type="CAUSAL_LM")
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL), lora)
        ids = tokenizer(TEXT, return_tensors="pt").input_ids[0]
        blocks = ids[: len(ids) // 32 * 32].view(-1, 32)
        loader = torch.utils.data.DataLoader([{"input_ids": b, "labels": b} for b in blocks], batch_size=2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = get_linear_schedule_with_warmup(optimizer, 1, 8)
        self.accelerator = _accelerator()
        self.model, self.optimizer, self.loader, self.scheduler = self.accelerator.prepare(
            model, optimizer, loader, scheduler)
        guard.setdefault("checkpointing_steps", 2)
        self.hw = HwrunAccelerateGuard(self.accelerator, out, model=self.model, **guard)
        self.losses: dict[int, float] = {}

    def run(self, steps: int, *, poison: int | None = None, before_step=None) -> int:
        """Train up to `steps` from the newest checkpoint; `poison`: that step's loss is NaN."""
        step = self.hw.load_state()
        with self.hw:
            for batch in self.accelerator.skip_first_batches(self.loader, step):
                if step == steps:
                    break
                if before_step is not None:
                    before_step(step + 1)
                loss = self.model(**batch).loss
                if step + 1 == poison:
                    loss = loss * float("nan")
                self.accelerator.backward(loss)
                norm = self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                step += 1
                self.losses[step] = loss.item()
                if self.hw.step_end(step, loss, norm):
                    break
        return step


def _published(out: Path) -> list[str]:
    return sorted((p.name for p in out.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))


def test_crash_mid_save_resume_matches_the_uninterrupted_run_and_the_adapter_loads(tmp_path, monkeypatch):
    """A crash while checkpoint-4's optimizer state is written leaves checkpoint-2 the newest; the run resumed from it
    gives the uninterrupted run's losses for steps 3-6; total_limit=2 keeps the two newest; the final adapter loads
    with peft.PeftModel.from_pretrained holding exactly the trained LoRA weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    whole = Loop(tmp_path / "whole", total_limit=2)
    assert whole.run(6) == 6
    assert _published(tmp_path / "whole") == ["checkpoint-4", "checkpoint-6"]  # total_limit=2
    assert len(set(whole.losses.values())) == 6  # the loop trains: every step's loss differs

    out = tmp_path / "run"
    real_save = torch.save

    def dying_save(obj, f, *args, **kwargs):
        if "checkpoint-4" in str(f) and "optimizer" in str(f):
            raise Crash(f"killed while writing {f}")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    crashed = Loop(out, plan=plan)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Crash):
        crashed.run(6)
    monkeypatch.setattr(torch, "save", real_save)
    assert signal.getsignal(signal.SIGTERM) == before  # the with-block gave the handlers back
    assert _published(out) == ["checkpoint-2"] and crashed.hw.saved == [out / "checkpoint-2"]
    staged = out / ".staging-checkpoint-4"
    assert staged.is_dir() and not (staged / MANIFEST_NAME).exists()  # the half-written save, never a candidate
    manifest = (out / "checkpoint-2" / MANIFEST_NAME).read_text(encoding="utf-8")
    assert '"kind": "accelerate"' in manifest and '"device": "cpu"' in manifest  # the plan is recorded

    resumed = Loop(out, plan=plan)
    assert resumed.run(6) == 6
    assert resumed.hw.resumed_from == str(out / "checkpoint-2")
    assert sorted(resumed.losses) == [3, 4, 5, 6]
    for step, loss in resumed.losses.items():
        assert loss == pytest.approx(whole.losses[step], rel=1e-5, abs=1e-6), step
    assert not staged.exists()  # the next save of step 4 removed the dead one's folder
    assert _published(out) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert all(check_checkpoint(out / name, verify=True) is None for name in _published(out))

    adapter = tmp_path / "adapter"
    resumed.accelerator.unwrap_model(resumed.model).save_pretrained(adapter)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL), str(adapter))
    trained = {name: value for name, value in resumed.accelerator.unwrap_model(resumed.model).named_parameters()
               if "lora_" in name}
    assert trained and any(torch.count_nonzero(v) for name, v in trained.items() if "lora_B" in name)
    for name, value in loaded.named_parameters():
        if "lora_" in name:
            assert torch.equal(value, trained[name]), name


def test_a_full_disk_mid_save_is_a_checkpoint_write_error_and_the_partial_save_goes(tmp_path, monkeypatch):
    import torch

    out = tmp_path / "run"
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if "checkpoint-4" in str(f) and "optimizer" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"the disk is full.*checkpoint-2.* is untouched"):
        Loop(out).run(6)
    assert _published(out) == ["checkpoint-2"] and not (out / ".staging-checkpoint-4").exists()


def test_a_nan_loss_stops_with_the_documented_error_and_publishes_nothing_after(tmp_path):
    out = tmp_path / "run"
    loop = Loop(out, checkpointing_steps=1)
    with pytest.raises(NonFiniteLossError, match=r"step 3: the training loss is nan \(not finite\)") as raised:
        loop.run(6, poison=3)
    assert not isinstance(raised.value, TrainingDivergedError)
    assert _published(out) == ["checkpoint-1", "checkpoint-2"]
    assert not list(out.glob(".staging-*"))
    assert all(check_checkpoint(out / name, verify=True) is None for name in _published(out))
    assert Loop(out).hw.load_state() == 2  # a later run resumes before the NaN


def test_a_nan_weight_is_never_saved(tmp_path):
    import torch

    out = tmp_path / "run"
    loop = Loop(out, checkpointing_steps=None)
    assert loop.run(1) == 1 and not out.exists()
    with torch.no_grad():
        next(p for name, p in loop.model.named_parameters() if "lora_B" in name).fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match="step 1: a trainable weight is nan"):
        loop.hw.save_state(1)
    assert not out.exists()  # nothing staged, nothing published


def test_divergence_and_grad_norm_raise_the_errors_train_raises(tmp_path):
    hw = HwrunAccelerateGuard(_accelerator(), tmp_path)
    for step in range(1, 6):
        assert hw.check(step, 5.0, grad_norm=1.0) is False
    with pytest.raises(TrainingDivergedError, match=r"step 6: the training loss is 50 \(above 15"):
        hw.check(6, 50.0)
    other = HwrunAccelerateGuard(_accelerator(), tmp_path)
    with pytest.raises(NonFiniteLossError, match="step 1: the gradient norm is inf"):
        other.check(1, 5.0, grad_norm=float("inf"))
    quiet = HwrunAccelerateGuard(_accelerator(), tmp_path, on_nonfinite="ignore")
    assert quiet.check(1, float("nan"), grad_norm=float("nan")) is False


def test_sigterm_saves_at_the_next_step_boundary_and_stops(tmp_path):
    out = tmp_path / "run"
    loop = Loop(out, checkpointing_steps=100)
    before = signal.getsignal(signal.SIGTERM)

    def term(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    assert loop.run(10, before_step=term) == 3
    assert loop.hw.received == signal.SIGTERM
    assert _published(out) == ["checkpoint-3"] and check_checkpoint(out / "checkpoint-3", verify=True) is None
    assert signal.getsignal(signal.SIGTERM) == before
    assert Loop(out).hw.load_state() == 3


def test_signal_handlers_are_explicit_idempotent_reversible_and_main_thread_only(tmp_path):
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    hw = HwrunAccelerateGuard(_accelerator(), tmp_path)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous  # explicit: nothing yet
    assert hw.install_signals() is True
    ours = signal.getsignal(signal.SIGTERM)
    assert ours != previous[0] and signal.getsignal(signal.SIGINT) == ours
    assert hw.install_signals() is True and signal.getsignal(signal.SIGTERM) == ours  # idempotent
    hw.restore_signals()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous  # reversible
    hw.restore_signals()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous  # idempotent

    answers = []
    worker = threading.Thread(target=lambda: answers.append(hw.install_signals()))
    worker.start()
    worker.join()
    assert answers == [False] and signal.getsignal(signal.SIGTERM) == previous[0]  # main thread only
    off = HwrunAccelerateGuard(_accelerator(), tmp_path, signals=False)
    with off:
        assert signal.getsignal(signal.SIGTERM) == previous[0]
    assert off.received is None


def test_refusals(tmp_path):
    import hwenv
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    xpu_plan = hwrun.plan(hwrun.DEFAULT_MODEL, device=hwenv.Accelerator("xpu", 1))
    with pytest.raises(TrainingConfigError, match=r"trains on 'cpu'.*HwrunAccelerateGuard is for .*xpu"):
        HwrunAccelerateGuard(_accelerator(), tmp_path, plan=xpu_plan)
    automatic = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                                           automatic_checkpoint_naming=True))
    with pytest.raises(TrainingConfigError, match="automatic_checkpoint_naming"):
        HwrunAccelerateGuard(automatic, tmp_path)
    with pytest.raises(TrainingConfigError, match="total_limit=0"):
        HwrunAccelerateGuard(_accelerator(), tmp_path, total_limit=0)
    trainer_checkpoint = tmp_path / "checkpoint-5"
    trainer_checkpoint.mkdir()
    (trainer_checkpoint / "trainer_state.json").write_text("{}", encoding="utf-8")
    write_manifest(trainer_checkpoint, 5, {"kind": "callback"})
    with pytest.raises(CheckpointError, match="written by a Trainer with HwrunCallback"):
        HwrunAccelerateGuard(_accelerator(), tmp_path).load_state()
    assert HwrunAccelerateGuard(_accelerator(), tmp_path / "empty").load_state() == 0


def readme_example() -> str:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- accelerate-guard:example -->\n```python\n(.*?)```\n<!-- /accelerate-guard:example -->",
                      text, re.S)
    assert block, "the README's HwrunAccelerateGuard example lost its markers"
    return block.group(1)


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example(), "README.md", "exec"), {"__name__": "readme_example"})  # noqa: S102
    published = _published(tmp_path / "my-loop")
    assert published and all(check_checkpoint(tmp_path / "my-loop" / n, verify=True) is None for n in published)
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL), "my-loop/adapter")


WORKER = '''
import json, os, signal, sys
import torch
import hwrun
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from hwrun.errors import NonFiniteLossError
from hwrun.training import HwrunAccelerateGuard

out, mode = sys.argv[1:3]
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
torch.manual_seed(0)
tokenizer = AutoTokenizer.from_pretrained(hwrun.DEFAULT_MODEL)
lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
model = get_peft_model(AutoModelForCausalLM.from_pretrained(hwrun.DEFAULT_MODEL), lora)
ids = tokenizer("The king said to the queen that the castle was cold. " * 30, return_tensors="pt").input_ids[0]
blocks = ids[: len(ids) // 32 * 32].view(-1, 32)
loader = torch.utils.data.DataLoader([{"input_ids": b, "labels": b} for b in blocks], batch_size=1)
model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader)
hw = HwrunAccelerateGuard(accelerator, out, model=model, checkpointing_steps=2)
step = hw.load_state()
result = {"world": accelerator.num_processes}
try:
    with hw:
        for batch in accelerator.skip_first_batches(loader, step):
            if mode == "term" and rank == 1 and step + 1 == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # one process only
            loss = model(**batch).loss
            if mode == "resume" and rank == 1 and step + 1 == 5:
                loss = loss * float("nan")  # one process only
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if hw.step_end(step, loss) or step == 6:
                break
except NonFiniteLossError as error:
    result["error"] = str(error)
result.update(step=step, received=hw.received, saved=[p.name for p in hw.saved], resumed_from=hw.resumed_from)
with open(os.path.join(out, f"{mode}-rank{rank}.json"), "w") as handle:
    json.dump(result, handle)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
'''


@pytest.mark.slow
def test_two_processes_meet_at_the_barriers_and_agree_on_signals_and_nan(tmp_path):
    """gloo, 2 CPU processes: a SIGTERM to one process stops both at the same step with one checkpoint holding both
    processes' RNG states; the resumed pair continues from it and saves the next one; a NaN loss on one process then
    raises on both, with nothing published after it."""
    import json

    from hwrun.testing import launch_cpu_workers

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    for mode in ("term", "resume"):
        done = launch_cpu_workers(worker, str(out), mode)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    term = [json.loads((out / f"term-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in term] == [2, 2]
    assert [r["step"] for r in term] == [3, 3] and [r["saved"] for r in term] == [["checkpoint-2", "checkpoint-3"]] * 2
    assert [r["received"] for r in term] == [None, signal.SIGTERM]
    manifest = (out / "checkpoint-3" / MANIFEST_NAME).read_text(encoding="utf-8")
    assert "random_states_0.pkl" in manifest and "random_states_1.pkl" in manifest  # both processes' files
    resume = [json.loads((out / f"resume-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["resumed_from"] for r in resume] == [str(out / "checkpoint-3")] * 2
    assert [r["step"] for r in resume] == [5, 5] and [r["saved"] for r in resume] == [["checkpoint-4"]] * 2
    assert all("step 5: the training loss is nan" in r.get("error", "") for r in resume)
    assert _published(out) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"] and not list(out.glob(".staging-*"))
    assert all(check_checkpoint(out / n, verify=True) is None for n in _published(out))
