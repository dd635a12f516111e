"""Checkpoints that lose nothing: written into a staging folder, fsynced, stamped with a
manifest (size and sha256 of every file), then renamed into place, so a crash mid-save leaves the
last good checkpoint whole, and a resume verifies the bytes it reads."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, CheckpointWriteError

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


#: Manifest format: 1 recorded sizes only (hwrun before issue 27); 2 adds the sha256 of every file.
MANIFEST_FORMAT = 2
_HASH_CHUNK = 1 << 20


def sha256_of(path: str | Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks (memory stays flat for multi-GB weights)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str | Path, step: int, run: dict | None = None) -> Path:
    """fsync every file in `folder` and hash it, then write the manifest (size and sha256 per file, step,
    and `run`: what kind of run wrote it, checked on resume) last, fsynced. Each file is read once, right
    after Trainer wrote it (still in the page cache), so the checksums cost one pass at save time."""
    folder = Path(folder)
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        _fsync_path(file)
        files[file.relative_to(folder).as_posix()] = {"size": file.stat().st_size, "sha256": sha256_of(file)}
    manifest = {"format": MANIFEST_FORMAT, "step": step, "complete": True, "files": files}
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


def _manifest(folder: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, the reason there is no usable one)."""
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        return None, f"no {MANIFEST_NAME} (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, f"{MANIFEST_NAME} is unreadable ({error})"
    if not isinstance(manifest, dict) or not manifest.get("complete"):
        return None, f"{MANIFEST_NAME} does not say complete"
    if not isinstance(manifest.get("files"), dict):
        return None, f"{MANIFEST_NAME} lists no files"
    return manifest, None


def check_checkpoint(folder: str | Path, *, verify: bool = False) -> str | None:
    """Return None when `folder` is a complete checkpoint, else the reason it is not. Sizes are always
    compared (cheap); `verify=True` also compares every file's sha256 with the manifest (reads every byte:
    done on resume only). Checkpoints written before checksums (manifest format 1) pass on sizes."""
    folder = Path(folder)
    manifest, problem = _manifest(folder)
    if manifest is None:
        return problem
    for name, entry in manifest["files"].items():
        size = entry.get("size") if isinstance(entry, dict) else entry
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {size}"
    if verify:
        for name, entry in manifest["files"].items():
            expected = entry.get("sha256") if isinstance(entry, dict) else None
            if expected and sha256_of(folder / name) != expected:
                return (f"{name} does not match its sha256 in {MANIFEST_NAME} (same size, other bytes: "
                        "corrupted or changed after the save)")
    return None


def has_checksums(folder: str | Path) -> bool:
    """True when `folder`'s manifest records a sha256 for every file (format 2 and later)."""
    manifest, _ = _manifest(Path(folder))
    return manifest is not None and all(isinstance(e, dict) and e.get("sha256") for e in manifest["files"].values())


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


def latest_complete_checkpoint(output_dir: str | Path, *, verify: bool = False) -> Path | None:
    """The newest complete checkpoint in `output_dir` (`verify=True`: whose checksums match too);
    incomplete or corrupt ones are skipped with a warning naming the reason."""
    for _step, folder in list_checkpoints(output_dir):
        problem = check_checkpoint(folder, verify=verify)
        if problem is None:
            return folder
        logger.warning("Skipping checkpoint %s: %s.", folder, problem)
    return None


@dataclass(frozen=True)
class ResumeChoice:
    """Where a run resumes from (`folder`, None for a fresh start), why, and which newer checkpoints were
    passed over with their reasons."""

    folder: str | None
    reason: str
    skipped: tuple[str, ...] = ()


_FRESH = ("never", "no")


def _check_resume_value(resume: object) -> None:
    if resume is None or isinstance(resume, (bool, os.PathLike)) or (isinstance(resume, str) and resume.strip()):
        return
    raise CheckpointError(
        f"resume={resume!r} is not understood; pass 'auto' (the newest verified checkpoint, or a fresh start), "
        "True (one must exist), False (start fresh), or the path of a checkpoint-N folder."
    )


def choose_resume(resume: bool | str | os.PathLike | None, output_dir: str | Path) -> ResumeChoice:
    """Turn `resume` ("auto", True, False/None, or a checkpoint path) into the folder to resume from, with the
    reason. "auto"/True take the newest checkpoint whose files match their sizes and sha256 and fall back past
    newer ones that do not, naming each; a partial save (no manifest) is skipped. When checkpoints that claim
    to be complete exist but none verifies, or resume=True finds none, or a given path does not verify:
    CheckpointError."""
    _check_resume_value(resume)
    if resume is None or resume is False or resume in _FRESH:
        return ResumeChoice(None, "a fresh start (resume=False)")
    if resume is True or resume == "auto":
        skipped, damaged = [], []
        for _step, folder in list_checkpoints(output_dir):
            claims = (folder / MANIFEST_NAME).is_file()
            problem = check_checkpoint(folder, verify=True)
            if problem is None:
                verified = "sha256 of every file verified" if has_checksums(folder) else \
                    "sizes verified (written before checksums)"
                reason = f"from {folder} ({verified})"
                if skipped:
                    reason += "; skipped newer " + "; ".join(skipped)
                    logger.warning("Resuming from %s instead of a newer checkpoint: %s.", folder, "; ".join(skipped))
                else:
                    logger.info("Resuming from %s (%s)", folder, verified)
                return ResumeChoice(str(folder), reason, tuple(skipped))
            skipped.append(f"{folder.name}: {problem}")  # logged once below, or raised
            if claims:
                damaged.append(f"{folder.name}: {problem}")
        if damaged:
            raise CheckpointError(
                f"No checkpoint in {str(output_dir)!r} verifies, so there is nothing safe to resume from: "
                + "; ".join(damaged) + ". Fix: restore the damaged files from a backup, resume from a checkpoint "
                "copied from elsewhere (resume=PATH), or start fresh in a new output_dir."
            )
        if resume is True:
            raise CheckpointError(
                f"resume=True but {str(output_dir)!r} holds no complete checkpoint; resuming "
                "needs a checkpoint-N folder with a manifest. Fix: use resume='auto' to start "
                "fresh when there is none, or point --output at the earlier run."
            )
        if skipped:
            logger.warning("Starting fresh: no complete checkpoint (%s).", "; ".join(skipped))
        return ResumeChoice(None, "a fresh start (no checkpoint to resume from)", tuple(skipped))
    folder = Path(resume)
    problem = check_checkpoint(folder, verify=True)
    if problem is not None:
        raise CheckpointError(
            f"Cannot resume from {str(folder)!r}: {problem}. Fix: pick a complete checkpoint, or use "
            "resume='auto' to take the newest verified one."
        )
    return ResumeChoice(str(folder), f"from {folder} (given)")


#: Pickle files a Trainer checkpoint holds (optimizer, scheduler, RNG and scaler states, training arguments).
PICKLE_SUFFIXES = (".pt", ".pth", ".bin")


def is_refused_pickle(error: BaseException) -> bool:
    """True for torch's refusal of a pickle by its weights-only loader (torch.load's default since torch 2.6)."""
    import pickle

    return isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in str(error)


def refused_pickle(folder: str | Path, error: BaseException) -> CheckpointError:
    """The CheckpointError for a checkpoint whose pickle torch's weights-only loader refused (`error`): the file is
    found by loading each of the checkpoint's pickles the same safe way (error path only), and named with what it
    holds; torch's advice to turn the protection off is not relayed."""
    import torch

    folder = Path(folder)
    culprit, held, text = None, "", str(error)
    for file in sorted((p for p in folder.rglob("*") if p.suffix in PICKLE_SUFFIXES), key=lambda p: p.stat().st_size):
        try:
            torch.load(file, map_location="cpu", weights_only=True)
        except Exception as refusal:  # noqa: BLE001 - any refusal names this file
            culprit, text = file, str(refusal)
            found = re.search(r"GLOBAL (\S+)", text)
            held = f" ({found.group(1)})" if found else ""
            break
    what = str(culprit) if culprit is not None else f"a pickle file in {folder}"
    if "Weights only load failed" not in text:
        short = " ".join(text.split())[:160]
        return CheckpointError(f"{what} cannot be read as a torch pickle ({short}): the file is damaged. Fix: resume "
                               f"from another checkpoint (resume=PATH, or move {folder.name} out of the output folder "
                               "so --resume takes the one before it), or start fresh in a new output_dir.")
    return CheckpointError(
        f"{what} was refused by torch's safe (weights-only) loader: it holds more than tensors and plain data{held}, "
        "which can run code while it loads, and hwrun does not load such files. Fix: resume from another checkpoint "
        f"(resume=PATH, or move {folder.name} out of the output folder so --resume takes the one before it), or start "
        "fresh in a new output_dir."
    )


def resolve_resume(resume: bool | str | os.PathLike | None, output_dir: str | Path) -> str | None:
    """The folder `choose_resume` picks (None: start fresh)."""
    return choose_resume(resume, output_dir).folder


def trainer_state(folder: str | Path) -> dict:
    """A checkpoint's trainer_state.json ({} when unreadable: check_checkpoint reports corruption)."""
    try:
        state = json.loads((Path(folder) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def finished_at(folder: str | Path, max_steps: int, epochs: float) -> str | None:
    """When the run in checkpoint `folder` has already done what `max_steps` (or, with -1, `epochs`) asks,
    say so (resuming would train past the end, issue 27); None when there is training left."""
    state = trainer_state(folder)
    step = state.get("global_step")
    if not isinstance(step, int):
        return None
    if max_steps > 0:
        if step < max_steps:
            return None
        budget = f"max_steps={max_steps}"
    else:
        planned, old_epochs = state.get("max_steps"), state.get("num_train_epochs")
        if not isinstance(planned, int) or not isinstance(old_epochs, (int, float)) or float(old_epochs) != float(epochs):
            return None
        if step < planned:
            return None
        budget = f"epochs={epochs} ({planned} steps)"
    return f"{Path(folder).name} is at step {step}: the run is finished for {budget}"


def schedule_change(folder: str | Path, max_steps: int, epochs: float) -> str | None:
    """Why resuming `folder` with these `max_steps`/`epochs` will not continue the earlier run's
    curve (Trainer rebuilds the learning-rate schedule for the new length), or None when they match."""
    state = trainer_state(folder)
    if not state:
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


def as_os_error(error: BaseException) -> OSError | None:
    """`error` as the OSError of a failed write, or None: Rust-backed writers (tokenizers, safetensors) raise a plain
    Exception("No space left on device (os error 28)"), which is an OSError of that errno here."""
    if isinstance(error, OSError):
        return error
    found = re.search(r"\(os error (\d+)\)", str(error))
    if found is None:
        return None
    number = int(found.group(1))
    return OSError(number, os.strerror(number))


def write_failed(what: str, where: Path, error: OSError, partial: Path | None) -> CheckpointWriteError:
    """The CheckpointWriteError for a save that failed with `error` (ENOSPC, EDQUOT, EROFS, EIO...): the partial
    save `partial` is removed first (it holds nothing usable and, on a full disk, the space a resume needs)."""
    import errno

    if partial is not None:
        shutil.rmtree(partial, ignore_errors=True)
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    cause = "the disk is full" if full else (error.strerror or str(error))
    last = latest_complete_checkpoint(where)
    kept = f"the last complete checkpoint, {last}, is untouched" if last is not None else "no checkpoint was written"
    fix = "free space on that disk (or move the output folder to a larger one)" if full else "fix that cause"
    return CheckpointWriteError(
        f"Writing {what} into {where} failed: {cause} ({error}). The partial save was removed and {kept}. Fix: {fix}, "
        "then run the same command with --resume (resume='auto'): it continues from the newest complete checkpoint."
    )


def staging_folder(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` is written before it is renamed into place (same parent,
    so the rename is atomic; a name Trainer's own `checkpoint-N` scan does not match)."""
    return Path(run_dir) / f"{STAGING_PREFIX}checkpoint-{step}"


def publish(staged: Path, final: Path) -> None:
    """Rename the finished `staged` checkpoint onto `final` atomically (an old `final` is
    moved aside first and removed only after the new one is in place)."""
    old = None
    if final.exists():
        problem = check_checkpoint(final)
        if problem is not None:  # a damaged one a resume passed over: this run wrote that step again
            logger.warning("Replacing %s, which did not verify (%s), with this run's checkpoint of the same step.",
                           final, problem)
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


def checkpoint_step(folder: str | Path) -> int | None:
    """The step a complete checkpoint's manifest records, or None (no readable manifest, or no step in it)."""
    manifest, _ = _manifest(Path(folder))
    step = manifest.get("step") if manifest is not None else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


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


@dataclass(frozen=True)
class PublishedFinal:
    """What `publish_final` put into output_dir (relative path -> size and sha256), and the staged entries it
    left out because a file hwrun did not write already holds that name."""

    files: dict
    kept: tuple[str, ...] = ()


def publish_final(staged: Path, output_dir: str | Path, *,
                  may_replace: Callable[[str], bool] = lambda name: True) -> PublishedFinal:
    """Move the finished final save from `staged` into `output_dir`: every file is fsynced and hashed
    first, then each entry takes one os.replace, so no file in `output_dir` is ever half written. Final
    model files of another kind that `staged` lacks (an adapter where a merged model is saved now,
    old weight shards) are removed, so the folder holds exactly one model. An entry whose name is taken
    by something `may_replace(name)` refuses (a file hwrun did not write) is neither replaced nor removed:
    the staged entry is dropped and named in `kept`."""
    output_dir = Path(output_dir)
    kept = sorted(entry.name for entry in staged.iterdir()
                  if (output_dir / entry.name).exists() and not may_replace(entry.name))
    for name in kept:
        logger.warning("Not writing %s: %s holds a file of that name that hwrun did not write, and hwrun never "
                       "replaces those.", name, output_dir)
    files = {}
    for file in sorted(staged.rglob("*")):
        if file.is_file() and file.relative_to(staged).parts[0] not in kept:
            _fsync_path(file)
            files[file.relative_to(staged).as_posix()] = {"size": file.stat().st_size, "sha256": sha256_of(file)}
    stale = [output_dir / name for name in FINAL_FILES]
    stale += list(output_dir.glob("model-*-of-*.safetensors"))
    if (output_dir / "adapter" / "adapter_config.json").is_file():
        stale.append(output_dir / "adapter")
    stale = [path for path in stale if path.exists() and not (staged / path.name).exists() and may_replace(path.name)]
    for entry in sorted(staged.iterdir()):  # the new model first, so a crash here leaves one in place
        if entry.name in kept:
            continue
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
    return PublishedFinal(files, tuple(kept))
