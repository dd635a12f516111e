"""Training data: read a text file, a JSONL file with `text`, or a folder of `.txt` files, then
tokenise and pack the documents into fixed-length blocks (no padding, so no wasted compute)."""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainingDataError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
#: formats that are not text to train on as they stand (their markup would be learnt)
STRUCTURED_SUFFIXES = (".json", ".csv", ".tsv", ".parquet", ".arrow", ".xlsx", ".gz", ".zip")


@dataclass(frozen=True)
class Document:
    """One training document and where it came from (file, and line for JSONL)."""

    text: str
    source: str


#: Default bound on the bytes read as training data (all files together): `read_documents(max_bytes=...)`,
#: `train(max_data_bytes=...)`, `hwrun train --max-data-size`. Packing keeps every token id in memory as a
#: Python int first, so a corpus far beyond this wants a pre-tokenised dataset passed to train() instead.
DEFAULT_MAX_DATA_BYTES = 4 * 1024**3


class _Budget:
    """What is left of the byte bound while several files are read."""

    def __init__(self, limit: int, root: Path) -> None:
        self.limit, self.left, self.root = limit, limit, root

    def read(self, path: Path) -> bytes:
        """`path`'s bytes, refused when it is not a regular file or would pass the bound (read at most
        bound + 1 bytes, so /proc files that report size 0 and growing files are bounded too)."""
        try:
            info = path.stat()
        except OSError as error:
            raise TrainingDataError(f"Training data {str(path)!r} cannot be read ({error.strerror or error}). "
                                    "Fix the path or its permissions.") from None
        if not stat.S_ISREG(info.st_mode):
            kind = "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else \
                ("a pipe" if stat.S_ISFIFO(info.st_mode) else "a socket or other special file")
            raise TrainingDataError(
                f"Training data {str(path)!r} is {kind}, not a regular file; it could be read without end. "
                "Fix: save the data to a text or JSONL file and pass that."
            )
        if info.st_size > self.left:
            self._refuse(path, info.st_size)
        try:
            with open(path, "rb") as handle:
                raw = handle.read(self.left + 1)
        except OSError as error:
            raise TrainingDataError(f"Training data {str(path)!r} cannot be read ({error.strerror or error}). "
                                    "Fix the path or its permissions.") from None
        if len(raw) > self.left:
            self._refuse(path, len(raw))
        self.left -= len(raw)
        return raw

    def _refuse(self, path: Path, size: int) -> None:
        where = str(path) if path == self.root else f"{path} (in {self.root})"
        raise TrainingDataError(
            f"Training data {where!s} takes the data past max_data_bytes={self.limit:,} ({size:,} bytes in this file, "
            f"{self.limit - self.left:,} read before it); hwrun reads text data whole before packing it. Fix: raise "
            "the bound (train(max_data_bytes=...), hwrun train --max-data-size 16G) if the memory is there, or "
            "tokenise it yourself and pass a dataset to train()."
        )


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise TrainingDataError(
            f"{path}:{line}: the file is not UTF-8 (byte {raw[error.start]:#04x} at offset "
            f"{error.start}); training data must be UTF-8 text. Fix: re-encode it, e.g. "
            f"`iconv -f latin1 -t utf-8 {path.name} > fixed.txt`."
        ) from None


def _read_utf8(path: Path, budget: _Budget | None = None) -> str:
    budget = budget or _Budget(DEFAULT_MAX_DATA_BYTES, path)
    return _decode(budget.read(path), path)


def _read_jsonl(path: Path, budget: _Budget) -> list[Document]:
    documents = []
    # split on "\n" only: str.splitlines() also splits on U+2028, \x0c, \x1c..., which JSON keeps
    # unescaped inside strings (json.dumps(ensure_ascii=False)), and line numbers would drift
    for number, line in enumerate(_read_utf8(path, budget).split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TrainingDataError(
                f"{where}: not valid JSON ({error.msg}); each line of a JSONL file must be one JSON "
                'object such as {"text": "..."}. Fix that line.'
            ) from None
        if not isinstance(record, dict) or "text" not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise TrainingDataError(
                f"{where}: the line has no \"text\" field (found {keys}); every JSONL line must be "
                'an object with a string "text" field. Fix: add it or drop the line.'
            )
        if not isinstance(record["text"], str):
            raise TrainingDataError(
                f"{where}: \"text\" is a {type(record['text']).__name__}, not a string; every "
                '"text" field must be a string. Fix that line.'
            )
        _check_surrogates(record["text"], where)
        if record["text"].strip():
            documents.append(Document(record["text"], where))
    return documents


def _check_surrogates(text: str, where: str) -> None:
    """A JSON string may escape half of a UTF-16 pair ("\\ud800") that no UTF-8 text can hold: the tokenizer
    refused it with a TypeError that surfaced as an internal error (issue 42). Name the line and the code point."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise TrainingDataError(
            f"{where}: \"text\" holds a lone surrogate U+{code:04X} at character {error.start} (half of a UTF-16 "
            "pair, from a JSON escape such as \\ud800 without its partner), which is not text. Fix: write the "
            "character whole (both halves of the escape, or the character itself), or drop it."
        ) from None


def read_documents(path: str | Path, *, max_bytes: int = DEFAULT_MAX_DATA_BYTES) -> list[Document]:
    """Read every document under `path` (text file, JSONL file, or a folder of .txt files).

    Raises TrainingDataError naming the file (and line) when the data is missing, empty,
    not UTF-8, a JSONL line lacks `text`, it is not a regular file (a device such as /dev/zero, a pipe),
    or all files together pass `max_bytes` (read no further than that, so memory stays bounded).
    """
    path = Path(path)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise TrainingDataError(f"max_bytes={max_bytes!r} must be an int >= 1 (bytes of training data to read at most).")
    budget = _Budget(max_bytes, path)
    if not path.exists():
        raise TrainingDataError(
            f"Training data {str(path)!r} does not exist; --data takes a text file, a JSONL file "
            "with a \"text\" field per line, or a folder of .txt files. Fix the path."
        )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() == ".txt")
        if not files:
            raise TrainingDataError(
                f"Training data folder {str(path)!r} holds no .txt files; a data folder is read as "
                "its .txt files (recursively). Fix: add .txt files or point --data at a file."
            )
        documents = []
        for file in files:
            text = _read_utf8(file, budget)
            if text.strip():
                documents.append(Document(text, str(file)))
    elif path.suffix.lower() in JSONL_SUFFIXES:
        documents = _read_jsonl(path, budget)
    elif path.suffix.lower() in STRUCTURED_SUFFIXES:
        raise TrainingDataError(
            f"Training data {str(path)!r} is a {path.suffix} file; hwrun reads plain text, JSONL "
            f"({', '.join(JSONL_SUFFIXES)}) or a folder of .txt files, and would otherwise train on "
            "its markup. Fix: for JSON lines, rename it to .jsonl (one {\"text\": ...} object per "
            "line); `hwrun train --data` and train() read JSON, Parquet and CSV rows through `datasets` "
            "(hwrun.training.chat_data), read_documents reads plain text only."
        )
    else:
        text = _read_utf8(path, budget)
        documents = [Document(text, str(path))] if text.strip() else []
    if not documents:
        raise TrainingDataError(
            f"Training data {str(path)!r} is empty (no non-blank text found); there is nothing to "
            "train on. Fix: give a file or folder with text in it."
        )
    return documents


class PackedDataset:
    """Fixed-length blocks of token ids (`input_ids`, `labels`), a torch-style map dataset that
    Trainer's default collator stacks without padding. There is no `attention_mask`: no block has
    padding, so the model needs only the causal mask (which SDPA applies itself, hwattn.causal)."""

    def __init__(self, blocks: torch.Tensor, sources: Sequence[str]) -> None:
        self.blocks = blocks
        self.sources = tuple(sources)

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = self.blocks[index]
        return {"input_ids": ids, "labels": ids.clone()}

    @property
    def tokens(self) -> int:
        """Number of tokens across all blocks."""
        return int(self.blocks.numel())


def pack_token_ids(sequences: Sequence[Sequence[int]], block_size: int, *,
                   separator: int | None) -> list[list[int]]:
    """Concatenate token sequences (separated by `separator`, usually EOS) and cut them into
    `block_size` blocks; the ragged tail is dropped, unless it is the only block."""
    if block_size < 2:
        raise TrainingDataError(f"block_size={block_size} is too small; it must be >= 2. Fix: raise it.")
    stream: list[int] = []
    for sequence in sequences:
        stream.extend(sequence)
        if separator is not None:
            stream.append(separator)
    if len(stream) < block_size:
        if len(stream) < 2:
            return []
        logger.warning("Only %d tokens of data, fewer than block_size=%d: training on one "
                       "shorter block.", len(stream), block_size)
        return [stream]
    usable = len(stream) - len(stream) % block_size
    if usable != len(stream):
        logger.info("Packing drops the last %d tokens (a partial block of %d).",
                    len(stream) - usable, block_size)
    return [stream[i:i + block_size] for i in range(0, usable, block_size)]


def build_dataset(data: str | Path | Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                  block_size: int = 512) -> PackedDataset:
    """Read `data` (a path, or documents from `read_documents`), tokenise every document, and
    pack them into `block_size` blocks."""
    import torch

    documents = read_documents(data) if isinstance(data, (str, Path)) else list(data)
    path = documents[0].source.rsplit(":", 1)[0] if documents else str(data)
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < block_size:
        raise TrainingDataError(
            f"block_size={block_size} is longer than the tokenizer's model_max_length={limit}; "
            f"blocks must fit the model. Fix: pass block_size <= {limit}."
        )
    sequences = [tokenizer(doc.text, add_special_tokens=True)["input_ids"] for doc in documents]
    separator = tokenizer.eos_token_id
    blocks = pack_token_ids(sequences, block_size, separator=separator)
    if not blocks:
        raise TrainingDataError(
            f"Training data {str(path)!r} tokenises to fewer than 2 tokens; nothing to train on. "
            "Fix: give more text."
        )
    return PackedDataset(torch.tensor(blocks, dtype=torch.long), [d.source for d in documents])
