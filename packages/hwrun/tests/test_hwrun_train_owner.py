"""Issue 27 point 1: output folders hold a record of hwrun's own files (`hwrun_output.json`); a folder holding
files hwrun did not write is refused (naming them and --overwrite), and even with overwrite=True those files
are never replaced or deleted: only hwrun's own are."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import hwrun
import pytest
from hwrun.training import OUTPUT_MANIFEST, TrainingConfigError

FAST = {"batch_size": 4, "block_size": 32, "disable_tqdm": True, "plot": True, "lora": True}


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("owner")
    data = root / "train.txt"
    data.write_text("The king said to the queen that the castle was cold. " * 40, encoding="utf-8")
    return hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), data


def user_folder(path: Path) -> dict[str, str]:
    path.mkdir()
    (path / "README.md").write_text("# my project\n", encoding="utf-8")
    (path / "notes.txt").write_text("do not lose me\n", encoding="utf-8")
    (path / "src").mkdir()
    (path / "src" / "main.py").write_text("print('hi')\n", encoding="utf-8")
    return digest(path)


def test_the_current_folder_with_a_users_files_is_refused_naming_them(setup, tmp_path, monkeypatch):
    """`hwrun train --output .` in a project folder: before, the final save wrote PEFT's model card over README.md."""
    plan, data = setup
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))
    work = tmp_path / "project"
    before = user_folder(work)
    monkeypatch.chdir(work)
    with pytest.raises(TrainingConfigError) as caught:
        hwrun.train(plan, data, output_dir=".", max_steps=1, **FAST)
    message = str(caught.value)
    assert "holds files hwrun did not write (README.md, notes.txt, src)" in message
    assert "--overwrite (overwrite=True)" in message and "never replaces or deletes these" in message
    assert digest(work) == before and sorted(p.name for p in work.iterdir()) == ["README.md", "notes.txt", "src"]


def test_overwrite_writes_beside_a_users_files_and_never_replaces_them(setup, tmp_path):
    plan, data = setup
    out = tmp_path / "project"
    before = user_folder(out)
    result = hwrun.train(plan, data, output_dir=out, max_steps=2, save_steps=1, overwrite=True, **FAST)
    after = digest(out)
    assert {name: after[name] for name in before} == before  # README.md, notes.txt, src/main.py untouched
    assert (out / "adapter_model.safetensors").is_file() and (out / "checkpoint-2").is_dir()
    assert result.reasons["kept"] == f"not written, because files of these names in {out} are not hwrun's: README.md"
    record = json.loads((out / OUTPUT_MANIFEST).read_text())
    assert "README.md" not in record["files"] and "notes.txt" not in record["files"]
    assert {"adapter_model.safetensors", "adapter_config.json", "loss.png"} <= set(record["files"])
    entry = record["files"]["adapter_model.safetensors"]
    assert entry["sha256"] == after["adapter_model.safetensors"] and entry["size"] > 0
    assert record["final"]["step"] == 2 and record["final"]["run"]["kind"] == "lora"

    # a second fresh run with overwrite replaces hwrun's own earlier run only: its checkpoints go, the
    # user's files stay; without overwrite it is refused
    with pytest.raises(TrainingConfigError, match=r"holds files hwrun did not write \(README\.md, notes\.txt, src\)"):
        hwrun.train(plan, data, output_dir=out, max_steps=1, resume=False, overwrite=False, **FAST)
    again = hwrun.train(plan, data, output_dir=out, max_steps=1, save_steps=1, resume=False, overwrite=True,
                        lr=1e-3, **FAST)
    assert again.global_step == 1 and again.resumed_from is None
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1"]
    final = digest(out)
    assert {name: final[name] for name in before} == before
    assert final["adapter_model.safetensors"] != after["adapter_model.safetensors"]
    assert json.loads((out / OUTPUT_MANIFEST).read_text())["final"]["step"] == 1


def test_a_file_hwrun_wrote_and_the_user_changed_is_the_users(setup, tmp_path):
    plan, data = setup
    out = tmp_path / "run"
    hwrun.train(plan, data, output_dir=out, max_steps=1, save_steps=1, **FAST)
    (out / "README.md").write_text("my notes about this run\n", encoding="utf-8")  # edited after the run
    with pytest.raises(TrainingConfigError, match=r"holds files hwrun did not write \(README\.md\)"):
        hwrun.train(plan, data, output_dir=out, max_steps=2, resume="auto", **FAST)
    result = hwrun.train(plan, data, output_dir=out, max_steps=2, save_steps=1, resume="auto", overwrite=True, **FAST)
    assert result.global_step == 2
    assert (out / "README.md").read_text(encoding="utf-8") == "my notes about this run\n"


def test_a_copied_run_folder_is_still_hwruns(setup, tmp_path):
    """A copy without preserved times (cp -r) changes every mtime: the sha256 in the record still tells."""
    plan, data = setup
    out = tmp_path / "run"
    hwrun.train(plan, data, output_dir=out, max_steps=1, save_steps=1, **FAST)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, copy_function=shutil.copyfile)
    for file in copy.rglob("*"):
        os.utime(file, ns=(1, 1))
    result = hwrun.train(plan, data, output_dir=copy, max_steps=2, save_steps=1, resume="auto", **FAST)
    assert result.global_step == 2 and result.resumed_from == str(copy / "checkpoint-1")


def test_a_folder_from_before_the_record_is_still_resumable(setup, tmp_path):
    """Folders written before hwrun_output.json (hwrun's checkpoints in them): the names a run writes are taken as
    that run's, so --resume works as it did."""
    plan, data = setup
    out = tmp_path / "run"
    hwrun.train(plan, data, output_dir=out, max_steps=1, save_steps=1, **FAST)
    (out / OUTPUT_MANIFEST).unlink()
    result = hwrun.train(plan, data, output_dir=out, max_steps=2, save_steps=1, resume="auto", **FAST)
    assert result.global_step == 2
    assert (out / OUTPUT_MANIFEST).is_file()


def test_a_failed_run_leaves_no_folder_it_created_for_nothing(setup, tmp_path):
    from transformers import TrainerCallback

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("injected")

    plan, data = setup
    out = tmp_path / "new"
    with pytest.raises(RuntimeError, match="injected"):
        hwrun.train(plan, data, output_dir=out, max_steps=2, save_steps=100, callbacks=[Boom()], **FAST)
    assert not out.exists()


def test_a_checkpoint_copied_into_a_users_folder_does_not_make_their_files_hwruns(setup, tmp_path):
    """Review finding: without the record, one copied checkpoint made every name a run writes (README.md,
    config.json, tokenizer.json) count as hwrun's, so a resume replaced them and a fresh start deleted them."""
    plan, data = setup
    run = tmp_path / "run"
    hwrun.train(plan, data, output_dir=run, max_steps=1, save_steps=1, **FAST)
    project = tmp_path / "project"
    project.mkdir()
    for name in ("README.md", "config.json", "tokenizer.json"):
        (project / name).write_text(f"the user's {name}\n", encoding="utf-8")
    shutil.copytree(run / "checkpoint-1", project / "checkpoint-1")
    before = digest(project)
    with pytest.raises(TrainingConfigError, match=r"README\.md, config\.json, tokenizer\.json"):
        hwrun.train(plan, data, output_dir=project, max_steps=2, save_steps=1, resume="auto", **FAST)
    with pytest.raises(TrainingConfigError, match=r"config\.json, tokenizer\.json"):
        hwrun.train(plan, data, output_dir=project, max_steps=1, overwrite=True, resume=False, **FAST)
    assert digest(project) == before


def test_a_users_file_inside_a_checkpoint_or_a_recorded_folder_makes_it_theirs(setup, tmp_path):
    plan, data = setup
    out = tmp_path / "run"
    hwrun.train(plan, data, output_dir=out, max_steps=1, save_steps=1, **FAST)
    (out / "checkpoint-1" / "my-eval.txt").write_text("eval results\n", encoding="utf-8")
    from hwrun.training.output import survey

    assert "checkpoint-1" in survey(out).foreign
    with pytest.raises(TrainingConfigError, match=r"checkpoint-1"):
        hwrun.train(plan, data, output_dir=out, max_steps=1, resume=False, overwrite=True, **FAST)
    assert (out / "checkpoint-1" / "my-eval.txt").read_text() == "eval results\n"
