"""Train the tiny Llama model that ships inside ``hwrun``.

The result is the default model of ``hwrun generate`` and the model that every
test uses: a 4-layer Llama-architecture causal LM with grouped-query attention
(4 query heads sharing 2 key/value heads), tied embeddings and a byte-level BPE
tokenizer, trained on CPU for a few minutes on the public-domain text committed
in ``tools/data/`` (see ``tools/data/README.md``).

Everything is seeded, so a run with ``--steps N`` is reproducible (up to
floating-point differences between CPUs/thread counts).  A run with
``--minutes M`` (the default) first times a few throw-away steps, turns the
time budget into a step count, and records that count so that the run can be
repeated exactly with ``--steps``.

Outputs, in ``--output`` (default: the path that ships in the wheel)::

    config.json  generation_config.json  model.safetensors
    tokenizer.json  tokenizer_config.json  special_tokens_map.json (if written)
    sample_train.txt      held-out text for fine-tuning tests (never trained on)
    training_summary.json steps, time, losses, sample generation
    README.md             the model card, generated from the run's numbers

Usage::

    .venv/bin/python tools/train_tiny_model.py                 # ~10 min on 2 cores
    .venv/bin/python tools/train_tiny_model.py --steps 200 --output /tmp/tiny
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "tools" / "data"
DEFAULT_OUTPUT = REPO / "packages" / "hwrun" / "src" / "hwrun" / "models" / "tiny-llama"

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0, 1, 2, 3
SAMPLE_PROMPTS = ["The king said", "Once upon a time", "Alice was"]

# Held-out slices: never seen by the tokenizer or the model during training.
# They form the evaluation set and are written out as sample_train.txt for
# fine-tuning tests (``hwrun train``).  (file name, marker where the slice
# starts; None = the whole file).
HELD_OUT = [
    ("alice_in_wonderland.txt", "CHAPTER XII"),
    ("as_you_like_it.txt", "\n\nACT V\n\n"),
    ("kjv_ruth.txt", None),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train the tiny Llama model shipped in hwrun.")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="output directory")
    p.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA, help="folder of *.txt training text"
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--steps", type=int, default=None, help="number of optimiser steps (reproducible)"
    )
    budget.add_argument(
        "--minutes",
        type=float,
        default=10.0,
        help="time budget, turned into a step count (default 10)",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--vocab-size", type=int, default=3072)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--intermediate-size", type=int, default=352)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--max-position-embeddings", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=256, help="training window length in tokens")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--lr", type=float, default=3e-3, help="peak learning rate (cosine decay to 10%%)"
    )
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=40, help="generation_config default")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- data


def load_corpus(data_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """Return (train documents, held-out documents, names of the files used)."""
    files = sorted(data_dir.glob("*.txt"))
    if not files:
        raise SystemExit(f"no *.txt files in {data_dir}")
    held = dict(HELD_OUT)
    train, heldout = [], []
    for f in files:
        text = f.read_text(encoding="utf-8")
        if f.name in held:
            marker = held[f.name]
            cut = 0 if marker is None else text.index(marker)
            if cut:
                train.append(text[:cut].rstrip() + "\n")
            heldout.append(text[cut:].strip() + "\n")
        else:
            train.append(text)
    return train, heldout, [f.name for f in files]


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    bos = tok.token_to_id("<s>")
    # Llama convention: <s> in front of every sequence, no </s> at the end.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok


def wrap_tokenizer(tok, max_len: int):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        padding_side="left",
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )


def encode_docs(hf_tok, docs: list[str]) -> list[int]:
    """One token stream: <s> doc </s> <s> doc </s> ..."""
    ids: list[int] = []
    for d in docs:
        ids.extend(hf_tok(d, add_special_tokens=True)["input_ids"])
        ids.append(hf_tok.eos_token_id)
    return ids


# --------------------------------------------------------------------------- model


def build_model(args, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def make_batch(stream, seq_len: int, batch_size: int, gen, bos_id: int):
    """Random windows of the token stream, each starting with <s> like a prompt."""
    import torch

    starts = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=gen)
    rows = [
        torch.cat([torch.tensor([bos_id]), stream[s : s + seq_len - 1]]) for s in starts.tolist()
    ]
    return torch.stack(rows)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model, args):
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )


def train_step(model, opt, batch, lr: float) -> float:
    import torch

    for g in opt.param_groups:
        g["lr"] = lr
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def evaluate(model, eval_batches) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        losses = [model(input_ids=b, labels=b).loss.item() for b in eval_batches]
    model.train()
    return sum(losses) / len(losses)


def greedy_samples(model, tok, max_new_tokens: int) -> dict[str, str]:
    import torch

    model.eval()
    enc = tok(SAMPLE_PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return {p: p + t for p, t in zip(SAMPLE_PROMPTS, texts, strict=True)}


def reproduce_command(args: argparse.Namespace, steps: int) -> str:
    """The command line that repeats this run: --steps instead of --minutes, no --output."""
    defaults = vars(parse_args([]))
    parts = ["python tools/train_tiny_model.py", f"--steps {steps}", f"--seed {args.seed}"]
    for key, value in vars(args).items():
        if key in ("steps", "minutes", "seed", "output", "data_dir") or value == defaults[key]:
            continue
        parts.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


# --------------------------------------------------------------------------- card


def write_model_card(out: Path, summary: dict) -> None:
    best = min(summary["eval_history"], key=lambda e: e["eval_loss"])
    sizes = "\n".join(f"| `{name}` | {size:,} |" for name, size in summary["file_sizes"].items())
    samples = "\n\n".join(f"```text\n{text}\n```" for text in summary["samples"].values())
    c = summary["config"]
    card = f"""# tiny-llama — the model that ships inside `hwrun`

A deliberately tiny Llama-architecture causal language model and its tokenizer,
small enough to live in the `hwrun` wheel ({summary["total_bytes"] / 1e6:.1f} MB) and fast
enough to run in every test on a CPU. It is the default model of `hwrun generate`.
It was trained on {summary["train_chars"] / 1e6:.2f} MB of public-domain English and
has largely memorised it, so it writes recognisable words and phrases in the style of the King James Bible, *Alice's Adventures in
Wonderland* and *As You Like It*, but no sense. Do not use it for anything but
testing the machinery.

Load it offline with plain Transformers:

```python
from importlib.resources import files
from transformers import AutoTokenizer, LlamaForCausalLM
path = files("hwrun") / "models" / "tiny-llama"
tok = AutoTokenizer.from_pretrained(path)          # padding_side="left"
model = LlamaForCausalLM.from_pretrained(path)     # float32
enc = tok(["The king said", "Once upon a time"], return_tensors="pt", padding=True)
print(tok.batch_decode(model.generate(**enc, max_new_tokens=20, do_sample=False)))
```

## Architecture

`LlamaForCausalLM`, {summary["parameters"]:,} parameters (embeddings tied with the LM head), stored in float32.

| setting | value |
| --- | --- |
| layers | {c["num_hidden_layers"]} |
| hidden size | {c["hidden_size"]} |
| MLP intermediate size (SwiGLU) | {c["intermediate_size"]} |
| attention heads / key-value heads (GQA) | {c["num_attention_heads"]} / {c["num_key_value_heads"]} (head dim {c["head_dim"]}) |
| max position embeddings (RoPE, theta {c["rope_theta"]:g}) | {c["max_position_embeddings"]} |
| vocabulary | {c["vocab_size"]} (byte-level BPE) |
| tie_word_embeddings | true |

Tokenizer: byte-level BPE trained with the `tokenizers` library on the same
training text (never produces `<unk>`), wrapped as `PreTrainedTokenizerFast`.
Special tokens: `<unk>`=0, `<s>`=1 (BOS, prepended to every sequence),
`</s>`=2 (EOS, ends every training document), `<pad>`=3. `padding_side` is
`left`, so batched generation works out of the box. `generation_config.json`
makes generation greedy (`do_sample: false`) with `max_new_tokens: {summary["max_new_tokens"]}`.

## Files

| file | bytes |
| --- | --- |
{sizes}

## Training data

The text in `tools/data/` of the hwstack repository (see its `README.md` for
sources and licences), all public domain:

- *Alice's Adventures in Wonderland*, Lewis Carroll (1865) — the Project
  Gutenberg "Millennium Fulcrum Edition 2.9" as found in the Canterbury corpus
  (`alice29.txt`);
- *As You Like It*, William Shakespeare (First Folio, 1623) — Canterbury corpus
  `asyoulik.txt`;
- King James Version (1611): Genesis, Exodus, Joshua, Judges, Ruth, 1–2 Samuel,
  1–2 Kings, Esther, Daniel, Jonah — from Debian's `bible-kjv-text` package.

Held out from training (and from the tokenizer): Alice chapter XII, Act V of
*As You Like It* and the Book of Ruth. That text is the evaluation set and is
shipped as `sample_train.txt` ({summary["file_sizes"].get("sample_train.txt", 0):,} bytes) for fine-tuning tests
(`hwrun train`). Training tokens: {summary["train_tokens"]:,}; held-out tokens: {summary["heldout_tokens"]:,}.

## Training

```bash
{summary["reproduce"]}
```

{summary["budget_note"]}
{summary.get("where", "")}

`tools/train_tiny_model.py`, seed {summary["seed"]}, on CPU ({summary["threads"]} threads,
{summary["machine"]}), torch {summary["torch"]}, transformers {summary["transformers"]},
tokenizers {summary["tokenizers"]}.
AdamW (betas 0.9/0.95, weight decay {summary["weight_decay"]}), peak learning rate {summary["lr"]}
with {summary["warmup"]} warm-up steps and cosine decay to 10%, gradient clipping 1.0,
batches of {summary["batch_size"]} random windows of {summary["seq_len"]} tokens, each window starting with `<s>`.

| | |
| --- | --- |
| optimiser steps | {summary["steps"]:,} |
| tokens seen | {summary["tokens_seen"]:,} (~{summary["epochs"]:.1f} epochs) |
| training time | {summary["train_seconds"]:.0f} s |
| final training loss (mean of last 50 steps) | {summary["final_train_loss"]:.3f} |
| held-out loss / perplexity | {summary["final_eval_loss"]:.3f} / {math.exp(summary["final_eval_loss"]):.1f} |
| lowest held-out loss during the run | {best["eval_loss"]:.3f} at step {best["step"]:,} |

The held-out loss is far above the training loss: with ~1.1M parameters and
only {summary["train_tokens"]:,} training tokens, a run this long memorises the training text
rather than generalising (the held-out loss bottoms out early and then rises). For a model
whose job is to print recognisable English in tests that is what we want; it also means
fine-tuning on `sample_train.txt` shows a clear drop in loss.

A `--minutes` run turns its time budget into a step count on the machine at hand;
`--steps` makes a run repeatable (same seed, same step count; floating-point
results can still differ slightly between CPUs, thread counts and library versions).
`training_summary.json` holds the same numbers and the loss curve.

## Sample output

Greedy decoding, `max_new_tokens={summary["max_new_tokens"]}`, prompts batched with left padding:

{samples}
"""
    (out / "README.md").write_text(card, encoding="utf-8")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    raw_argv = list(argv if argv is not None else sys.argv[1:])
    args = parse_args(raw_argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import tokenizers
    import torch
    import transformers
    from transformers import GenerationConfig

    transformers.logging.set_verbosity_error()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    train_docs, heldout_docs, names = load_corpus(args.data_dir)
    print(
        f"data: {len(names)} files, {sum(map(len, train_docs)):,} train chars, "
        f"{sum(map(len, heldout_docs)):,} held-out chars"
    )

    tok = wrap_tokenizer(train_tokenizer(train_docs, args.vocab_size), args.max_position_embeddings)
    train_stream = torch.tensor(encode_docs(tok, train_docs), dtype=torch.long)
    heldout_stream = torch.tensor(encode_docs(tok, heldout_docs), dtype=torch.long)
    print(
        f"tokenizer: vocab {len(tok)}; {len(train_stream):,} train tokens, {len(heldout_stream):,} held-out tokens"
    )

    model = build_model(args, tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters")

    # Fixed evaluation windows from the held-out text.
    egen = torch.Generator().manual_seed(args.seed + 1)
    eval_batches = [
        make_batch(heldout_stream, args.seq_len, args.batch_size, egen, tok.bos_token_id)
        for _ in range(4)
    ]

    # Turn a time budget into a step count, on a throw-away copy.
    if args.steps is None:
        probe = copy.deepcopy(model)
        popt = make_optimizer(probe, args)
        pgen = torch.Generator().manual_seed(args.seed + 2)
        for _ in range(3):  # warm-up
            train_step(
                probe,
                popt,
                make_batch(train_stream, args.seq_len, args.batch_size, pgen, tok.bos_token_id),
                args.lr,
            )
        t0 = time.perf_counter()
        for _ in range(10):
            train_step(
                probe,
                popt,
                make_batch(train_stream, args.seq_len, args.batch_size, pgen, tok.bos_token_id),
                args.lr,
            )
        per_step = (time.perf_counter() - t0) / 10
        # leave ~4% of the budget for evaluations
        total_steps = max(1, int(args.minutes * 60 * 0.96 / per_step))
        del probe, popt
        print(
            f"budget {args.minutes:g} min at {per_step * 1000:.0f} ms/step -> {total_steps} steps"
        )
    else:
        total_steps = args.steps

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    opt = make_optimizer(model, args)
    model.train()
    history, evals, recent = [], [], []
    t0 = time.perf_counter()
    for step in range(total_steps):
        batch = make_batch(train_stream, args.seq_len, args.batch_size, gen, tok.bos_token_id)
        loss = train_step(model, opt, batch, lr_at(step, total_steps, args.lr, args.warmup))
        recent.append(loss)
        if (step + 1) % 50 == 0 or step + 1 == total_steps:
            history.append(
                {"step": step + 1, "loss": round(sum(recent[-50:]) / len(recent[-50:]), 4)}
            )
        if (step + 1) % args.eval_every == 0 or step + 1 == total_steps:
            ev = evaluate(model, eval_batches)
            evals.append({"step": step + 1, "eval_loss": round(ev, 4)})
            print(
                f"step {step + 1:5d}/{total_steps}  train loss {sum(recent[-50:]) / len(recent[-50:]):.3f}  "
                f"held-out loss {ev:.3f}  {time.perf_counter() - t0:6.0f}s",
                flush=True,
            )
    train_seconds = time.perf_counter() - t0
    final_train_loss = sum(recent[-50:]) / len(recent[-50:])
    final_eval_loss = evals[-1]["eval_loss"]

    # Save: fp32 safetensors, tokenizer, generation defaults, held-out text.
    out: Path = args.output
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.max_new_tokens,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "sample_train.txt").write_text("\n".join(heldout_docs), encoding="utf-8")

    samples = greedy_samples(model, tok, args.max_new_tokens)
    for text in samples.values():
        print(f"sample: {text!r}")

    cfg = model.config
    summary = {
        "parameters": n_params,
        "steps": total_steps,
        "seed": args.seed,
        "threads": args.threads,
        "train_seconds": round(train_seconds, 1),
        "final_train_loss": round(final_train_loss, 4),
        "final_eval_loss": final_eval_loss,
        "train_chars": sum(map(len, train_docs)),
        "train_tokens": len(train_stream),
        "heldout_tokens": len(heldout_stream),
        "tokens_seen": total_steps * args.batch_size * args.seq_len,
        "epochs": total_steps * args.batch_size * args.seq_len / len(train_stream),
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "lr": args.lr,
        "warmup": args.warmup,
        "weight_decay": args.weight_decay,
        "max_new_tokens": args.max_new_tokens,
        "data_files": names,
        "command": " ".join(["python tools/train_tiny_model.py", *raw_argv]),
        "reproduce": reproduce_command(args, total_steps),
        "budget_note": (
            f"The run was started with a time budget (`--minutes {args.minutes:g}`), which came to "
            f"{total_steps} steps on that machine; the line above repeats it with that step count."
            if args.steps is None
            else ""
        ),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "config": {
            "num_hidden_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings,
            "vocab_size": cfg.vocab_size,
            "rope_theta": (cfg.rope_parameters or {}).get("rope_theta", 10000.0),
        },
        "samples": samples,
        "loss_history": history,
        "eval_history": evals,
    }
    for p in out.iterdir():  # safetensors writes 0600; make the shipped files world-readable
        if p.is_file():
            p.chmod(0o644)
    # The card and the summary list every file but themselves.
    summary["file_sizes"] = {
        p.name: p.stat().st_size
        for p in sorted(out.iterdir())
        if p.is_file() and p.name not in ("README.md", "training_summary.json")
    }
    summary["total_bytes"] = sum(summary["file_sizes"].values())
    (out / "training_summary.json").write_text(
        json.dumps(summary, indent=2) + "\n", encoding="utf-8"
    )
    write_model_card(out, summary)

    print(
        f"final training loss {final_train_loss:.4f}, held-out loss {final_eval_loss:.4f}, "
        f"{total_steps} steps in {train_seconds:.0f}s"
    )
    print(f"saved to {out} ({summary['total_bytes'] / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
