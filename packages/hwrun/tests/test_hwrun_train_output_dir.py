"""Issue 27 points 1-2: an empty, file or unwritable output_dir is refused before anything loads, and
nothing in the current folder is touched."""

from __future__ import annotations

import hwrun
import pytest
from hwrun.errors import TrainingConfigError


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_output_dir_is_refused_and_the_current_folder_untouched(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("the user's own file")
    with pytest.raises(TrainingConfigError, match=r"output_dir=.* is empty.*current folder"):
        hwrun.train(hwrun.plan(device="cpu"), ["The king said."], output_dir=value, max_steps=1, lora=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]
    assert (tmp_path / "README.md").read_text() == "the user's own file"


def test_an_existing_file_is_refused(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with pytest.raises(TrainingConfigError, match=r"notes.txt' is an existing file"):
        hwrun.train(hwrun.plan(device="cpu"), ["The king said."], output_dir=target, max_steps=1, lora=True)
    assert target.read_text() == "keep me"


def test_an_unwritable_folder_is_refused_before_training():
    with pytest.raises(TrainingConfigError, match=r"cannot be written"):
        hwrun.train(hwrun.plan(device="cpu"), ["The king said."], output_dir="/proc/hwrun-cannot-write-here",
                    max_steps=1, lora=True)
