"""Test helpers: a tiny random Llama (GQA) with a real byte-level BPE tokenizer, saved like a Hub model.

Used by hwrun's tests (and handy for yours): `build_tiny_model(dir)` writes config.json,
model.safetensors, tokenizer.json and generation_config.json in about a second, with no network.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..devices import HOST_KIND

_CORPUS = (
    "The king said to the queen that the castle was cold. The queen said the king should build a fire. "
    "Once upon a time there was a little house by the river, and the people of the town walked there. "
    "It was the best of times, it was the worst of times, it was the age of wisdom and of foolishness."
)


def build_tokenizer(vocab_size: int = 320) -> object:
    """A byte-level BPE `PreTrainedTokenizerFast` (<s>, </s>, <pad>) trained on a short corpus, offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def build_tiny_model(directory: str | Path, *, seed: int = 0, vocab_size: int = 320, hidden_size: int = 64,
                     layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Path:
    """Save a random tiny LlamaForCausalLM and its tokenizer into `directory`; returns the path.
    Other families: `hwrun.testing.families.build_tiny_family`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    tokenizer.save_pretrained(path)
    config = LlamaConfig(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=len(tokenizer),
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Larger-than-default weights give peaked, well-separated logits, so greedy ties cannot flip.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    return path


def launch_cpu_workers(script: str | Path, *args: str, nproc: int = 2, timeout: float = 300) -> object:
    """Run `script args...` as `nproc` CPU processes (gloo) through `hwdist launch` on a free port.

    A clean environment for the children: no inherited rank variables, one OpenMP thread each,
    `HWENV_DEVICE=cpu`. Returns the finished `subprocess.CompletedProcess` (text output captured);
    no shell is involved. Past `timeout` the launcher and every process below it (torchrun starts each rank in a
    session of its own) are killed before `subprocess.TimeoutExpired` is raised (killing the launcher alone left the
    ranks running, spinning both cores of a test machine, and holding the output pipes open).
    """
    import contextlib
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", HWENV_DEVICE=HOST_KIND)
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "hwdist", "launch", "--kind", HOST_KIND, "--nproc-per-node", str(nproc),
            "--master-port", str(port), str(script), *map(str, args)]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as launcher:
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            tree = _descendants(launcher.pid)  # torchrun starts each rank in a session of its own
            for pid in (launcher.pid, *tree):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stdout, stderr = launcher.communicate(timeout=60)
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(argv, launcher.returncode, stdout, stderr)


def _descendants(root: int) -> list[int]:
    """Every process below `root` (Linux: parent ids from /proc), deepest last."""
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def run_under_triton_interpreter(code: str, *, timeout: float = 600) -> dict:
    """Run `code` in a fresh Python with TRITON_INTERPRET=1 (Triton's interpreter is chosen when Triton is imported,
    so never in this process) and return the JSON object its last printed line holds; asserts it succeeded."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def relaunch_after_gloo_abort(launch: Callable[[], Any], outputs: list[str | Path]) -> Any:
    """`launch()` (a `hwdist launch` of CPU ranks over gloo), and once more when a rank was killed by SIGABRT, after
    removing `outputs` (the folders it writes; none may be one it resumes from), with a warning that keeps the first
    launch's lines. The abort (gloo's C++ TCP transport; torch PR #179291's family; once "malloc(): unaligned tcache
    chunk detected" in a checkpoint save) came in the CI's oldest-pair step with both workers busy only, never alone.
    Any other failure, or a second abort, is returned as it is for the caller to assert on."""
    import shutil
    import warnings

    done = launch()
    if done.returncode != 0 and "(SIGABRT)" in done.stdout + done.stderr:
        warnings.warn(f"a rank aborted (SIGABRT) inside a gloo launch; launching once more:\n"
                      f"{done.stdout[-2000:]}{done.stderr[-2000:]}", stacklevel=2)
        for folder in outputs:
            shutil.rmtree(folder, ignore_errors=True)
        done = launch()
    return done


def run_cli_worker(root: str | Path, worker_source: str, commands: list[list[str]], nproc: int | None = None, *,
                   timeout: float = 540, fresh_outputs: list[str | Path] | None = None) -> object:
    """Write `worker_source` into `root/worker.py` and run it with `commands` (a JSON list of `hwrun` argv lists) as
    its argument: under `hwdist launch` with `nproc` CPU processes, or (None) as one plain process without a launcher,
    as a user types `hwrun train` (no rank variables, one OpenMP thread, `HWENV_DEVICE=cpu`). Asserts that it
    succeeded (the output tails in the message); returns the `subprocess.CompletedProcess`. `fresh_outputs`: the
    folders a launch writes from nothing; given, a rank's SIGABRT relaunches once (`relaunch_after_gloo_abort`)."""
    import json
    import os
    import subprocess
    import sys

    worker = Path(root) / "worker.py"
    worker.write_text(worker_source, encoding="utf-8")
    if nproc is not None:
        def launch() -> Any:
            return launch_cpu_workers(worker, json.dumps(commands), nproc=nproc, timeout=timeout)

        done = launch() if fresh_outputs is None else relaunch_after_gloo_abort(launch, fresh_outputs)
    else:
        ranks = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        env = {k: v for k, v in os.environ.items() if k not in ranks}
        env.update(OMP_NUM_THREADS="1", HWENV_DEVICE=HOST_KIND)
        done = subprocess.run([sys.executable, str(worker), json.dumps(commands)], env=env, capture_output=True,
                              text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def checkpoint_losses(out: str | Path, step: int) -> list[tuple[int, float]]:
    """(step, loss) of every logged step in `out/checkpoint-{step}/trainer_state.json`."""
    import json

    state = json.loads((Path(out) / f"checkpoint-{step}" / "trainer_state.json").read_text(encoding="utf-8"))
    return [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]


def assert_losses_close(losses: list, reference: list, steps: range, tolerance: float) -> float:
    """Both loss lists cover exactly `steps` and differ by at most `tolerance` at every step; returns the worst."""
    assert [s for s, _ in losses] == list(steps) == [s for s, _ in reference]
    worst = max(abs(a - b) for (_, a), (_, b) in zip(losses, reference, strict=True))
    assert worst <= tolerance, (worst, losses, reference)
    return worst


def launch_worker_runs(worker_source: str, folder: str | Path, model: str | Path, data: str | Path,
                       runs: list[tuple[str | Path, dict]], *, timeout: float = 600) -> object:
    """Write `worker_source` into `folder` and run it as 2 CPU processes (`launch_cpu_workers`),
    passing model, data and `runs` ((output folder, train() keywords), done in order) as a JSON
    list of {"out", "options"}. The worker writes rank{r}.json / rank{r}.safetensors per run."""
    import json

    worker = Path(folder) / "worker.py"
    worker.write_text(worker_source, encoding="utf-8")
    plan = json.dumps([{"out": str(out), "options": options} for out, options in runs])
    return launch_cpu_workers(worker, str(model), str(data), plan, timeout=timeout)


def rank_outputs(out: str | Path, nproc: int = 2) -> tuple[list[dict], list[dict]]:
    """(info dicts, trainable-weight dicts) that each rank's worker wrote into `out`."""
    import json

    from safetensors.torch import load_file

    out = Path(out)
    return ([json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)],
            [load_file(out / f"rank{r}.safetensors") for r in range(nproc)])


def assert_same_on_both_ranks(rank0: dict, rank1: dict) -> None:
    """Two ranks' weight dicts hold the same names and bit-identical tensors (and are not empty)."""
    import torch

    assert rank0 and rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name


def assert_adapter_matches(folder: str | Path, weights: dict, base: str | Path | None = None) -> object:
    """The LoRA adapter saved in `folder` loads on CPU and holds exactly `weights` (name -> tensor);
    returns the loaded base + adapter model."""
    import torch

    import hwrun
    from hwrun.model.load import load_adapter_model

    model, _ = load_adapter_model(folder, hwrun.plan(str(base or hwrun.DEFAULT_MODEL), device=HOST_KIND))
    saved = {k: v for k, v in model.named_parameters() if "lora_" in k}
    assert saved.keys() == weights.keys()
    for name, value in saved.items():
        assert torch.equal(value, weights[name]), name
    return model


def assert_merged_is_base_plus_adapter(out: str | Path, weights: dict) -> None:
    """`out` holds a plain merged model (no PEFT) whose logits equal base + the adapter saved
    beside it in `out/adapter` (which must hold `weights`), and differ from the base's."""
    import torch

    import hwrun

    out = Path(out)
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    with_adapter = assert_adapter_matches(out / "adapter", weights)
    merged, tokenizer = hwrun.load(hwrun.plan(str(out), device=HOST_KIND))
    assert not any("lora_" in k for k, _ in merged.named_parameters())  # a plain model, no PEFT
    base, _ = hwrun.load(hwrun.plan(hwrun.DEFAULT_MODEL, device=HOST_KIND))
    ids = tokenizer("The queen said to the king", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = merged(input_ids=ids).logits
        torch.testing.assert_close(logits, with_adapter(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
        assert (logits - base(input_ids=ids).logits).abs().max() > 1e-2  # the adapter is in it


def assert_saved_full_model(out: str | Path, weights: dict, base: str | Path | None = None) -> None:
    """`out` holds one plain `model.safetensors` (no index, no shards, no adapter) with every
    tensor of the base model at full shape, equal to `weights`, not all equal to the base's, and
    `hwrun.model.load` gives a model whose parameters are `weights`."""
    import torch
    from safetensors.torch import load_file

    import hwrun

    out = Path(out)
    files = sorted(p.name for p in out.iterdir() if p.name.startswith("model"))
    assert files == ["model.safetensors"] and (out / "config.json").is_file(), files
    assert not (out / "adapter_config.json").exists()
    original = load_file(Path(base or hwrun.DEFAULT_MODEL) / "model.safetensors")
    saved = load_file(out / "model.safetensors")
    assert saved.keys() == original.keys() == weights.keys()
    for name, value in saved.items():  # whole tensors, not one rank's shard
        assert value.shape == original[name].shape and torch.equal(value, weights[name]), name
    assert any(not torch.equal(saved[k], original[k]) for k in original)  # it trained
    model, _ = hwrun.load(hwrun.plan(str(out), device=HOST_KIND))
    loaded = dict(model.named_parameters())
    assert loaded.keys() == weights.keys()
    for name, value in loaded.items():
        assert torch.equal(value, weights[name]), name


def assert_same_training(losses: list, reference_losses: list, weights: dict, reference_weights: dict,
                         *, steps: int | None = None) -> None:
    """Two runs followed one curve: the same logged steps (1..`steps` when given), per-step losses
    equal to 1e-4, and final weights equal to rtol 1e-4 / atol 1e-5 (reduction order may differ)."""
    import math

    import torch

    assert [s for s, _ in losses] == [s for s, _ in reference_losses]
    if steps is not None:
        assert [s for s, _ in losses] == list(range(1, steps + 1))
    for (step, loss), (_, expected) in zip(losses, reference_losses, strict=True):
        assert math.isclose(loss, expected, rel_tol=0, abs_tol=1e-4), (step, loss, expected)
    assert weights and weights.keys() == reference_weights.keys()
    for name in reference_weights:
        torch.testing.assert_close(weights[name], reference_weights[name], rtol=1e-4, atol=1e-5, msg=name)
