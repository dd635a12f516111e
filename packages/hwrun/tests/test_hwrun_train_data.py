"""Training data: text / JSONL / folder reading, packing into fixed blocks, and every bad input."""

from __future__ import annotations

import json

import pytest
from hwrun.errors import TrainingDataError
from hwrun.training.data import build_dataset, pack_token_ids, read_documents


class CharTokenizer:
    """A stand-in tokenizer: one id per character (ord % 200), EOS = 201."""

    eos_token_id = 201
    model_max_length = 64

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) % 200 for ch in text]}


def test_text_file_is_one_document(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello\nworld\n", encoding="utf-8")
    docs = read_documents(path)
    assert [d.text for d in docs] == ["hello\nworld\n"]
    assert docs[0].source == str(path)


def test_jsonl_reads_text_fields_and_names_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n', encoding="utf-8")
    docs = read_documents(path)
    assert [d.text for d in docs] == ["one", "two"]
    assert docs[1].source == f"{path}:3"


def test_folder_reads_txt_files_sorted_recursively(tmp_path):
    (tmp_path / "b.txt").write_text("bee", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("ay", encoding="utf-8")
    (tmp_path / "notes.json").write_text("{}", encoding="utf-8")
    assert [d.text for d in read_documents(tmp_path)] == ["bee", "ay"]


@pytest.mark.parametrize("content", ["", "   \n\n"])
def test_empty_text_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TrainingDataError, match="empty") as info:
        read_documents(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_jsonl_line_without_text_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"prompt": "x"}\n', encoding="utf-8")
    with pytest.raises(TrainingDataError, match=r"d\.jsonl:2: .*no \"text\" field.*prompt"):
        read_documents(path)


def test_jsonl_text_must_be_a_string(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": 5}\n', encoding="utf-8")
    with pytest.raises(TrainingDataError, match=r"d\.jsonl:1: .*int"):
        read_documents(path)


def test_jsonl_bad_json_names_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(TrainingDataError, match=r"d\.jsonl:2: not valid JSON"):
        read_documents(path)


def test_jsonl_with_only_blank_texts_is_empty(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": " "}) + "\n", encoding="utf-8")
    with pytest.raises(TrainingDataError, match="empty"):
        read_documents(path)


def test_non_utf8_file_names_file_and_line(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("first line\nsecond caf\xe9\n".encode("latin-1"))
    with pytest.raises(TrainingDataError, match=r"latin\.txt:2: the file is not UTF-8 \(byte 0xe9"):
        read_documents(path)


def test_non_utf8_inside_folder_names_that_file(tmp_path):
    (tmp_path / "good.txt").write_text("fine", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(TrainingDataError, match=r"bad\.txt:1"):
        read_documents(tmp_path)


def test_missing_path_and_folder_without_txt(tmp_path):
    with pytest.raises(TrainingDataError, match="does not exist"):
        read_documents(tmp_path / "nope.txt")
    (tmp_path / "x.csv").write_text("a,b", encoding="utf-8")
    with pytest.raises(TrainingDataError, match="no .txt files"):
        read_documents(tmp_path)


def test_packing_concatenates_with_separator_and_drops_tail():
    blocks = pack_token_ids([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 4, separator=0)
    # stream: 1 2 3 0 4 5 0 6 7 8 9 0  -> three full blocks, nothing dropped
    assert blocks == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]]
    assert pack_token_ids([[1, 2, 3, 4, 5]], 2, separator=None) == [[1, 2], [3, 4]]


def test_packing_short_data_gives_one_short_block():
    assert pack_token_ids([[1, 2]], 8, separator=9) == [[1, 2, 9]]
    assert pack_token_ids([[]], 8, separator=None) == []


def test_build_dataset_gives_unpadded_blocks(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("abcdefghij" * 3, encoding="utf-8")
    dataset = build_dataset(path, CharTokenizer(), block_size=8)
    assert len(dataset) == 3  # 30 chars + EOS = 31 tokens -> 3 blocks of 8
    item = dataset[1]
    assert item["input_ids"].tolist() == [ord(c) % 200 for c in "ijabcdef"]
    assert item["labels"].tolist() == item["input_ids"].tolist()
    assert set(item) == {"input_ids", "labels"}  # no padding, so no attention_mask
    assert dataset.tokens == 24


def test_block_size_longer_than_model_is_an_error(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("abc", encoding="utf-8")
    with pytest.raises(TrainingDataError, match="model_max_length=64"):
        build_dataset(path, CharTokenizer(), block_size=128)


def test_jsonl_keeps_line_separators_that_json_leaves_inside_strings(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028, \x0c, \x1c... unescaped; str.splitlines() would split there
    texts = ["a\u2028b", "c\x0cd", "e\x1cf"]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\r\n" for t in texts), encoding="utf-8")
    docs = read_documents(path)
    assert [d.text for d in docs] == texts
    assert [d.source for d in docs] == [f"{path}:{n}" for n in (1, 2, 3)]  # line numbers as an editor shows them


@pytest.mark.parametrize("name", ["data.json", "table.csv", "rows.parquet"])
def test_structured_files_are_not_read_as_text(tmp_path, name):
    path = tmp_path / name
    path.write_text('[{"text": "hello"}]\n', encoding="utf-8")
    with pytest.raises(TrainingDataError) as caught:
        read_documents(path)
    message = str(caught.value)
    assert str(path) in message and "would otherwise train on its markup" in message and ".jsonl" in message
