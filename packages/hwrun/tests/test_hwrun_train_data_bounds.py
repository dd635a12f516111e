"""Issue 27 point 5 for training data: reading is bounded. A device such as /dev/zero, a pipe, or data past
`max_bytes` stops with a TrainingDataError naming the file and the bound, before memory grows, and files
that report no size (/proc) are bounded by what is read, not by what they claim."""

from __future__ import annotations

import os
import threading

import hwrun
import pytest
from hwrun.errors import TrainingDataError
from hwrun.training.data import DEFAULT_MAX_DATA_BYTES, read_documents


def test_the_default_bound_is_4_gib_and_documented():
    assert DEFAULT_MAX_DATA_BYTES == 4 * 1024**3
    assert "max_data_bytes" in hwrun.train.__doc__


def test_dev_zero_is_refused_at_once():
    with pytest.raises(TrainingDataError, match=r"'/dev/zero' is a device, not a regular file"):
        read_documents("/dev/zero")


def test_a_symlink_to_a_device_is_refused(tmp_path):
    link = tmp_path / "data.txt"
    link.symlink_to("/dev/zero")
    with pytest.raises(TrainingDataError, match="is a device, not a regular file"):
        read_documents(link)


def test_a_pipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "data.txt"
    os.mkfifo(fifo)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_raises(fifo)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert outcome == ["is a pipe, not a regular file"], "reading a FIFO blocked or passed"


def _raises(path):
    try:
        read_documents(path)
    except TrainingDataError as error:
        return "is a pipe, not a regular file" if "is a pipe, not a regular file" in str(error) else str(error)
    return "no error"


def test_a_file_past_the_bound_is_refused_naming_the_bound(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * 5000, encoding="utf-8")
    with pytest.raises(TrainingDataError) as caught:
        read_documents(big, max_bytes=4096)
    message = str(caught.value)
    assert str(big) in message and "max_data_bytes=4,096" in message and "5,000 bytes" in message
    assert "--max-data-size" in message
    assert [d.text for d in read_documents(big, max_bytes=5000)] == ["x" * 5000]  # exactly the bound is fine


def test_the_bound_covers_a_folder_in_total(tmp_path):
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("y" * 400, encoding="utf-8")
    assert len(read_documents(tmp_path, max_bytes=1200)) == 3
    with pytest.raises(TrainingDataError, match=r"c\.txt \(in .*\) takes the data past max_data_bytes=1,000 "
                                                 r"\(400 bytes in this file, 800 read before it\)"):
        read_documents(tmp_path, max_bytes=1000)


def test_a_file_that_reports_no_size_is_bounded_by_what_is_read():
    status = "/proc/self/status"  # a regular file whose st_size is 0 and whose content is ~1 KB
    assert os.stat(status).st_size == 0
    with pytest.raises(TrainingDataError, match=r"past max_data_bytes=64 \(65 bytes"):
        read_documents(status, max_bytes=64)


@pytest.mark.parametrize("bound", [0, -1, True, 1.5])
def test_a_bound_that_is_not_a_positive_int_is_refused(tmp_path, bound):
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    with pytest.raises(TrainingDataError, match="max_bytes=.* must be an int >= 1"):
        read_documents(tmp_path / "a.txt", max_bytes=bound)


def test_train_passes_its_bound_to_the_reader_before_loading(tmp_path, monkeypatch):
    monkeypatch.setattr("hwrun.training.run._load_model", lambda *a, **k: pytest.fail("the model must not load"))
    data = tmp_path / "train.txt"
    data.write_text("The king said. " * 100, encoding="utf-8")
    with pytest.raises(TrainingDataError, match="max_data_bytes=100"):
        hwrun.train(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), data, output_dir=tmp_path / "out", max_steps=1,
                    max_data_bytes=100)
    with pytest.raises(TrainingDataError, match="'/dev/zero' is a device"):
        hwrun.train(hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu"), "/dev/zero", output_dir=tmp_path / "out",
                    max_steps=1)
    assert not (tmp_path / "out").exists()
