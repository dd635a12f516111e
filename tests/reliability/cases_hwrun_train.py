"""Bad inputs for `hwrun train` (issue 27): each through `python -m hwrun.cli.main train ...` in a scratch folder of
a user's files (README.md, train.py, script.sh, data/rows.jsonl), on the CPU with the shipped tiny model.

Every case ends with exit 2 and one line naming the value, and the folder's checksums unchanged: refusals come
before anything loads; the diverging run (`--lr 1e6`) trains, stops at its first non-finite or diverged value, and removes
the output folder it created because nothing good was saved in it. Which of the guard's rules trips, and at which
step, is the processor's (its rounding: issue 40), so that case names neither and gives the run 20 steps.
Every case but the argument parser's refusal imports the training stack (15-20 s each on 2 cores under load) or
trains: `slow=True`.
"""

from __future__ import annotations

import hashlib
import json

from reliability_case import (
    Case,  # tests/reliability is on sys.path (reliability_tables puts it there)
)

M = "hwrun.cli.main"
TRAIN = ("train", "--device", "cpu", "--lora", "--batch-size", "4", "--block-size", "32")
STORY = "The king said to the queen that the castle was cold. " * 40


def _damaged_run(folder: str) -> dict[str, str | bytes]:
    """An hwrun output folder whose only checkpoint fails its checksum (same size, other bytes)."""
    weights = b"\x00" * 64
    manifest = {"format": 2, "step": 1, "complete": True, "run": {"kind": "lora", "model": "tiny-llama"},
                "files": {"adapter_model.safetensors": {"size": len(weights),
                                                        "sha256": hashlib.sha256(b"\x01" * 64).hexdigest()}}}
    return {f"{folder}/checkpoint-1/adapter_model.safetensors": weights,
            f"{folder}/checkpoint-1/hwrun_checkpoint.json": json.dumps(manifest),
            f"{folder}/hwrun_output.json": json.dumps({"format": 1, "files": {}})}


CASES: tuple[Case, ...] = (
    Case("hwrun-train-output-empty", M, (*TRAIN, "--data", "data/rows.jsonl", "--output", ""), "data-lost",
         "trained into the current folder; PEFT's model card replaced README.md, exit 0",
         "one-line error before loading: name a folder", "output_dir=''", slow=True),
    Case("hwrun-train-output-current-folder", M, (*TRAIN, "--data", "data/rows.jsonl", "--output", "."), "data-lost",
         "trained into the project folder; README.md replaced by PEFT's model card",
         "one-line error naming the files hwrun did not write and --overwrite", "README.md, data, script.sh, train.py",
         slow=True),
    Case("hwrun-train-overwrite-foreign-model", M,
         (*TRAIN, "--data", "data/rows.jsonl", "--output", "out", "--overwrite"), "data-lost",
         "the final save replaced the user's adapter_model.safetensors",
         "one-line error: --overwrite never replaces a file hwrun did not write", "adapter_model.safetensors",
         files={"out/adapter_model.safetensors": b"the user's own adapter"}, slow=True),
    Case("hwrun-train-resume-corrupted-checkpoint", M,
         (*TRAIN, "--data", "data/rows.jsonl", "--output", "run", "--resume"), "data-lost",
         "a same-size corrupted checkpoint was resumed (checked by size only) and its NaN weights saved",
         "one-line error: no checkpoint verifies, each named with its reason",
         "checkpoint-1: adapter_model.safetensors does not match its sha256", files=_damaged_run("run"), slow=True),
    Case("hwrun-train-output-is-a-file", M, (*TRAIN, "--data", "data/rows.jsonl", "--output", "README.md"),
         "traceback-from-cli", "traceback after the model loaded", "one-line error before loading",
         "'README.md' is an existing file", slow=True),
    Case("hwrun-train-output-unwritable", M,
         (*TRAIN, "--data", "data/rows.jsonl", "--output", "/proc/hwrun-train-out"), "unclear-error",
         "found at the first save, after the training before it", "one-line error before loading (write-tested)",
         "/proc/hwrun-train-out", slow=True),
    Case("hwrun-train-lr-diverges", M,
         (*TRAIN, "--data", "story.txt", "--max-steps", "20", "--lr", "1e6", "--output", "out", "--no-progress"),
         "silently-accepted", "'final loss nan; model saved', exit 0",
         "one-line error naming the step and the value; nothing saved, the new folder removed",
         "so the run diverged (lr=1000000.0). Nothing was saved after it: no checkpoint was written",
         files={"story.txt": STORY}, slow=True),
    Case("hwrun-train-data-dev-zero", M, (*TRAIN, "--data", "/dev/zero"), "hang-unbounded",
         "read until memory ran out", "one-line error: a device, not a regular file", "'/dev/zero' is a device",
         slow=True),
    Case("hwrun-train-data-past-bound", M, (*TRAIN, "--data", "big.txt", "--max-data-size", "4K"), "hang-unbounded",
         "read whole, however large", "one-line error naming the bound and --max-data-size", "max_data_bytes=4,096",
         files={"big.txt": "x" * 5000}, slow=True),
    Case("hwrun-train-on-nonfinite-unknown", M, (*TRAIN, "--data", "data/rows.jsonl", "--on-nonfinite", "later"),
         "unclear-error", "no policy existed: NaN losses trained on silently",
         "one-line usage error naming the choices", "'later'"),
)
