"""Bad inputs of issue 42 through the real CLIs (`hwrun train`, `hwrun generate`, `hwdist launch`), in a scratch folder
of a user's files: each is one line naming the value, exit 2, before anything loads, and no file changed.

The classes' own table-driven tests (many more cases each, and the recoveries with exit 0) are listed with their
mechanisms in docs/reliability.md (`mechanisms.py`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hwrun.model.source import DEFAULT_MODEL
from reliability_case import (
    Case,  # tests/reliability is on sys.path (reliability_tables puts it there)
)

TRAIN = ("train", "--device", "cpu", "--lora", "--batch-size", "4", "--block-size", "32")
STORY = "The king said to the queen that the castle was cold. " * 40
OTHER_MODEL = "/elsewhere/other-model"


def _safetensors(values: int = 4) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\x00" * (4 * values)


def _another_models_run(folder: str) -> dict[str, str | bytes]:
    """An hwrun run folder whose checkpoint (checksums intact) was written by a LoRA run of another model."""
    weights = _safetensors()
    manifest = {"format": 2, "step": 1, "complete": True,
                "run": {"kind": "lora", "model": OTHER_MODEL, "model_id": OTHER_MODEL, "config_sha256": "0" * 64,
                        "block_size": 32, "lora_r": 16, "lora_alpha": 32, "lora_targets": "q_proj,v_proj"},
                "files": {"adapter_model.safetensors": {"size": len(weights),
                                                        "sha256": hashlib.sha256(weights).hexdigest()}}}
    return {f"{folder}/checkpoint-1/adapter_model.safetensors": weights,
            f"{folder}/checkpoint-1/hwrun_checkpoint.json": json.dumps(manifest),
            f"{folder}/hwrun_output.json": json.dumps({"format": 1, "files": {}})}


def _damaged_adapter(folder: str) -> dict[str, str | bytes]:
    """An adapter hwrun wrote (its record), whose weights were overwritten since (same size, other bytes)."""
    written, now = _safetensors(), _safetensors()[:-4] + b"\x7f\x7f\x7f\x7f"
    config = json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"],
                         "base_model_name_or_path": DEFAULT_MODEL, "task_type": "CAUSAL_LM"}).encode()
    files = {"adapter_model.safetensors": written, "adapter_config.json": config}
    record = {"format": 1, "files": {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                            "mtime_ns": 0} for name, data in files.items()},
              "final": {"step": 1, "files": sorted(files)}}
    return {f"{folder}/adapter_model.safetensors": now, f"{folder}/adapter_config.json": config,
            f"{folder}/hwrun_output.json": json.dumps(record)}


def _foreign_adapter(folder: str, base: str, values: bytes) -> dict[str, str | bytes]:
    """A LoRA adapter folder hwrun did not write (no record): its config names `base`; one float32 tensor."""
    header = json.dumps({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": {
        "dtype": "F32", "shape": [len(values) // 4], "data_offsets": [0, len(values)]}}).encode()
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "task_type": "CAUSAL_LM",
              "base_model_name_or_path": base}
    return {f"{folder}/adapter_model.safetensors": len(header).to_bytes(8, "little") + header + values,
            f"{folder}/adapter_config.json": json.dumps(config)}


NAN, ONE = b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x3f"  # float32 NaN and 1.0, little-endian
GENERATE_ADAPTER = ("generate", "--device", "cpu", "--model", "adapter", "The king said", "--max-new-tokens", "4")


def _model_without_positions(folder: str) -> dict[str, str | bytes]:
    """The shipped tiny model with `max_position_embeddings: 0` in its config.json."""
    source = Path(DEFAULT_MODEL)
    config = json.loads((source / "config.json").read_text())
    config["max_position_embeddings"] = 0
    files: dict[str, str | bytes] = {f"{folder}/config.json": json.dumps(config, indent=2)}
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        files[f"{folder}/{name}"] = (source / name).read_bytes()
    return files


CASES: tuple[Case, ...] = (
    Case("hwrun-train-resume-another-models-run", "hwrun.cli.main",
         (*TRAIN, "--data", "data/rows.jsonl", "--output", "run", "--resume"), "data-lost",
         "trained on (only the run kind was compared), replaced that run's final adapter; rotation deleted its "
         "checkpoints", "one-line error before loading naming each difference and the fix", OTHER_MODEL,
         files=_another_models_run("run")),
    Case("hwrun-generate-adapter-overwritten", "hwrun.cli.main",
         ("generate", "--device", "cpu", "--model", "adapter", "The king said", "--max-new-tokens", "4"),
         "silently-accepted", "4 KiB overwritten: generated nothing, exit 0",
         "one-line error before loading: the sha256 hwrun recorded does not match",
         "adapter_model.safetensors does not match the sha256", files=_damaged_adapter("adapter")),
    Case("hwrun-train-max-positions-zero", "hwrun.cli.main",
         (*TRAIN, "--data", "story.txt", "--model", "tiny", "--output", "out"), "silently-accepted",
         "trained (the config's 0 positions never read)", "one-line error before the tokenizer loads",
         "max_position_embeddings=0", files={**_model_without_positions("tiny"), "story.txt": STORY}),
    Case("hwrun-train-lora-r-unbounded", "hwrun.cli.main",
         (*TRAIN, "--data", "story.txt", "--lora-r", "100000", "--output", "out"), "silently-accepted",
         "accepted, far above any layer's rank", "one-line error: at most the hidden size, and why", "r=100000",
         files={"story.txt": STORY}),
    Case("hwrun-train-batch-size-unbounded", "hwrun.cli.main",
         ("train", "--device", "cpu", "--lora", "--batch-size", "1000000000", "--block-size", "32", "--data",
          "story.txt", "--output", "out"), "silently-accepted", "trained a smaller batch than asked",
         "one-line error: the data packs into fewer blocks than one step takes", "batch_size=1000000000",
         files={"story.txt": STORY}),
    Case("hwrun-generate-adapter-base-missing", "hwrun.cli.main", GENERATE_ADAPTER, "unclear-error",
         "blamed on --model: \"model='/elsewhere/gone-base' does not exist ... omit --model\"",
         "one-line error naming adapter_config.json's base_model_name_or_path and the fix",
         "(base_model_name_or_path in", files=_foreign_adapter("adapter", "/elsewhere/gone-base", ONE * 4)),
    Case("hwrun-generate-adapter-nan", "hwrun.cli.main", GENERATE_ADAPTER, "silently-accepted",
         "PEFT loaded the NaN weights: generated nothing, exit 0",
         "one-line error before loading naming the tensor and how many values are not finite",
         "holds 2 NaN or infinite value(s) of 4", files=_foreign_adapter("adapter", DEFAULT_MODEL, (ONE + NAN) * 2)),
    Case("hwdist-launch-shell-script", "hwdist", ("launch", "--kind", "cpu", "script.sh"), "traceback-from-cli",
         "torchrun's ChildFailedError report (python ran a shell script)", "one-line error before torchrun starts",
         "'script.sh' is a /bin/sh script"),
    Case("hwdist-launch-log-dir-uncreatable", "hwdist",
         ("launch", "--kind", "cpu", "--log-dir", "README.md/logs", "train.py"), "traceback-from-cli",
         "torchrun's traceback creating the folder", "one-line error before torchrun starts", "README.md/logs"),
    Case("hwdist-launch-nproc-unbounded", "hwdist", ("launch", "--kind", "cpu", "--nproc-per-node", "100000",
                                                     "train.py"), "silently-accepted",
         "passed to torchrun (100000 processes)", "one-line error: the bound and why", "--nproc-per-node 100000"),
)
