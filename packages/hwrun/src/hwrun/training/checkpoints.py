"""Checkpoints that lose nothing: written into a staging folder, fsynced, stamped with a
manifest, then renamed into place, so a crash mid-save leaves the last good checkpoint whole."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from ..errors import CheckpointError

logger = logging.getLogger(__name__)

MANIFEST_NAME = "hwrun_checkpoint.json"
STAGING_PREFIX = ".staging-"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def _fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # pragma: no cover - e.g. directories on Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def write_manifest(folder: str | Path, step: int, run: dict | None = None) -> Path:
    """fsync every file in `folder`, then write the manifest (file sizes, step, and `run`: what
    kind of run wrote it, checked on resume) last, fsynced."""
    folder = Path(folder)
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        _fsync_path(file)
        files[file.relative_to(folder).as_posix()] = file.stat().st_size
    manifest = {"format": 1, "step": step, "complete": True, "files": files}
    if run:
        manifest["run"] = dict(run)
    target = folder / MANIFEST_NAME
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    for sub in sorted({p.parent for p in folder.rglob("*")} | {folder}):
        _fsync_path(sub)
    return target


def check_checkpoint(folder: str | Path) -> str | None:
    """Return None when `folder` is a complete checkpoint, else the reason it is not."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        return f"no {MANIFEST_NAME} (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{MANIFEST_NAME} is unreadable ({error})"
    if not manifest.get("complete"):
        return f"{MANIFEST_NAME} does not say complete"
    for name, size in manifest.get("files", {}).items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {size}"
    return None


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Every `checkpoint-N` folder in `output_dir`, newest (highest step) first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for entry in output_dir.iterdir():
        match = _CHECKPOINT_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def latest_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `output_dir`; incomplete or corrupt ones are skipped
    with a warning naming the reason."""
    for _step, folder in list_checkpoints(output_dir):
        problem = check_checkpoint(folder)
        if problem is None:
            return folder
        logger.warning("Skipping checkpoint %s: %s.", folder, problem)
    return None


def resolve_resume(resume: bool | str | os.PathLike | None, output_dir: str | Path) -> str | None:
    """Turn `resume` ("auto", True, False/None, or a checkpoint path) into the folder to resume from.

    "auto": the newest complete checkpoint, or None to start fresh; True: the same but one must
    exist; a path: that checkpoint, which must be complete.
    """
    if resume in (None, False, "never", "no"):
        return None
    if resume in ("auto", True):
        found = latest_complete_checkpoint(output_dir)
        if found is None:
            if resume is True:
                raise CheckpointError(
                    f"resume=True but {str(output_dir)!r} holds no complete checkpoint; resuming "
                    "needs a checkpoint-N folder with a manifest. Fix: use resume='auto' to start "
                    "fresh when there is none, or point --output at the earlier run."
                )
            return None
        logger.info("Resuming from %s", found)
        return str(found)
    folder = Path(resume)
    problem = check_checkpoint(folder)
    if problem is not None:
        raise CheckpointError(
            f"Cannot resume from {str(folder)!r}: {problem}. Fix: pick a complete checkpoint, or use "
            "resume='auto' to take the newest complete one."
        )
    return str(folder)


def schedule_change(folder: str | Path, max_steps: int, epochs: float) -> str | None:
    """Why resuming `folder` with these `max_steps`/`epochs` will not continue the earlier run's
    curve (Trainer rebuilds the learning-rate schedule for the new length), or None when they match."""
    try:
        state = json.loads((Path(folder) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if max_steps > 0:
        old = state.get("max_steps")
        if not isinstance(old, int) or old == max_steps:
            return None
        was, now = f"max_steps={old}", f"max_steps={max_steps}"
    else:
        old = state.get("num_train_epochs")
        if not isinstance(old, (int, float)) or float(old) == float(epochs):
            return None
        was, now = f"epochs={old}", f"epochs={epochs}"
    rates = [entry["learning_rate"] for entry in state.get("log_history", []) if "learning_rate" in entry]
    last = f" (its last logged learning rate: {float(rates[-1]):.3g})" if rates else ""
    return (f"resuming from {str(folder)!r}, written by a run of {was}{last}, with {now}: Trainer "
            f"rebuilds the learning-rate schedule for {now}, so the learning rate jumps at step "
            f"{state.get('global_step', '?')} and the losses will not follow one uninterrupted run of "
            f"either length. To continue that run exactly, resume with {was}.")


def staging_folder(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` is written before it is renamed into place (same parent,
    so the rename is atomic; a name Trainer's own `checkpoint-N` scan does not match)."""
    return Path(run_dir) / f"{STAGING_PREFIX}checkpoint-{step}"


def publish(staged: Path, final: Path) -> None:
    """Rename the finished `staged` checkpoint onto `final` atomically (an old `final` is
    moved aside first and removed only after the new one is in place)."""
    old = None
    if final.exists():
        old = final.with_name(f"{STAGING_PREFIX}old-{final.name}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(staged, final)
    _fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_run(folder: str | Path) -> dict:
    """The `run` record (e.g. {"kind": "lora", "model": ...}) a complete checkpoint's manifest
    holds; {} for checkpoints written before hwrun recorded it."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    run = manifest.get("run")
    return run if isinstance(run, dict) else {}


#: files a finished run leaves in output_dir itself (the final model, adapter or merged model)
FINAL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "adapter_config.json",
               "adapter_model.safetensors")
FINAL_STAGING = f"{STAGING_PREFIX}final"


def final_staging(output_dir: str | Path) -> Path:
    """An empty folder inside `output_dir` (same filesystem, so renames are atomic) that the final
    save is written into first; whatever an earlier, interrupted final save left there is removed."""
    staging = Path(output_dir) / FINAL_STAGING
    if staging.exists():
        logger.warning("Removing %s, left by an earlier final save that did not finish.", staging)
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def publish_final(staged: Path, output_dir: str | Path) -> None:
    """Move the finished final save from `staged` into `output_dir`: every file is fsynced first,
    then each entry takes one os.replace, so no file in `output_dir` is ever half written. Final
    model files of another kind that `staged` lacks (an adapter where a merged model is saved now,
    old weight shards) are removed, so the folder holds exactly one model."""
    output_dir = Path(output_dir)
    for file in staged.rglob("*"):
        if file.is_file():
            _fsync_path(file)
    stale = [output_dir / name for name in FINAL_FILES]
    stale += list(output_dir.glob("model-*-of-*.safetensors"))
    if (output_dir / "adapter" / "adapter_config.json").is_file():
        stale.append(output_dir / "adapter")
    stale = [path for path in stale if path.exists() and not (staged / path.name).exists()]
    for entry in sorted(staged.iterdir()):  # the new model first, so a crash here leaves one in place
        target = output_dir / entry.name
        if entry.is_dir() and target.is_dir():
            shutil.rmtree(target)  # an earlier final save's adapter/ folder
        os.replace(entry, target)
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    _fsync_path(output_dir)
    shutil.rmtree(staged, ignore_errors=True)
