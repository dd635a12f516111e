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
NITS = "tests/reliability/test_issue42_nits.py"

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
        "`booleans.check_booleans`): positions an int >= 1 and >= the block size, one step's blocks within the "
        "data, r within the hidden size, bool-typed fields True/False",
        (HWRUN + "test_hwrun_train_bounds.py",)),
    Mechanism(
        "42.6", "hang-unbounded", "`hwrun chat` against a server that accepts but never answers waited 600 s per "
        "request (one socket timeout for everything)",
        "`hwrun.serve.client.ApiClient` connects within `--connect-timeout` (10 s) and then reads with "
        "`--read-timeout` (120 s, hwrun serve's --stall-seconds) between any two bytes; either expiring is a "
        "ChatClientError naming the URL, what was awaited and the option (tested against a port that never completes "
        "the connection, one that never answers, and a stream that stalls mid-answer)",
        (HWRUN + "test_hwrun_chat_client.py",)),
    Mechanism(
        "42.6", "traceback-from-cli", "malformed Server-Sent Events: a chunk that is not a JSON object (AttributeError "
        "as an internal error), invalid JSON (ValueError), an error given as a string; lines that are not events and "
        "a stream that ended without `data: [DONE]` taken silently as a whole answer",
        "the client reads the stream as the SSE specification has it (`data:` lines joined per event, comments and "
        "event/id/retry fields ignored, a line over 1 MiB refused) and checks the Content-Type; anything else, an "
        "event that is not a JSON object, an error event (its message and code shown, the conversation goes on), "
        "non-UTF-8 bytes and an end before `[DONE]` are ChatClientErrors naming the URL, the line and what came",
        (HWRUN + "test_hwrun_chat_client.py",)),
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
    Mechanism(
        "42 faults", "hang-unbounded", "hours of streams with clients leaving at any point: requests left running, "
        "memory or open files growing in the HTTP front or the engine process",
        "a request's state lives in the front's `runs` and the engine's slots until it finishes or its client leaves "
        "(`Run.abandon` cancels it in the engine); the soak (`tools/soak_serve.py`, bounded in CI: 32 streams, 20 s) "
        "checks every request finished or was cancelled by its client, the server counted each once, nothing runs "
        "when the load stops, RSS within 16 MiB and descriptors at the idle baseline, SIGTERM exit 0 (figures below)",
        (HWRUN + "test_hwrun_serve_soak.py",)),
    Mechanism(
        "42 faults", "data-lost", "SIGTERM while `hwrun serve` is in a long prefill; kill -9 of its engine process "
        "while it streams",
        "the drain: new requests get 503, the ones in flight run to their end within --grace-seconds and are then "
        "cut with a `shutting_down` error event and `[DONE]`; the engine process is stopped and the exit is 0. An "
        "engine process that dies ends every request in flight with an error event and `[DONE]` (a 500 for a whole "
        "answer) within seconds, /health 503 \"failed\"",
        (HWRUN + "test_hwrun_serve_soak_faults.py", HWRUN + "test_hwrun_serve.py")),
    Mechanism(
        "42.8", "silently-accepted", "hl-smi output with a header and no rows, module IDs past 0..7 or ids past "
        "int()'s digit limit read as a mapping; a NaN adapter generated nothing with exit 0; a misspelt compile "
        "backend kept (torch refused it only when compiling, after the model loaded); one Gaudi process with several "
        "modules listed said nothing of the idle ones",
        "each checked where the value enters: `hwenv.parse_hl_smi_csv` (no rows, module ID < 8, at most 6 digits, a "
        "BOM skipped); `hwrun.model.adapters.check_finite` reads every float of the adapter's safetensors (numpy over "
        "a memory map, no torch) at plan() and load(); `hwcompile.route_backend` looks a name it would keep up in "
        "torch's registry and names the closest (Gaudi reroutes it with its warning, as Transformers does); "
        "`hwdist.gaudi_world` logs which listed modules stay idle (not refused: the container runtime writes "
        "HABANA_VISIBLE_MODULES for every mounted card) and `idle_modules` gives a launcher the list",
        (NITS,)),
    Mechanism(
        "42.8", "unclear-error", "hl-smi exiting non-zero with an empty reason (and a non-UTF-8 byte as a decode "
        "traceback); `Accelerator(count='2')` a TypeError from a comparison; an adapter's missing base blamed on "
        "`--model`",
        "hl-smi's stderr, else its stdout, else \"it printed nothing\" with the fix, its bytes decoded by hwenv; "
        "`Accelerator.__post_init__` checks kind, count and bf16 types (AcceleratorFieldError naming the value); "
        "`adapter_base_model` resolves the base before the plan does and names base_model_name_or_path in "
        "adapter_config.json and the fix",
        (NITS,)),
)
