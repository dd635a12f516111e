"""The output folder of a training run. Before anything loads, a folder that would lose a file is refused;
while the run writes, `hwrun_output.json` records every file hwrun put there (size, mtime, sha256), so
that hwrun replaces or deletes only its own files, never one a user put there."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import TrainingConfigError
from .checkpoints import (
    _CHECKPOINT_RE,
    FINAL_FILES,
    MANIFEST_NAME,
    STAGING_PREFIX,
    _manifest,
    check_checkpoint,
    checkpoint_run,
    list_checkpoints,
    sha256_of,
)

logger = logging.getLogger(__name__)

#: hwrun's record of the files it wrote into an output folder.
OUTPUT_MANIFEST = "hwrun_output.json"
#: Names that only hwrun uses (staging folders, write probes): always its own.
OWN_PREFIXES = (STAGING_PREFIX, ".hwrun-", "hwrun-tensorboard")  # the last: hwrun.training.events.EVENTS_DIR
#: Top-level names a run may write: the final model (adapter or merged), its tokenizer, PEFT's model card,
#: the loss plot, and the checkpoints (globs).
WRITTEN_NAMES = (*FINAL_FILES, "adapter", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                 "vocab.json", "merges.txt", "tokenizer.model", "spiece.model", "vocab.txt", "README.md", "loss.png",
                 "model-*-of-*.safetensors", "checkpoint-*")
#: Of those, what a run leaves out when a user's file holds the name (PEFT's model card, the plot).
OPTIONAL_NAMES = ("README.md", "loss.png")

#: In a folder from before the record, the one top-level file taken as hwrun's without a checkpoint twin.
LEGACY_PLOT = "loss.png"

_FLAGS = {"overwrite": "--overwrite / overwrite=True"}


def writable_output_dir(output_dir: str | os.PathLike) -> Path:
    """The output folder, refused before anything loads when it is empty (`''` would train into the
    current folder, issue 27), an existing file, or not writable; write-tested otherwise (in a single
    process, folders created for the test are removed again, so a later refusal leaves the disk as it was)."""
    if not isinstance(output_dir, (str, os.PathLike)) or str(output_dir).strip() == "":
        raise TrainingConfigError(
            f"output_dir={output_dir!r} is empty: the run would write its checkpoints, model card and model into "
            "the current folder, over files that are not hwrun's. Fix: name a folder (e.g. --output my-finetune)."
        )
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise TrainingConfigError(f"output_dir={str(path)!r} is an existing file, not a folder. Fix: name a folder.")
    created = [folder for folder in (path, *path.parents) if not folder.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hwrun-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):  # one process: leave no trace for a refusal;
            for folder in created:  # with several ranks another one may be writing its probe there right now
                folder.rmdir()
    except OSError as error:
        raise TrainingConfigError(
            f"output_dir={str(path)!r} cannot be written ({error.strerror or error}): checkpoints and the final "
            "model would fail only after training. Fix: choose a folder you can write to."
        ) from error
    return path


def read_record(path: Path) -> dict:
    """The folder's `hwrun_output.json` ({} when there is none or it is unreadable)."""
    try:
        record = json.loads((path / OUTPUT_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else {}


def _write_record(path: Path, record: dict) -> None:
    """Write the record atomically (temporary file, fsync, rename)."""
    temporary = path / f".hwrun-{OUTPUT_MANIFEST}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path / OUTPUT_MANIFEST)


def _file_entry(file: Path, sha256: str | None = None) -> dict:
    """size, mtime and sha256 of a file hwrun wrote; for safetensors also the sha256 of its header, which a load
    of a large model compares by default (hwrun.model.integrity)."""
    from ..errors import ModelIntegrityError
    from ..model.integrity import header_sha256

    info = file.stat()
    entry = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": sha256 or sha256_of(file)}
    if file.name.endswith(".safetensors"):
        try:
            entry["header_sha256"] = header_sha256(file)
        except ModelIntegrityError as error:  # not whole: the full sha256 alone is recorded
            logger.warning("%s", error)
    return entry


def _matches(file: Path, entry: object) -> bool:
    """The file is the one recorded: same size, and the same mtime or (copied with a new mtime) the same sha256."""
    if not isinstance(entry, dict) or file.is_symlink() or not file.is_file():
        return False
    info = file.stat()
    if info.st_size != entry.get("size"):
        return False
    return info.st_mtime_ns == entry.get("mtime_ns") or sha256_of(file) == entry.get("sha256")


def _written_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in WRITTEN_NAMES)


def _checkpoint_is_whole(folder: Path) -> bool:
    """A checkpoint folder is hwrun's only if its manifest lists every file in it (a note or an eval output
    someone added inside makes it foreign, so rotation or a fresh start never deletes it). One whose manifest is
    there but damaged (unreadable, not complete) is hwrun's too: no other tool writes that name, and a resume
    passes over it to the newest checkpoint that verifies, as its warning says (issue 42: it refused the folder)."""
    manifest, _ = _manifest(folder)
    if manifest is None:
        return (folder / MANIFEST_NAME).is_file()
    listed = set(manifest.get("files", {})) | {MANIFEST_NAME}
    return all(p.relative_to(folder).as_posix() in listed for p in folder.rglob("*") if not p.is_dir())


def _same_as_in_checkpoint(entry: Path, newest: Path | None) -> bool:
    """Before the record existed, a top-level file is hwrun's only if the newest checkpoint holds the same
    name with the same bytes (hwrun's final save copies them from there); anything else is the user's."""
    if newest is None or entry.is_symlink() or not entry.is_file():
        return False
    twin = newest / entry.name
    if twin.is_symlink() or not twin.is_file() or twin.stat().st_size != entry.stat().st_size:
        return False
    return sha256_of(twin) == sha256_of(entry)


def _owned(path: Path, name: str, files: dict, legacy: Path | None) -> bool:
    """Whether hwrun wrote the top-level entry `name` of `path` (`legacy`: the newest checkpoint of a folder
    from before the record, or None)."""
    if name == OUTPUT_MANIFEST or name.startswith(OWN_PREFIXES):
        return True
    entry = path / name
    if entry.is_symlink():
        return False
    if _CHECKPOINT_RE.match(name) and entry.is_dir():
        return _checkpoint_is_whole(entry)  # hwrun publishes a checkpoint only with its manifest
    if files.get(name) == {"dir": True} and entry.is_dir():
        return not any(entry.iterdir())  # a folder hwrun made is its own only while nothing was put in it
    if entry.is_dir():
        inner = [p for p in entry.rglob("*") if not p.is_dir()]
        recorded = [files.get(p.relative_to(path).as_posix()) for p in inner]
        if inner and all(_matches(p, e) for p, e in zip(inner, recorded, strict=True)):
            return True
    elif _matches(entry, files.get(name)):
        return True
    if legacy is None or not _written_name(name):
        return False
    # the loss plot is the one file a run writes that no checkpoint holds; anything else must match one
    return name == LEGACY_PLOT or _same_as_in_checkpoint(entry, legacy)


@dataclass(frozen=True)
class OutputSurvey:
    """What an output folder holds before a run: whether it existed, the top-level entries hwrun did not write
    (`foreign`), and hwrun's own entries from an earlier run (`earlier`: checkpoints, final model, plot)."""

    path: Path
    existed: bool
    foreign: tuple[str, ...] = ()
    earlier: tuple[str, ...] = ()

    def may_replace(self, name: str) -> bool:
        """hwrun may replace or delete the top-level entry `name` (it is absent or hwrun's own)."""
        return name not in self.foreign


def survey(path: Path) -> OutputSurvey:
    """Sort `path`'s top-level entries into hwrun's own and the others. In a folder from before the record
    (no hwrun_output.json but hwrun's checkpoints in it) a file is hwrun's only if the newest checkpoint holds
    the same name with the same bytes."""
    if not path.is_dir():
        return OutputSurvey(path, existed=False)
    files = read_record(path).get("files", {})
    checkpoints = [folder for _, folder in list_checkpoints(path) if (folder / MANIFEST_NAME).is_file()]
    legacy = checkpoints[0] if checkpoints and not (path / OUTPUT_MANIFEST).is_file() else None  # newest first
    foreign, earlier = [], []
    for entry in sorted(path.iterdir(), key=lambda p: p.name):
        name = entry.name
        if not _owned(path, name, files, legacy):
            foreign.append(name)
        elif name == OUTPUT_MANIFEST or name.startswith(OWN_PREFIXES):
            continue
        elif _CHECKPOINT_RE.match(name):
            if check_checkpoint(entry) is None:  # a damaged one holds nothing to keep
                earlier.append(name)
        else:
            earlier.append(name)
    return OutputSurvey(path, True, tuple(foreign), tuple(earlier))


def _names(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")


_KIND_FLAGS = {"lora": "--lora", "qlora": "--qlora", "full": "no --lora/--qlora"}


def check_output_dir(found: OutputSurvey, model: str, resume_from: str | None, run: dict, overwrite: bool) -> None:
    """Refuse, before the model loads, an output folder whose contents the run would destroy or mix: the
    model's own folder; files hwrun did not write (unless `overwrite`, and even then none whose name the run
    writes); an earlier run's final model or checkpoints on a fresh start (unless `overwrite`); a checkpoint
    of a different kind of run (LoRA vs full) on resume."""
    output_dir = found.path
    source = Path(model)
    if source.exists() and output_dir.exists() and output_dir.resolve() == source.resolve():
        raise TrainingConfigError(
            f"output_dir={str(output_dir)!r} is the folder of the model being trained; the final save "
            "would overwrite its weights. Fix: pass another output_dir (e.g. --output my-finetune)."
        )
    if found.foreign and not overwrite:
        raise TrainingConfigError(
            f"output_dir={str(output_dir)!r} holds files hwrun did not write ({_names(found.foreign)}); the run "
            "would write its checkpoints, model card and model beside them or over them. Fix: name a new or empty "
            "folder (e.g. --output my-finetune), or pass --overwrite (overwrite=True) to use this one: hwrun then "
            "writes only its own files and never replaces or deletes these."
        )
    clashes = [name for name in found.foreign if _written_name(name) and name not in OPTIONAL_NAMES]
    if clashes:
        raise TrainingConfigError(
            f"output_dir={str(output_dir)!r} holds {_names(clashes)}, which hwrun did not write and which the run "
            "would have to write itself (its final model, tokenizer or checkpoints); --overwrite (overwrite=True) "
            "never replaces a file hwrun did not write. Fix: move them away, or name another output folder."
        )
    if resume_from is not None:
        earlier = checkpoint_run(resume_from)
        if earlier and earlier.get("kind") != run["kind"]:
            raise TrainingConfigError(
                f"Cannot resume from {resume_from!r}: it was written by a {earlier.get('kind')} run and this "
                f"is a {run['kind']} run, whose weights and optimizer state do not match it. Fix: resume "
                f"with the same kind ({_KIND_FLAGS.get(earlier.get('kind'), earlier.get('kind'))}), "
                "or start this run in a new output_dir."
            )
        return
    if found.earlier and not overwrite:
        raise TrainingConfigError(
            f"output_dir={str(output_dir)!r} already holds an earlier run ({_names(found.earlier)}) and this "
            "run starts fresh: its final save and checkpoint rotation would replace or delete those files. Fix: "
            "resume='auto' (--resume) to continue that run, a new output_dir, or --overwrite (overwrite=True) "
            "to replace that run (hwrun deletes only its own files)."
        )


def claim(path: Path) -> set[str]:
    """Mark `path` as an hwrun output folder (write the record if there is none, taking over a folder from
    before the record: the names its run wrote). Returns the top-level names present now."""
    path.mkdir(parents=True, exist_ok=True)
    if not (path / OUTPUT_MANIFEST).is_file():
        found = survey(path)
        files: dict = {}
        for name in found.earlier:
            if not _CHECKPOINT_RE.match(name):
                files.update(_entries(path, name))
        _write_record(path, {"format": 1, "written_by": "hwrun train", "files": files})
    return {entry.name for entry in path.iterdir()}


def _entries(path: Path, name: str) -> dict:
    entry = path / name
    if entry.is_dir():
        return {p.relative_to(path).as_posix(): _file_entry(p) for p in sorted(entry.rglob("*")) if p.is_file()}
    return {name: _file_entry(entry)} if entry.is_file() else {}


def record(path: Path, names: list[str] | set[str] = (), *, hashed: dict | None = None,
           final: dict | None = None, clear_final: bool = False) -> None:
    """Add to `path`'s record the top-level entries `names` (files hashed now) and `hashed` (relative path ->
    {"size", "sha256"} computed while they were written); set or clear the final model's entry."""
    current = read_record(path) or {"format": 1, "written_by": "hwrun train", "files": {}}
    files = current["files"]
    for name in names:
        if name.startswith(OWN_PREFIXES) or _CHECKPOINT_RE.match(name) or name == OUTPUT_MANIFEST:
            continue  # always hwrun's (a checkpoint carries its own manifest)
        entries = _entries(path, name)
        files.update(entries or ({name: {"dir": True}} if (path / name).is_dir() else {}))
    for relative, entry in (hashed or {}).items():
        if (path / relative).is_file():
            files[relative] = _file_entry(path / relative, entry.get("sha256"))
    if clear_final:
        current.pop("final", None)
    if final is not None:
        current["final"] = final
    _write_record(path, current)


def final_step(path: Path) -> int | None:
    """The step of the final model in `path` when it is there and unchanged (from the record); -1 for a folder
    from before the record that holds a final model; None when there is none."""
    current = read_record(path)
    final = current.get("final")
    if isinstance(final, dict) and isinstance(final.get("step"), int):
        files = current["files"]
        if all(_matches(path / name, files.get(name)) for name in final.get("files", ())):
            return final["step"]
        return None
    if not current and any((path / name).is_file() for name in FINAL_FILES):
        return -1
    return None


def clear_earlier(found: OutputSurvey) -> list[str]:
    """For a fresh start with overwrite: delete the earlier run's files (hwrun's own only: its checkpoints,
    final model, plot) and forget its final model. Returns what was removed."""
    removed = []
    for name in found.earlier:
        entry = found.path / name
        if entry.is_dir():
            shutil.rmtree(entry)
        elif entry.exists():
            entry.unlink()
        removed.append(name)
    if (found.path / OUTPUT_MANIFEST).is_file():
        current = read_record(found.path)
        current.pop("final", None)
        current["files"] = {k: v for k, v in current.get("files", {}).items() if (found.path / k).exists()}
        _write_record(found.path, current)
    if removed:
        logger.warning("overwrite=True: removed the earlier run's %s from %s.", ", ".join(removed), found.path)
    return removed


def release(path: Path, existed: bool) -> None:
    """After a failed run: a folder this run created and left holding only its record (and its event logs) is removed
    again."""
    if existed or not path.is_dir():
        return
    events = "hwrun-tensorboard"  # hwrun.training.events.EVENTS_DIR
    if {entry.name for entry in path.iterdir()} <= {OUTPUT_MANIFEST, events}:
        shutil.rmtree(path / events, ignore_errors=True)
        (path / OUTPUT_MANIFEST).unlink(missing_ok=True)
        path.rmdir()
