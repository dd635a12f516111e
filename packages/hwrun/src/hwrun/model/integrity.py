"""Integrity at load (issue 42 point 2): a folder `hwrun train` wrote is checked against its record before it loads.

`hwrun train` records every file it writes in `hwrun_output.json` (size, sha256 and, for safetensors, the sha256
of the header). Loading such a folder (an adapter, a merged or fully fine-tuned model) checks the final model's
weights and configs against that record: every byte (sha256) when they are small (adapters, any output up to
`FULL_HASH_BYTES`), else the size and the safetensors header of each weight file, and every byte with
`verify=True` (`hwrun generate --verify`). A file that differs is a `ModelIntegrityError` naming it, what differs,
and the fix, before anything loads; before, overwriting 4 KiB of an adapter generated nothing with exit 0.

Tokenizer files, the model card and the generation config are not compared: users edit them on purpose.
Folders without a record (anyone else's model) are not checked here; their safetensors are read by
`safetensors_header` so a damaged header or a truncated file is named clearly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

from ..errors import ModelIntegrityError

logger = logging.getLogger(__name__)

#: hwrun's record of what it wrote into an output folder (hwrun.training.output.OUTPUT_MANIFEST).
OUTPUT_RECORD = "hwrun_output.json"
#: Up to this many bytes of weights and configs, a load compares every byte (sha256): about a second of reading
#: from a warm page cache; beyond it, the size and safetensors header of each weight file unless verify=True.
FULL_HASH_BYTES = 512 * 1024**2
#: The files of a final model that a load compares: weights and the configs that shape them.
CHECKED_SUFFIXES = (".safetensors", ".safetensors.index.json")
CHECKED_NAMES = ("config.json", "adapter_config.json")
#: A safetensors header larger than this is not a header (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def safetensors_header(path: Path) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file, checked to be a JSON object whose tensors
    end where the file ends. A damaged or truncated file is a ModelIntegrityError naming it."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ModelIntegrityError(f"{path} is {size} bytes, shorter than a safetensors header: the file is "
                                      "truncated or not safetensors. Fix: download or save it again.")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise ModelIntegrityError(f"{path}: its safetensors header claims {length:,} bytes in a file of "
                                      f"{size:,}: the file is damaged or truncated. Fix: download or save it again.")
        header = handle.read(length)
    try:
        tensors = json.loads(header)
    except ValueError as error:
        raise ModelIntegrityError(f"{path}: its safetensors header is not valid JSON ({error}): the file is damaged. "
                                  "Fix: download or save it again.") from None
    if not isinstance(tensors, dict):
        raise ModelIntegrityError(f"{path}: its safetensors header is not a JSON object: the file is damaged. "
                                  "Fix: download or save it again.")
    try:
        end = max((int(info["data_offsets"][1]) for name, info in tensors.items() if name != "__metadata__"),
                  default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise ModelIntegrityError(f"{path}: its safetensors header has a tensor without valid data_offsets: the "
                                  "file is damaged. Fix: download or save it again.") from None
    if 8 + length + end != size:
        state = "truncated" if size < 8 + length + end else "longer than its tensors"
        raise ModelIntegrityError(f"{path} is {size:,} bytes but its header describes {8 + length + end:,}: the file "
                                  f"is {state}. Fix: download or save it again.")
    return raw + header


def header_sha256(path: Path) -> str:
    """sha256 of a safetensors file's length prefix and JSON header (what `hwrun_output.json` records)."""
    return hashlib.sha256(safetensors_header(path)).hexdigest()


def _checked(name: str) -> bool:
    return name in CHECKED_NAMES or name.endswith(CHECKED_SUFFIXES)


def _record(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / OUTPUT_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("%s is unreadable (%s): the model in %s loads without its checksums compared.",
                       folder / OUTPUT_RECORD, error, folder)
        return None
    return record if isinstance(record, dict) else None


def verify_output(folder: str | Path, *, full: bool = False) -> str | None:
    """Compare the final model `hwrun train` left in `folder` with its record (see the module docstring); returns
    what was compared, or None when `folder` holds no such record. Raises ModelIntegrityError on a difference."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    record = _record(folder)
    if record is None:
        return None
    final, files = record.get("final"), record.get("files")
    if not isinstance(final, dict) or not isinstance(files, dict) or not isinstance(final.get("files"), list):
        return None  # checkpoints only, no final model yet: nothing to compare
    names = sorted(name for name in final["files"] if isinstance(name, str) and _checked(name))
    entries = {name: files.get(name) for name in names}
    total = sum(entry.get("size", 0) for entry in entries.values() if isinstance(entry, dict))
    whole = full or total <= FULL_HASH_BYTES
    headers_only = []
    for name, entry in entries.items():
        path = folder / name
        if not isinstance(entry, dict):
            continue
        if not path.is_file():
            _refuse(folder, name, "is missing")
        size = path.stat().st_size
        if size != entry.get("size"):
            _refuse(folder, name, f"has {size:,} bytes, and hwrun wrote {entry.get('size'):,}")
        if whole or not name.endswith(".safetensors"):
            if entry.get("sha256") and sha256_file(path) != entry["sha256"]:
                _refuse(folder, name, "does not match the sha256 hwrun recorded when it wrote it (same size, other "
                                      "bytes: damaged or changed since)")
        elif entry.get("header_sha256"):
            if header_sha256(path) != entry["header_sha256"]:
                _refuse(folder, name, "has another safetensors header than the one hwrun wrote")
            headers_only.append(name)
        else:
            safetensors_header(path)
            headers_only.append(name)
    if headers_only:
        how = (f"sha256 of the configs, size and safetensors header of {', '.join(headers_only)} ({total:,} bytes: "
               "every byte with verify=True / --verify)")
        logger.info("%s: %s", folder, how)
        return how
    return f"sha256 of {', '.join(names)} ({total:,} bytes)"


def _refuse(folder: Path, name: str, what: str) -> None:
    raise ModelIntegrityError(
        f"{folder / name} {what}, per {folder / OUTPUT_RECORD}: loading it would run a damaged or changed model. Fix: "
        "restore the file from a copy, or move it away and write the final model again from the run's last "
        f"checkpoint (`hwrun train ... --output {folder} --resume` with the run's options); if you changed it on "
        f"purpose, delete {folder / OUTPUT_RECORD} to load the folder unchecked."
    )
