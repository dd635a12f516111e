"""Each class of failure fixed by mechanism (issue 42), what handles it, and the table-driven test that shows it.

`tools/reliability_doc.py` renders this table into docs/reliability.md (after the CLI cases), so the document and
the tests it names cannot drift apart silently: `test_reliability_doc.py` checks that every test file named here
exists. Add a row when a class gets its mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mechanism:
    """A class of failure (`klass`: a key of reliability_case.CLASSES; `point`: the issue's point), the mechanism
    that handles it, and its table-driven test(s) (paths from the repository root, `::test` allowed)."""

    point: str
    klass: str
    failure: str
    mechanism: str
    tests: tuple[str, ...]


HWRUN = "packages/hwrun/tests/"
HWDIST = "packages/hwdist/tests/"

MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        "42.1", "data-lost", "`--resume` into another run's folder (another model, data, block size or LoRA shape) "
        "trained on, replaced its final adapter and rotated its checkpoints away",
        "every checkpoint manifest records the run (`hwrun.training.resume_match.run_record`: kind, model identity and "
        "config.json sha256, data sha256, block size, LoRA r/alpha/targets); a resume compares each before the "
        "tokenizer or model loads and refuses naming every difference and the option that sets it; checkpoints from "
        "before the record are compared on what they hold (their adapter_config.json), the rest named as not compared",
        (HWRUN + "test_hwrun_train_resume_match.py",)),
    Mechanism(
        "42.1", "unclear-error", "a damaged checksum file (manifest) in the newest checkpoint refused the whole folder "
        "as \"files hwrun did not write\"",
        "a checkpoint folder holding hwrun's manifest name is hwrun's even when the manifest is damaged; the resume "
        "passes over it to the newest checkpoint that verifies (the warning names it) and the run writes that step "
        "again (logged)", (HWRUN + "test_hwrun_train_resume_match.py",)),
    Mechanism(
        "42.2", "silently-accepted", "a damaged output of hwrun's (4 KiB of an adapter overwritten) loaded and "
        "generated nothing, exit 0",
        "`hwrun.model.integrity.verify_output`: plan() and load() compare an output's weights and configs with "
        "`hwrun_output.json` before anything loads, every byte up to 512 MiB, above it sizes and safetensors header "
        "hashes (recorded at write time), every byte with `hwrun generate --verify` / `load(verify=True)`; "
        "ModelIntegrityError names the file and the fix",
        (HWRUN + "test_hwrun_load_integrity.py",)),
    Mechanism(
        "42.3", "traceback-from-cli", "errors of PEFT, safetensors, torch's pickle loader and the tokenizer surfaced as "
        "\"internal error ... report it\"",
        "translated at hwrun's boundary into its own classes naming the file or field, the rule and the fix: "
        "adapter_config.json's fields checked before PEFT reads them, PEFT's load refusals (shapes of another base, "
        "target modules absent, damaged safetensors) as AdapterFormatError, `--lora-targets` naming no module as "
        "TrainingConfigError listing the model's linear layers, a pickle torch's weights-only loader refuses (adapter "
        "or checkpoint) named by file without torch's advice, a lone surrogate in JSONL text named by line",
        (HWRUN + "test_hwrun_boundary_errors.py",)),
    Mechanism(
        "42.4", "silently-accepted", "divergence with a finite loss (`--lr 1e6`: loss 11.4, weights near 2e6, "
        "\"adapter saved\")",
        "`hwrun.training.guard.NonFiniteGuard` stops on a loss 1 nat worse than guessing uniformly or 3x its early "
        "peak, a gradient norm that is not finite (outside fp16) or 1000x its early peak, and weights 1000x their "
        "start (at least 100) at each save: bounds orders of magnitude from any healthy run, so no CPU's rounding "
        "decides them; TrainingDivergedError, nothing saved",
        (HWRUN + "test_hwrun_train_divergence.py",)),
    Mechanism(
        "42.4", "silently-accepted", "`max_position_embeddings: 0` (or below --block-size), unbounded --batch-size and "
        "--lora-r, booleans given as strings to TrainingArguments and LoRA settings",
        "checked before the model loads (`hwrun.training.run._check_fits`, `lora.check_rank`, "
        "`options.check_booleans`): positions an int >= 1 and >= the block size, one step's blocks within the "
        "data, r within the hidden size, bool-typed fields True/False",
        (HWRUN + "test_hwrun_train_bounds.py",)),
    Mechanism(
        "42.7", "traceback-from-cli", "`hwdist launch` with a script that is not Python, a log folder that cannot be "
        "created, a master port in use: torchrun's tracebacks; --nproc-per-node unbounded",
        "`hwdist.cli_checks`: the script's shebang read and its source compiled by this interpreter, the log "
        "folder's nearest existing parent writable, the static rendezvous port bound once on node rank 0 just before "
        "torchrun starts; --nproc-per-node bounded by the devices, else 4 per usable core on CPU, else 256",
        (HWDIST + "test_hwdist_launch_prechecks.py",)),
    Mechanism(
        "42 faults", "data-lost", "the disk fills during a checkpoint or final save",
        "the save writes into a staging folder; an OS error (ENOSPC, also the Rust writers' \"os error 28\") removes "
        "the partial save and raises CheckpointWriteError naming the last complete checkpoint, untouched; --resume "
        "continues from it (tested with ENOSPC injected at torch.save and on a size-limited tmpfs)",
        (HWRUN + "test_hwrun_train_faults.py",)),
    Mechanism(
        "42 faults", "data-lost", "SIGTERM while training",
        "GracefulStop finishes the step, saves a checkpoint and exits 0; --resume finishes the run (a real "
        "`hwrun train` process signalled from outside)",
        (HWRUN + "test_hwrun_train_faults.py", HWRUN + "test_hwrun_train_run.py")),
)
