"""Chat and instruction data (hwrun.training.chat_data): assistant-only loss through the chat template, completion-only
loss, packing with restarting positions that keep examples apart, bad rows counted and named, datasets files, Hub ids
offline, and a LoRA run on the shipped chat sample."""

from __future__ import annotations

import json
from pathlib import Path

import hwrun
import pytest
from hwrun.errors import TrainingConfigError, TrainingDataError
from hwrun.training.chat_data import (
    IGNORE,
    DataFields,
    build_supervised,
    pack_examples,
    read_rows,
)

DATA = Path(hwrun.__file__).parent / "data"
SAMPLE = DATA / "chat_sample.jsonl"
TEMPLATE = DATA / "chat_template.jinja"
MODEL = Path(hwrun.DEFAULT_MODEL)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL)


def _chat(user: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _trained_text(tokenizer, dataset, index: int = 0) -> str:
    item = dataset[index]
    ids, labels = item["input_ids"].tolist(), item["labels"].tolist()
    return tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != IGNORE])


def test_shipped_model_has_no_chat_template_and_the_error_names_the_flag(tokenizer, tmp_path):
    assert not getattr(tokenizer, "chat_template", None)
    rows = read_rows(SAMPLE, max_bytes=1 << 20)
    with pytest.raises(TrainingDataError, match="--chat-template"):
        build_supervised(rows, tokenizer, 128, DataFields())


def test_chat_loss_is_on_the_assistant_turns_only(tokenizer, tmp_path):
    import copy

    tok = copy.deepcopy(tokenizer)
    path = _write(tmp_path / "c.jsonl", [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who rules?"},
        {"role": "assistant", "content": "The king."}, {"role": "user", "content": "And the castle?"},
        {"role": "assistant", "content": "It is cold."}]}])
    dataset = build_supervised(read_rows(path, max_bytes=1 << 20), tok, 128, DataFields(), chat_template=TEMPLATE)
    trained = _trained_text(tok, dataset)
    assert trained == "The king.</s>\nIt is cold.</s>\n"  # both assistant turns with their end of turn, nothing else
    assert "Who rules" not in trained and "Be brief" not in trained
    assert tok.chat_template == TEMPLATE.read_text(encoding="utf-8")  # saved with the final model


def test_generation_marks_give_the_assistant_mask(tokenizer, tmp_path):
    import copy

    tok = copy.deepcopy(tokenizer)
    marked = ("{% for m in messages %}<|{{ m['role'] }}|>\n{% if m['role'] == 'assistant' %}{% generation %}"
              "{{ m['content'] }}{{ eos_token }}{% endgeneration %}{% else %}{{ m['content'] }}{{ eos_token }}"
              "{% endif %}\n{% endfor %}")
    path = _write(tmp_path / "c.jsonl", [_chat("Who rules?", "The king.")])
    dataset = build_supervised(read_rows(path, max_bytes=1 << 20), tok, 64, DataFields(), chat_template=marked)
    assert _trained_text(tok, dataset) == "The king.</s>"


def test_prompt_completion_loss_is_on_the_completion(tokenizer, tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "The king said", "completion": " the castle was cold."}])
    dataset = build_supervised(read_rows(path, max_bytes=1 << 20), tokenizer, 64, DataFields())
    assert _trained_text(tokenizer, dataset) == " the castle was cold.</s>"
    assert "prompt/completion" in dataset.description


def test_packing_restarts_positions_and_masks_the_seams():
    blocks, labels, positions = pack_examples([([1, 2, 3], [1, 2, 3]), ([4, 5], [IGNORE, 5]), ([6, 7, 8], [6, 7, 8])],
                                              6, pad=0)
    assert blocks == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 0, 0, 0]]  # whole examples, the third does not fit the first
    assert positions == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 0, 1, 2]]
    assert labels == [[IGNORE, 2, 3, IGNORE, 5, IGNORE], [IGNORE, 7, 8, IGNORE, IGNORE, IGNORE]]
    one, _, _ = pack_examples([([1, 2], [1, 2]), ([3], [3])], 4, pad=0, packing=False)
    assert one == [[1, 2, 0, 0], [3, 0, 0, 0]]


def test_packed_examples_do_not_attend_to_each_other(tmp_path):
    """sdpa on the tiny model: the logits of an example packed behind another equal its logits alone."""
    import torch
    from hwrun.testing import build_tiny_model
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    first, second = torch.tensor([[5, 9, 14, 20, 7]]), torch.tensor([[11, 30, 8, 4]])
    packed = torch.cat([first, second], dim=1)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]])
    with torch.no_grad():
        alone = model(second, use_cache=False).logits
        inside = model(packed, position_ids=positions, use_cache=False).logits[:, 5:]
        crossing = model(packed, use_cache=False).logits[:, 5:]
    torch.testing.assert_close(inside, alone, rtol=1e-4, atol=1e-4)
    assert (crossing - alone).abs().max() > 1e-2  # without the positions the second example sees the first


def test_bad_rows_are_counted_and_named(tokenizer, tmp_path, caplog):
    import copy

    tok = copy.deepcopy(tokenizer)
    rows = [_chat("Who rules?", "The king."), {"text": "no messages"}, "not json",
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]},
            {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]},
            {"messages": [{"role": "wizard", "content": "a"}, {"role": "assistant", "content": "b"}]},
            _chat("And?", "It is cold.")]
    path = _write(tmp_path / "c.jsonl", rows)
    with caplog.at_level("WARNING"):
        dataset = build_supervised(read_rows(path, max_bytes=1 << 20), tok, 128, DataFields(), chat_template=TEMPLATE)
    report = dataset.report
    assert report.total == 7 and [where for where, _ in report.bad] == [f"{path}:{n}" for n in (2, 3, 4, 5, 6)]
    why = dict(report.bad)
    assert "no 'messages' field" in why[f"{path}:2"] and "not valid JSON" in why[f"{path}:3"]
    assert "empty assistant turn" in why[f"{path}:4"] and "not a string" in why[f"{path}:5"]
    assert "'wizard'" in why[f"{path}:6"]
    assert "5 of 7 rows not trained on" in dataset.description and "5 of 7 rows" in caplog.text
    all_bad = _write(tmp_path / "bad.jsonl", rows[1:6])
    with pytest.raises(TrainingDataError, match=r"every row is bad.*5 of 5 rows.*bad\.jsonl:1"):
        build_supervised(read_rows(all_bad, max_bytes=1 << 20), tok, 128, DataFields(messages_field="messages"),
                         chat_template=TEMPLATE)


def test_template_errors_are_bad_rows(tokenizer, tmp_path):
    import copy

    tok = copy.deepcopy(tokenizer)
    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turns') }}"
              "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    path = _write(tmp_path / "c.jsonl", [_chat("a", "b"), {"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}])
    dataset = build_supervised(read_rows(path, max_bytes=1 << 20), tok, 64, DataFields(), chat_template=strict)
    assert [where for where, _ in dataset.report.bad] == [f"{path}:2"]
    assert "no system turns" in dataset.report.bad[0][1]


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_datasets_files_with_a_text_field(tokenizer, tmp_path, suffix):
    import pandas

    frame = pandas.DataFrame({"body": ["The king said to the queen.", "The castle was cold."], "id": [1, 2]})
    path = tmp_path / f"d{suffix}"
    {".parquet": frame.to_parquet, ".csv": lambda p: frame.to_csv(p, index=False),
     ".json": lambda p: frame.to_json(p, orient="records")}[suffix](path)
    dataset = build_supervised(read_rows(path, max_bytes=1 << 20), tokenizer, 64, DataFields(text_field="body"))
    assert "2 texts" in dataset.description
    assert "The king said to the queen." in _trained_text(tokenizer, dataset)
    with pytest.raises(TrainingDataError, match=r"every row is bad.*no 'text' field"):
        build_supervised(read_rows(path, max_bytes=1 << 20), tokenizer, 64, DataFields(text_field="text"))


def test_hub_id_offline_is_an_error_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import hwrun.training.run as run

    monkeypatch.setattr(run, "_load", lambda *a, **k: pytest.fail("the model loaded"))
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingDataError, match=r"'someone/no-such-chats'.*HF_HUB_OFFLINE=1.*Fix"):
        hwrun.train(plan, "someone/no-such-chats", lora=True, output_dir=tmp_path / "out", max_steps=1)
    assert not (tmp_path / "out").exists()


def test_field_options_on_plain_text_are_refused(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text("The king said. " * 20, encoding="utf-8")
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    with pytest.raises(TrainingConfigError, match=r"messages_field='chat'.*plain text"):
        hwrun.train(plan, data, lora=True, output_dir=tmp_path / "out", max_steps=1, messages_field="chat")
    with pytest.raises(TrainingConfigError, match=r"text_field=3"):
        hwrun.train(plan, data, lora=True, output_dir=tmp_path / "out", max_steps=1, text_field=3)


def test_lora_on_the_shipped_chat_sample(tmp_path):
    plan = hwrun.plan(hwrun.DEFAULT_MODEL, device="cpu")
    result = hwrun.train(plan, SAMPLE, lora=True, chat_template=TEMPLATE, output_dir=tmp_path / "out", max_steps=2,
                         batch_size=2, block_size=128, plot=False, disable_tqdm=True)
    assert result.global_step == 2 and all(loss == loss for _, loss in result.losses)
    assert "12 chats (loss on the assistant turns)" in result.reasons["data"]
    assert "sdpa keeps the packed examples apart" in result.reasons["data"]
    assert "rope" not in result.reasons and "attention" not in result.reasons  # no patch that assumes 0..L-1
    saved = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = saved.get("chat_template") or (tmp_path / "out" / "chat_template.jinja").read_text(encoding="utf-8")
    assert "<|assistant|>" in template
