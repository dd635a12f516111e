"""Chat and instruction data for `train()`: rows with `messages` (OpenAI-style role/content lists), `prompt` /
`completion` pairs, or a text field, from JSONL, JSON, Parquet, CSV/TSV or Arrow files (the last four through
`datasets`) or a `datasets` Hub id.

- `messages` are rendered with the model's chat template (`tokenizer.apply_chat_template`, or the one given with
  `chat_template=` / `--chat-template`); the loss is on the assistant turns only (labels -100 elsewhere, as TRL's
  SFT `assistant_only_loss`). The assistant spans come from `return_assistant_tokens_mask` when the template marks
  them with `{% generation %}`, else from rendering the conversation prefix by prefix and taking what each
  assistant turn adds (the template's end-of-turn tokens included, so the model learns to stop).
- `prompt` / `completion`: the loss on the completion only (strings, or message lists rendered as a chat).
- text rows (`text_field`): the loss on every token.

Examples are packed whole into `block_size` blocks (first fit, in order), each block's `position_ids` restarting at
0 per example, the first token of every example and the padding at a block's end labelled -100, so no example
learns from another. Transformers turns the restarting positions into attention boundaries: flash attention
through its varlen path, sdpa / eager / flex through a block-diagonal mask (`masking_utils`, built when no
attention_mask is given). hwrun's own causal SDPA (`hwattn.causal`, used for plain-text blocks) ignores
boundaries, so these blocks never get it. `packing=False` gives every example its own block.

Bad rows (a missing field, wrong types, an unknown role, an empty assistant turn, a template error, nothing left
to train on) are counted and reported with their first line numbers; data where every row is bad is a
`TrainingDataError` before the model loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainingDataError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

IGNORE = -100
#: files read through `datasets` (the builder name, and its keywords)
DATASETS_FORMATS = {".json": ("json", {}), ".parquet": ("parquet", {}), ".csv": ("csv", {}),
                    ".tsv": ("csv", {"delimiter": "\t"}), ".arrow": ("arrow", {})}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
ROLES = ("system", "user", "assistant", "tool", "developer")
#: a Hub dataset id: `name` or `owner/name` (no file suffix hwrun reads, no other path separators)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
#: how many bad rows a report names
SHOWN = 5
#: the attention implementations whose packed-example boundaries Transformers honours, and how
BOUNDARIES = {
    "flash_attention_2": "flash attention's varlen path (cu_seqlens from the restarting position_ids)",
    "flash_attention_3": "flash attention's varlen path (cu_seqlens from the restarting position_ids)",
    "sdpa": "a block-diagonal mask Transformers builds from the restarting position_ids (masking_utils)",
    "eager": "a block-diagonal mask Transformers builds from the restarting position_ids (masking_utils)",
    "flex_attention": "a block-diagonal block mask Transformers builds from the restarting position_ids",
}


@dataclass(frozen=True)
class DataFields:
    """Which columns hold what: `text_field` (plain text), `messages_field` (chat), `prompt_field` /
    `completion_field` (instruction pairs). `None` for text/messages: detect from the rows."""

    text_field: str | None = None
    messages_field: str | None = None
    prompt_field: str = "prompt"
    completion_field: str = "completion"


@dataclass
class Rows:
    """Rows read from a file or a Hub dataset, each with where it came from (`file:line` or `id[row]`)."""

    rows: list[tuple[Any, str]]
    source: str


@dataclass
class Report:
    """Bad rows, counted per reason, the first `SHOWN` named."""

    total: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.bad.append((where, why))

    def summary(self) -> str:
        shown = "; ".join(f"{where}: {why}" for where, why in self.bad[:SHOWN])
        more = f" (and {len(self.bad) - SHOWN} more)" if len(self.bad) > SHOWN else ""
        return f"{len(self.bad)} of {self.total} rows not trained on: {shown}{more}"


def is_hub_id(data: Any) -> bool:
    """`data` names a `datasets` Hub id: a string that is no existing path and looks like `owner/name`."""
    if not isinstance(data, str) or os.path.exists(data) or not _HUB_ID.match(data):
        return False
    suffix = Path(data).suffix.lower()
    return suffix not in (*DATASETS_FORMATS, *JSONL_SUFFIXES, ".txt", ".text", ".md")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise TrainingDataError(
            "Reading JSON, Parquet, CSV or Arrow training data, or a Hub dataset id, needs the `datasets` package, "
            "which is not installed. Fix: pip install 'hwrun[train]' (or pip install datasets), or pass a .txt or "
            ".jsonl file."
        ) from None
    return datasets


def read_rows(data: str | os.PathLike, *, max_bytes: int) -> Rows:
    """The rows of a JSONL/JSON/Parquet/CSV/TSV/Arrow file (within `max_bytes`) or of a Hub dataset's train split."""
    if is_hub_id(data):
        return _hub_rows(str(data))
    path = Path(data)
    suffix = path.suffix.lower()
    size = path.stat().st_size
    if size > max_bytes:
        raise TrainingDataError(
            f"Training data {str(path)!r} has {size:,} bytes, past max_data_bytes={max_bytes:,}. Fix: raise the "
            "bound (train(max_data_bytes=...), hwrun train --max-data-size 16G) if the memory is there."
        )
    if suffix in JSONL_SUFFIXES:
        return _jsonl_rows(path)
    builder, keywords = DATASETS_FORMATS[suffix]
    datasets = _datasets()
    import tempfile

    # a private cache, removed afterwards: a local file needs no copy in ~/.cache/huggingface
    with tempfile.TemporaryDirectory(prefix="hwrun-data-") as cache:
        try:
            table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache,
                                          **keywords)
        except Exception as error:  # the builders raise many kinds; each is a file that cannot be read
            raise TrainingDataError(
                f"Training data {str(path)!r} could not be read as {suffix} by datasets "
                f"({type(error).__name__}: {' '.join(str(error).split())[:300]}). Fix the file, or convert it "
                "to JSONL (one JSON object per line)."
            ) from None
        rows = table.to_list()
    # JSON arrays and JSON lines: line numbers are not known, so rows are numbered (1 = the first row)
    return Rows([(row, f"{path} row {number}") for number, row in enumerate(rows, start=1)], str(path))


def _jsonl_rows(path: Path) -> Rows:
    text = path.read_bytes().decode("utf-8", errors="strict") if path.stat().st_size else ""
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            rows.append((json.loads(line), where))
        except json.JSONDecodeError as error:
            rows.append((_Invalid(f"not valid JSON ({error.msg})"), where))
    return Rows(rows, str(path))


@dataclass(frozen=True)
class _Invalid:
    why: str


def _hub_rows(name: str) -> Rows:
    """A Hub dataset's train split. Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) only the local cache is read;
    either way a failure names the id and the fix, before the model loads."""
    datasets = _datasets()
    offline = next((f"{key}={os.environ[key]}" for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
                    if os.environ.get(key, "").strip().lower() in ("1", "true", "yes", "on")), None)
    try:
        table = datasets.load_dataset(name, split="train")
    except Exception as error:
        detail = f"{type(error).__name__}: {' '.join(str(error).split())[:240]}"
        if offline:
            raise TrainingDataError(
                f"--data {name!r} is read as a Hub dataset id, and {offline} allows only the local cache, which does "
                f"not hold it ({detail}). Fix: unset {offline.split('=')[0]} and run once with network to download "
                "it, or pass a local file (JSONL, JSON, Parquet, CSV) or folder."
            ) from None
        raise TrainingDataError(
            f"--data {name!r} is no local file or folder, so it was read as a Hub dataset id, and datasets could not "
            f"load it ({detail}). Fix: check the id and the network (or HF_TOKEN for a gated dataset), or pass a "
            "local file; a path that should exist must be spelt right."
        ) from None
    return Rows([(row, f"{name}[{index}]") for index, row in enumerate(table.to_list())], name)


def layout(rows: Sequence[tuple[Any, str]], fields: DataFields) -> str:
    """'messages', 'prompt' or 'text': the field options when given, else what the rows hold (the first row that
    is an object with a known field decides)."""
    if fields.messages_field:
        return "messages"
    if fields.text_field:
        return "text"
    for row, _where in rows:
        if isinstance(row, Mapping):
            if "messages" in row:
                return "messages"
            if fields.prompt_field in row and fields.completion_field in row:
                return "prompt"
            if "text" in row:
                return "text"
    keys = sorted(next((row for row, _ in rows if isinstance(row, Mapping)), {}))
    raise TrainingDataError(
        f"The rows hold none of the fields hwrun reads (found {keys}): \"messages\" (a chat), \"prompt\" + "
        "\"completion\", or \"text\". Fix: name the field with --messages-field / --text-field "
        "(messages_field= / text_field=), or rename the columns."
    )


def _check_messages(messages: Any) -> str | None:
    """Why `messages` is not a chat hwrun can train on, or None."""
    if not isinstance(messages, list) or not messages:
        return f"messages is {'an empty list' if messages == [] else type(messages).__name__}, not a list of turns"
    for index, turn in enumerate(messages):
        if not isinstance(turn, Mapping):
            return f"turn {index} is a {type(turn).__name__}, not an object with role and content"
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            return f"turn {index} has role {role!r} (one of {', '.join(ROLES)})"
        if not isinstance(content, str):
            return f"turn {index} ({role}) has content of type {type(content).__name__}, not a string"
        if role == "assistant" and not content.strip():
            return f"turn {index} is an empty assistant turn"
    if not any(turn["role"] == "assistant" for turn in messages):
        return "no assistant turn (nothing to train on)"
    return None


class ChatRenderer:
    """Token ids and labels (-100 outside the assistant turns) of one conversation, through `tokenizer`'s chat
    template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None) or ""
        self.generation_marks = "generation" in template and "{%" in template and "endgeneration" in template

    def _render(self, messages: list, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def spans(self, messages: list) -> tuple[str, list[tuple[int, int]]]:
        """(the whole rendering, character spans of what each assistant turn adds)."""
        full = self._render(messages, False)
        spans = []
        for index, turn in enumerate(messages):
            if turn["role"] != "assistant":
                continue
            before = self._render(messages[:index], True) if index else ""
            upto = self._render(messages[: index + 1], False)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise ValueError("the chat template renders a conversation's earlier turns differently once later "
                                 "turns follow, so the assistant turns cannot be found by prefix; a template with "
                                 "{% generation %} marks works")
            if len(upto) > len(before):
                spans.append((len(before), len(upto)))
        return full, spans

    def __call__(self, messages: list) -> tuple[list[int], list[int]]:
        tokenizer = self.tokenizer
        if self.generation_marks:
            out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
            ids = list(out["input_ids"])
            mask = list(out["assistant_masks"])
            if any(mask):
                return ids, [i if m else IGNORE for i, m in zip(ids, mask, strict=True)]
        full, spans = self.spans(messages)
        if getattr(tokenizer, "is_fast", False):
            encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(encoded["input_ids"])
            labels = [token if any(start < end and a <= start < b for a, b in spans) else IGNORE
                      for token, (start, end) in zip(ids, encoded["offset_mapping"], strict=True)]
            return ids, labels
        ids, labels, at = [], [], 0  # a slow tokenizer: each piece on its own
        for a, b in [*spans, (len(full), len(full))]:
            for piece, trained in ((full[at:a], False), (full[a:b], True)):
                if piece:
                    part = tokenizer(piece, add_special_tokens=False)["input_ids"]
                    ids += part
                    labels += part if trained else [IGNORE] * len(part)
            at = b
        return ids, labels


def set_chat_template(tokenizer: Any, template: str | os.PathLike | None) -> str | None:
    """Put `template` (a Jinja file or the template text) on `tokenizer`; returns what was done, or None."""
    if template is None:
        return None
    text = str(template)
    if "{%" not in text and "{{" not in text:
        path = Path(text)
        if not path.is_file():
            raise TrainingDataError(f"chat_template={text!r} (--chat-template) is neither a Jinja template (no {{% or "
                                    "{{) nor a file. Fix: pass the path of a .jinja file or the template itself.")
        text = path.read_text(encoding="utf-8")
        tokenizer.chat_template = text
        return f"chat template from {path}"
    tokenizer.chat_template = text
    return "chat template given as text"


def _example(row: Any, kind: str, fields: DataFields, tokenizer: Any, render: ChatRenderer | None,
             eos: int | None) -> tuple[list[int], list[int]]:
    """(ids, labels) of one row; raises ValueError with the reason for a bad row."""
    if isinstance(row, _Invalid):
        raise ValueError(row.why)
    if not isinstance(row, Mapping):
        raise ValueError(f"the row is a {type(row).__name__}, not an object")
    if kind == "messages":
        name = fields.messages_field or "messages"
        if name not in row:
            raise ValueError(f"no {name!r} field (found {sorted(row)})")
        messages = row[name]
        problem = _check_messages(messages)
        if problem:
            raise ValueError(problem)
        return render([dict(turn) for turn in messages])
    if kind == "prompt":
        prompt, completion = row.get(fields.prompt_field), row.get(fields.completion_field)
        if prompt is None or completion is None:
            raise ValueError(f"no {fields.prompt_field!r} or {fields.completion_field!r} field (found {sorted(row)})")
        if isinstance(prompt, list) and isinstance(completion, list):  # conversational: loss on the completion turns
            if render is None:
                raise ValueError("message lists need a chat template")
            problem = _check_messages(prompt + completion)
            if problem:
                raise ValueError(problem)
            marked = [dict(t) for t in prompt] + [dict(t) for t in completion]
            ids, labels = render(marked)
            if not any(label != IGNORE for label in labels):
                raise ValueError("the completion adds no tokens")
            return ids, labels
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise ValueError(f"{fields.prompt_field!r} is a {type(prompt).__name__} and {fields.completion_field!r} "
                             f"a {type(completion).__name__}: both must be strings (or both message lists)")
        if not completion.strip():
            raise ValueError(f"{fields.completion_field!r} is empty")
        head = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        tail = tokenizer(completion, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        return head + tail, [IGNORE] * len(head) + tail
    name = fields.text_field or "text"
    text = row.get(name)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"no {name!r} field (found {sorted(row)})" if name not in row else
                         f"{name!r} is {'empty' if isinstance(text, str) else 'a ' + type(text).__name__}")
    ids = tokenizer(text, add_special_tokens=True)["input_ids"] + ([eos] if eos is not None else [])
    return ids, list(ids)


class SupervisedBlocks:
    """Packed blocks with labels (-100 where nothing is learnt) and `position_ids` restarting per example: a
    torch-style map dataset that Trainer's default collator stacks. `blocks` are the input ids."""

    def __init__(self, blocks: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, description: str,
                 report: Report, data_sha256: str) -> None:
        self.blocks, self.labels, self.positions = blocks, labels, positions
        self.description, self.report, self.data_sha256 = description, report, data_sha256

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.blocks[index], "labels": self.labels[index],
                "position_ids": self.positions[index]}

    @property
    def tokens(self) -> int:
        return int(self.blocks.numel())


def pack_examples(examples: Sequence[tuple[list[int], list[int]]], block_size: int, pad: int, *,
                  packing: bool = True) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Whole examples into `block_size` blocks in order (a new block when the next does not fit; one per block
    with `packing=False`), padded at the end: (ids, labels, position ids). Each example's first label is -100
    (it would be learnt from the example before it); the padding is labelled -100 and numbered on from 0."""
    blocks: list[list[int]] = []
    labels: list[list[int]] = []
    positions: list[list[int]] = []
    current: tuple[list[int], list[int], list[int]] = ([], [], [])

    def close() -> None:
        ids, labs, pos = current
        if ids:
            fill = block_size - len(ids)
            blocks.append(ids + [pad] * fill)
            labels.append(labs + [IGNORE] * fill)
            positions.append(pos + list(range(fill)))

    for ids, labs in examples:
        if current[0] and (not packing or len(current[0]) + len(ids) > block_size):
            close()
            current = ([], [], [])
        current[0].extend(ids)
        current[1].extend([IGNORE, *labs[1:]])
        current[2].extend(range(len(ids)))
    close()
    return blocks, labels, positions


def boundary_note(attention: str | None, packing: bool) -> str:
    """Whether the model's attention keeps packed examples apart, for the run's reasons."""
    if not packing:
        return "packing off: one example per block, nothing to keep apart"
    how = BOUNDARIES.get(attention or "")
    if how:
        return f"{attention} keeps the packed examples apart through {how}"
    return (f"attention {attention!r} is not known to honour position_ids boundaries, so packed examples may attend "
            "to each other; pass packing=False (--no-packing) for one example per block")


def build_supervised(rows: Rows, tokenizer: Any, block_size: int, fields: DataFields, *,
                     packing: bool = True, attention: str | None = None,
                     chat_template: str | os.PathLike | None = None) -> SupervisedBlocks:
    """Tokenise `rows` (chat, prompt/completion or text), with the loss only where it belongs, and pack them;
    bad rows are counted and logged, all-bad data is a TrainingDataError."""
    import torch

    if not rows.rows:
        raise TrainingDataError(f"Training data {rows.source!r} holds no rows; there is nothing to train on.")
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < block_size:
        raise TrainingDataError(
            f"block_size={block_size} is longer than the tokenizer's model_max_length={limit}; "
            f"blocks must fit the model. Fix: pass block_size <= {limit}."
        )
    kind = layout(rows.rows, fields)
    template_note = set_chat_template(tokenizer, chat_template)
    render = None
    if kind == "messages" or (kind == "prompt" and any(
            isinstance(r, Mapping) and isinstance(r.get(fields.prompt_field), list) for r, _ in rows.rows)):
        if not getattr(tokenizer, "chat_template", None):
            raise TrainingDataError(
                f"Training data {rows.source!r} holds chats (message lists), and the model's tokenizer has no chat "
                "template to render them with. Fix: pass one with --chat-template FILE.jinja (chat_template=; hwrun "
                "ships a minimal one: hwrun/data/chat_template.jinja), or train a model whose tokenizer has one."
            )
        render = ChatRenderer(tokenizer)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if eos is not None else 0)
    report = Report(total=len(rows.rows))
    examples = []
    digest = hashlib.sha256()
    for row, where in rows.rows:
        try:
            ids, labels = _example(row, kind, fields, tokenizer, render, eos)
        except Exception as error:  # a bad row, whatever raised it (a template's own error too): counted, named
            report.add(where, " ".join(str(error).split())[:200] or type(error).__name__)
            continue
        if not any(label != IGNORE for label in labels[1:]):
            report.add(where, "no token to train on")
            continue
        if len(ids) > block_size:
            report.truncated.append(where)
            ids, labels = ids[:block_size], labels[:block_size]
        digest.update(json.dumps(row, sort_keys=True, default=str).encode("utf-8"))
        examples.append((ids, labels))
    if not examples:
        raise TrainingDataError(f"Training data {rows.source!r}: every row is bad, nothing to train on. "
                                f"{report.summary()}. Fix those rows (or name the fields with --messages-field / "
                                "--text-field).")
    if report.bad:
        logger.warning("Training data %s: %s.", rows.source, report.summary())
    if report.truncated:
        logger.warning("Training data %s: %d example(s) longer than block_size=%d were cut to it (first: %s).",
                       rows.source, len(report.truncated), block_size, ", ".join(report.truncated[:SHOWN]))
    blocks, labels, positions = pack_examples(examples, block_size, pad, packing=packing)
    trained = sum(label != IGNORE for block in labels for label in block)
    what = {"messages": "chats (loss on the assistant turns)", "prompt": "prompt/completion pairs (loss on the "
            "completion)", "text": "texts (loss on every token)"}[kind]
    description = (f"{len(examples)} {what} from {rows.source} in {len(blocks)} blocks of {block_size} tokens, "
                   f"{trained:,} trained tokens; {boundary_note(attention, packing)}")
    if template_note:
        description += f"; {template_note}"
    if report.bad:
        description += f"; {report.summary()}"
    if report.truncated:
        description += f"; {len(report.truncated)} example(s) cut to block_size"
    logger.info("%s", description)
    return SupervisedBlocks(torch.tensor(blocks, dtype=torch.long), torch.tensor(labels, dtype=torch.long),
                            torch.tensor(positions, dtype=torch.long), description, report, digest.hexdigest())


def wants_rows(data: Any, fields: DataFields) -> bool:
    """True when `data` goes through this module rather than hwrun's plain-text reader: a Hub id, a file
    `datasets` reads, a field option, or JSONL whose rows are chats or prompt/completion pairs."""
    if is_hub_id(data):
        return True
    path = Path(data)
    suffix = path.suffix.lower()
    if path.is_dir() or not path.is_file():
        return False
    if suffix in DATASETS_FORMATS:
        return True
    if suffix not in JSONL_SUFFIXES:
        return False
    if fields.messages_field or fields.text_field not in (None, "text"):
        return True
    with open(path, "rb") as handle:  # the first object line decides
        for raw in handle:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except ValueError:
                    return False  # the text reader names the line
                return isinstance(first, Mapping) and ("messages" in first or (
                    fields.prompt_field in first and fields.completion_field in first))
    return False
