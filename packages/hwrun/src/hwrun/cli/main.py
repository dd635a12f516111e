"""`hwrun plan|generate` (and `train`, `serve`, `chat` from their modules): the command line over plan/load/generate.

Errors are one line on stderr with exit 2 (hwenv.cli_errors, shared by every hwstack CLI); `--verbose`
adds the traceback. Every option is checked before the model loads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence

logger = logging.getLogger(__name__)

#: Modules of `hwrun.cli` that add subcommands (`add_parser(subparsers)`); importing one must not import torch.
COMMAND_MODULES = ("train", "serve", "chat")

#: Largest --batch-file read (bytes): a prompt file beyond this is refused instead of filling memory.
BATCH_FILE_LIMIT = 64 * 1024 * 1024

TP_HELP = ("split the model across N processes, one per device, with Transformers' tensor-parallel plan (hwrun starts "
           "them through torchrun; rank 0 prints); N must divide the attention and KV heads")

TORCH_THREADS_HELP = ("torch intra-op threads (default: all cores but one on the host, 1 on an accelerator; "
                      "OMP_NUM_THREADS wins; the rule of hwrun serve, shown by hwrun plan)")

#: Prompts per `model.generate` call when a batch file runs with static batching (one progress step each).
STATIC_CHUNK = 16


def _add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto (detect) or a device kind: hpu, xpu, rocm, cuda, mps, cpu (or a plug-in's)")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    parser.add_argument("--attention", default="auto", help="auto, sdpa, eager, flash_attention_2, ...")
    parser.add_argument("--use-kernels", action="store_true", help="replace supported layers with Hub kernels (X12)")
    parser.add_argument("--compile", nargs="?", const=True, default=False, metavar="BACKEND",
                        help="compile the decode step (optionally with this torch.compile backend)")
    parser.add_argument("--quantization", choices=("4bit", "8bit"), default=None, help="bitsandbytes 4/8-bit (X14)")
    parser.add_argument("--quantize", default=None, metavar="METHOD",
                        help="int4-weight-only, int8-weight-only, int8-dynamic, float8 (torchao), bnb-4bit, bnb-8bit "
                             "(quantize on load), or awq, gptq, auto-round, compressed-tensors, fp8 (pre-quantized "
                             "checkpoints), fp8-inc (Gaudi FP8 through Intel Neural Compressor, from a measured "
                             "config: --inc-config); hqq is in the table, but no device runs it in hwrun yet; refused "
                             "before load where the device does not run it (hwrun's README has the table)")
    parser.add_argument("--inc-config", default=None, metavar="PATH",
                        help="with --quantize fp8-inc: Intel Neural Compressor's FP8 config in QUANTIZE mode, whose "
                             "measurements (dump_stats_path) exist; default: $QUANT_CONFIG, as INC reads it")
    parser.add_argument("--keep-lm-head", action="store_true",
                        help="with --quantize int8/int4-weight-only: keep the LM head in the model's dtype (by "
                             "default it is quantized too, as an untied copy: half of an int4 token's bytes otherwise)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code")


def _quantization_of(args: argparse.Namespace) -> str | None:
    """--quantize METHOD, or --quantization 4bit|8bit (bitsandbytes' spelling); both only when they agree."""
    quantize, bnb = getattr(args, "quantize", None), getattr(args, "quantization", None)
    if quantize and bnb and quantize not in (bnb, f"bnb-{bnb}"):
        from ..errors import QuantizationError

        raise QuantizationError(f"--quantize {quantize} and --quantization {bnb} disagree; pass one "
                                f"(--quantization {bnb} is --quantize bnb-{bnb}).")
    return quantize or bnb


def _plan_from(args: argparse.Namespace, model: str | None):
    from ..model.plan import plan
    from .quiet import note_plan

    run_plan = plan(model, device=args.device, dtype=args.dtype, attention=args.attention,
                    use_kernels=args.use_kernels, compile=args.compile, quantization=_quantization_of(args),
                    trust_remote_code=args.trust_remote_code, tp=getattr(args, "tp", 1),
                    quantize_lm_head=not getattr(args, "keep_lm_head", False),
                    inc_config=getattr(args, "inc_config", None))
    note_plan(run_plan)
    return run_plan


def build_parser() -> argparse.ArgumentParser:
    """The `hwrun` argument parser (subcommands plan, generate, and train when the training half is present)."""
    from hwenv.cli_errors import OneLineParser

    parser = OneLineParser(prog="hwrun", description="Plan, load and run Transformers models on XPU, "
                           "Gaudi, CUDA and CPU, with every decision explained.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log every decision and fallback; print the traceback with an error")
    sub = parser.add_subparsers(dest="command", required=True)

    p_plan = sub.add_parser("plan", help="print every decision for running MODEL here, with reasons")
    p_plan.add_argument("model", nargs="?", default=None, help="local folder or Hub id (default: the shipped tiny model)")
    p_plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_plan_options(p_plan)
    p_plan.add_argument("--tp", type=int, default=1, metavar="N", help=TP_HELP)
    p_plan.set_defaults(func=_cmd_plan)

    p_gen = sub.add_parser("generate", help="generate text for PROMPT(s) or a --batch-file, printing tokens/s")
    p_gen.add_argument("prompts", nargs="*", metavar="PROMPT")
    p_gen.add_argument("--model", default=None, help="local folder or Hub id (default: the shipped tiny model)")
    _add_plan_options(p_gen)
    p_gen.add_argument("--tp", type=int, default=1, metavar="N", help=TP_HELP)
    p_gen.add_argument("--max-new-tokens", type=int, default=50,
                       help="new tokens per prompt (bounded by the model's context and HWRUN_MAX_NEW_TOKENS_LIMIT)")
    p_gen.add_argument("--batch-file", default=None, help="a text file with one prompt per line")
    p_gen.add_argument("--batching", choices=("auto", "static", "continuous"), default="auto")
    p_gen.add_argument("--decode", choices=("auto", "generate", "graphs"), default="auto",
                       help="graphs: static cache + the device's graph replay per token (CUDA, ROCm, XPU; HPU in lazy mode); greedy or sampled")
    p_gen.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p_gen.add_argument("--temperature", type=float, default=None, help="sampling temperature > 0 (with --sample; default 1.0)")
    p_gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling, 0 < p <= 1 (with --sample)")
    p_gen.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens, k >= 1 (with --sample)")
    p_gen.add_argument("--seed", type=int, default=None, help="seed for sampling (with --sample)")
    p_gen.add_argument("--no-stream", action="store_true", help="print the text at the end instead of streaming")
    p_gen.add_argument("--json", action="store_true", help="print the result as JSON (no streaming)")
    p_gen.add_argument("--torch-threads", type=int, default=None, metavar="N",
                       help=TORCH_THREADS_HELP)
    p_gen.add_argument("--timings", action="store_true",
                       help="print where the wall time went: start-up (imports), plan, load, generate")
    p_gen.add_argument("--verify", action="store_true",
                       help="compare every byte of a model hwrun train wrote with its record (default: every byte up "
                            "to 512 MiB, sizes and safetensors headers above)")
    p_gen.set_defaults(func=_cmd_generate)

    import importlib

    for name in COMMAND_MODULES:  # each adds its own subcommand(s) with `add_parser(sub)`
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ImportError as exc:  # an optional half (training, serving) is not installed
            logger.debug("hwrun %s not available: %s", name, exc)
        else:
            module.add_parser(sub)
    return parser


def decode_rows(run_plan) -> list[tuple[str, str, str]]:
    """(field, value, reason) of the decode path `generate()` takes here for one prompt and for many
    (graph replay or Transformers' loop, the batching, and whether the step is compiled for `hwrun generate`'s
    default 50 new tokens), as `hwrun plan` shows them."""
    from ..inference.decision import planned

    rows = []  # a tensor-parallel plan too: hwrun's engine on every rank (the decision's tp rule)
    for label, prompts in (("decode (1 prompt)", 1), ("decode (64 prompts)", 64)):
        decision = planned(run_plan, prompts)
        rows.append((label, f"{decision.decode}, {decision.batching} batching",
                     f"{decision.reason}; batching: {decision.batching_reason}{_built_with(decision)}"))
    return rows


def _built_with(decision) -> str:
    """What hwrun's loops are built with for `decision` (step, graphs, row buckets), as reason text."""
    if decision.decode != "graphs":
        return ""
    text = f"; engine step: {decision.step} ({decision.step_reason}); graphs: {decision.graphs_reason}"
    if decision.buckets_reason:
        text += f"; row buckets: {decision.buckets_reason}"
    if decision.compile_reason and decision.compile_reason not in decision.reason:
        text += f"; compile: {decision.compile_reason}"
    return text


def serve_row(run_plan) -> tuple[str, str, str]:
    """(field, value, reason) of the engine `hwrun serve` (--engine auto, the default --max-concurrency) starts
    on this plan, as `planned_serving` decides before load; a refusal is shown, not raised."""
    from ..errors import EngineStartError
    from ..inference.decision import planned_serving
    from ..serve.config import ServeConfig

    slots = ServeConfig().max_concurrency
    label = f"serve (--max-concurrency {slots})"
    try:
        decision = planned_serving(run_plan, slots=slots)
    except EngineStartError as exc:
        return label, "refused", str(exc)
    name = "hwrun's engine (slots)" if decision.engine == "slots" else "Transformers' continuous batching"
    return label, name, f"{decision.reason}{_built_with(decision)}"


#: What the core `torch_threads_for` leaves free is for, in `hwrun generate`, `hwrun train` and `hwrun plan`'s row.
BESIDE = "the process's own Python work (data, tokenizing, streaming; a server's event loop) and the rest of the host"


def torch_threads(run_plan, given: int | None = None) -> tuple[int | None, str]:
    """(torch intra-op threads, why) for a run of `run_plan` on this host: `hwrun.devices.torch_threads_for`, the
    rule `hwrun serve` uses too (None: OMP_NUM_THREADS is set and torch's own count is kept)."""
    from ..devices import host_cores, torch_threads_for

    return torch_threads_for(run_plan.accelerator.platform.is_accelerator, host_cores(), given=given,
                             beside=BESIDE)


def threads_row(run_plan) -> tuple[str, str, str]:
    """`hwrun plan`'s `torch threads` row: what `hwrun generate`, `train` and `serve` set, and why."""
    threads, reason = torch_threads(run_plan)
    return ("torch threads", "torch's own" if threads is None else str(threads),
            f"{reason} (hwrun generate, train and serve; --torch-threads N to choose)")


@contextlib.contextmanager
def torch_threads_set(run_plan, given: int | None):
    """torch's intra-op threads set by `torch_threads` while the block runs, then given back (`main()` also runs
    in-process: tests, `python -m`). On a loaded 2-core host 2 threads decoded the tiny model at 2-17 tokens/s,
    1 at 150-265, and trained its LoRA at ~3.5 s a step against ~0.8 s (issue 40)."""
    threads, reason = torch_threads(run_plan, given)
    logger.info("torch threads: %s (%s)", threads if threads is not None else "torch's own", reason)
    if threads is None:
        yield None
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)


def _cmd_plan(args: argparse.Namespace) -> int:
    run_plan = _plan_from(args, args.model)
    decode = decode_rows(run_plan)
    serve = serve_row(run_plan)
    threads = threads_row(run_plan)
    if args.json:
        data = run_plan.to_dict()
        data["decode"] = {label: {"value": value, "reason": reason} for label, value, reason in decode}
        data["serve"] = {"value": serve[1], "reason": serve[2]}
        data["torch_threads"] = {"value": threads[1], "reason": threads[2]}
        print(json.dumps(data, indent=2, default=str))
    else:
        print(run_plan.render([*decode, serve, threads]))
    return 0


def read_batch_file(path: str, limit: int = BATCH_FILE_LIMIT) -> list[str]:
    """Prompts from a UTF-8 text file, one per non-empty line; GenerateError when none, when the file is
    not text, or when it is larger than `limit` bytes (or not a regular file, e.g. /dev/zero)."""
    import os
    import stat

    from ..errors import GenerateError

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise GenerateError(f"--batch-file {path!r} is not a regular file; pass a text file, one prompt per line.")
        if info.st_size > limit:
            raise GenerateError(f"--batch-file {path!r} is {info.st_size:,} bytes, more than the {limit:,}-byte limit "
                                "for a prompt file; split it into smaller files.")
        with open(path, encoding="utf-8") as handle:
            prompts = [line.rstrip("\n") for line in handle if line.strip()]
    except UnicodeDecodeError as exc:
        raise GenerateError(f"--batch-file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); pass a text "
                            "file, one prompt per line.") from exc
    except OSError as exc:
        raise GenerateError(f"--batch-file {path!r} cannot be read ({exc}); pass a text file, one prompt per line.") from exc
    if not prompts:
        raise GenerateError(f"--batch-file {path!r} has no prompts; write one prompt per line.")
    return prompts


def announce_compile_cache(run_plan) -> None:
    """Point torch's compile caches at the persistent folder (hwcompile) and say on stderr whether this run
    compiles cold or reads graphs an earlier run compiled."""
    import hwcompile

    cache = hwcompile.enable_persistent_cache()
    if not cache.on:
        print(f"hwrun: compile on ({run_plan.compile.backend}); persistent compile cache {cache.reason}",
              file=sys.stderr)
        return
    state = "warm: reusing compiled graphs" if cache.warm else "cold: the first call compiles the decode step"
    print(f"hwrun: compile on ({run_plan.compile.backend}); compile cache {cache.folder} ({state})", file=sys.stderr)


def sampling_options(args: argparse.Namespace) -> dict:
    """generate()'s sampling keywords from the flags, refusing flags that would do nothing or are out of range."""
    from ..errors import GenerateError

    given = {flag: value for flag, value in (("--temperature", args.temperature), ("--top-p", args.top_p),
                                             ("--top-k", args.top_k), ("--seed", args.seed)) if value is not None}
    if given and not args.sample:
        names = ", ".join(f"{flag} {value}" for flag, value in given.items())
        raise GenerateError(f"{names}: sampling options do nothing without --sample (greedy decoding is the "
                            "default); add --sample, or drop them.")
    if args.temperature is not None and not args.temperature > 0:
        raise GenerateError(f"--temperature {args.temperature} must be > 0 (1.0 samples from the model's "
                            "distribution, smaller is closer to greedy); for greedy decoding leave out --sample.")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise GenerateError(f"--top-p {args.top_p} must be in (0, 1]: the share of probability mass to sample from.")
    if args.top_k is not None and args.top_k < 1:
        raise GenerateError(f"--top-k {args.top_k} must be >= 1: the number of most likely tokens to sample from.")
    return dict(do_sample=args.sample, temperature=1.0 if args.temperature is None else args.temperature,
                top_p=1.0 if args.top_p is None else args.top_p, top_k=args.top_k, seed=args.seed)


def _cmd_generate(args: argparse.Namespace) -> int:
    from ..errors import GenerateError
    from ..inference.generate import _check_inputs
    from .timings import PhaseClock

    clock = PhaseClock()
    prompts = list(args.prompts)
    if args.batch_file:
        prompts += read_batch_file(args.batch_file)
    if not prompts:
        raise GenerateError("no prompt given: pass PROMPT... or --batch-file FILE (e.g. hwrun generate \"The king said\").")
    sampling = sampling_options(args)
    if args.torch_threads is not None and args.torch_threads < 1:
        raise GenerateError(f"--torch-threads {args.torch_threads} must be an integer >= 1 (leave it out to let hwrun "
                            "decide).")
    for index, prompt in enumerate(prompts, start=1):  # argv bytes that are not UTF-8 arrive as lone surrogates
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as error:
            raise GenerateError(f"prompt {index} is not UTF-8 text (character {error.start} is U+{ord(prompt[error.start]):04X}, "
                                "a byte of another encoding or half of a UTF-16 pair). Fix: pass UTF-8 text.") from None
    _check_inputs(prompts, args.max_new_tokens)  # after the argv check, whose message speaks of the command line
    run_plan = _plan_from(args, args.model)
    if run_plan.tp > 1:
        from ..inference.decision import planned
        from ..parallel.launch import rank_launch, run_ranks
        from ..parallel.ranks import launched_ranks

        planned(run_plan, len(prompts), decode=args.decode, batching=args.batching)  # refused before the ranks start

        if not launched_ranks(run_plan.tp):  # this process starts the ranks; each runs this command again
            return run_ranks(rank_launch(run_plan, args.argv), "hwrun generate")
    if run_plan.compile is not None and run_plan.accelerator.platform.has_graphs:  # graph decode compiles its step
        announce_compile_cache(run_plan)
    with torch_threads_set(run_plan, args.torch_threads):
        return _run_generate(args, run_plan, prompts, sampling, clock)


def _run_generate(args: argparse.Namespace, run_plan, prompts: list[str], sampling: dict, clock) -> int:
    """`hwrun generate` after the plan: load, generate (streamed, or in chunks with a progress bar), report.
    As one of `--tp N` ranks: every rank loads its shards and decodes the same way; rank 0 alone prints."""
    if run_plan.tp > 1:
        from ..parallel.generate import run_rank

        return run_rank(run_plan, lambda: _run_generate_here(args, run_plan, prompts, sampling, clock))
    return _run_generate_here(args, run_plan, prompts, sampling, clock)


def _run_generate_here(args: argparse.Namespace, run_plan, prompts: list[str], sampling: dict, clock) -> int:
    from ..inference.generate import GenerationResult, generate
    from ..model.load import load

    clock.mark("plan")
    model, tokenizer = load(run_plan, verify=args.verify)
    clock.mark("load")
    options = dict(**sampling, decode=args.decode, model=model, tokenizer=tokenizer)
    batching = args.batching
    leader = streams = True
    if run_plan.tp > 1:  # rank 0 prints; generate() agrees the arguments and seed and compares the ranks' tokens
        from ..inference.decision import planned
        from ..parallel.generate import rank_roles

        leader, streams = rank_roles(planned(run_plan, len(prompts), decode=args.decode, batching=batching),
                                     len(prompts))
    single = len(prompts) == 1
    stream = streams and single and not args.no_stream and not args.json  # graph decode streams too
    timing, first_token = "", None
    if stream:
        from .streaming import timed_text_streamer

        streamer = timed_text_streamer(tokenizer)
        print(prompts[0], end="", flush=True)
        result = generate(run_plan, prompts, args.max_new_tokens, batching=batching, streamer=streamer, **options)
        print()
        timing = f" ({streamer.summary(result.total_new_tokens)})"
        first_token = streamer.first_token_seconds()
    else:
        result = _generate_with_progress(run_plan, prompts, args, options, generate, GenerationResult, show=leader)
        if not leader:
            return 0
        if not args.json:
            for prompt, text in zip(prompts, result.texts, strict=True):
                print(f"{prompt}{text}")
                if not single:
                    print("---")
    clock.mark("generate")
    if args.json:
        print(json.dumps({"texts": result.texts, "token_ids": result.token_ids, "new_tokens": result.new_tokens,
                          "seconds": result.seconds, "tokens_per_second": result.tokens_per_second,
                          "batching": result.batching, "batching_reason": result.batching_reason,
                          "decode": result.decode, "decode_reason": result.decode_reason,
                          "warmup_seconds": result.warmup_seconds,
                          **({"timings": clock.as_dict()} if args.timings else {})}, indent=2))
    print(f"[{result.total_new_tokens} new tokens in {result.seconds:.2f}s: {result.tokens_per_second:.1f} tokens/s{timing}; "
          f"{_device_words(run_plan)} {run_plan.dtype} {run_plan.attention.implementation}; batching: {result.batching} "
          f"({result.batching_reason}); decode: {result.decode}]", file=sys.stderr)
    if args.timings:
        print(f"[{clock.summary(first_token, result.warmup_seconds)}]", file=sys.stderr)
    return 0


def _device_words(run_plan) -> str:
    """The summary line's device: the plan's, or `tp=N x kind` for tensor-parallel ranks."""
    return run_plan.device if run_plan.tp <= 1 else f"tp={run_plan.tp} x {run_plan.accelerator.kind}"


def _generate_with_progress(run_plan, prompts, args, options, generate, result_type, show=True):
    """Many prompts: continuous batching shows its own per-request bar; static batching runs in chunks under a bar."""
    from ..inference.decision import planned

    show = show and bool(args.batch_file) and not args.json
    if run_plan.tp > 1:  # one call: every rank the same steps, as the decision's tp rule says (no chunks)
        return generate(run_plan, prompts, args.max_new_tokens, batching=args.batching, progress=show, **options)
    batching = "static" if args.decode == "graphs" and args.batching == "auto" else args.batching
    # the one decision generate() takes (not a second batching rule): continuous runs in one call
    if planned(run_plan, len(prompts), decode=args.decode, batching=batching).batching == "continuous" \
            or len(prompts) <= STATIC_CHUNK:
        return generate(run_plan, prompts, args.max_new_tokens, batching=batching, progress=show, **options)
    from tqdm.auto import tqdm

    parts = []
    with tqdm(total=len(prompts), unit="prompt", desc="generating", disable=not show, file=sys.stderr) as bar:
        for start in range(0, len(prompts), STATIC_CHUNK):
            chunk = prompts[start:start + STATIC_CHUNK]
            parts.append(generate(run_plan, chunk, args.max_new_tokens, batching="static", **options))
            bar.update(len(chunk))
    return result_type(
        texts=[t for p in parts for t in p.texts], token_ids=[t for p in parts for t in p.token_ids],
        prompt_tokens=[t for p in parts for t in p.prompt_tokens], new_tokens=[t for p in parts for t in p.new_tokens],
        seconds=sum(p.seconds for p in parts), batching="static",
        batching_reason=f"{parts[0].batching_reason}; in chunks of {STATIC_CHUNK} prompts", decode=parts[0].decode,
        decode_reason=parts[0].decode_reason, compile_reason=parts[0].compile_reason,
        warmup_seconds=sum(p.warmup_seconds for p in parts),
    )


def _not_bitsandbytes_hub_kernel(record: logging.LogRecord) -> bool:
    """False for the kernels library's notes about bitsandbytes' own CPU Hub kernel (fetched at its import)."""
    return not (record.name.startswith("kernels") and "quantization-bitsandbytes" in record.getMessage())


def loads_model_here(args: argparse.Namespace) -> bool:
    """Whether the parsed command loads a model in this process (generate, train, serve, chat --local): only those
    import Transformers, so only those pay for it (`hwrun plan` and a remote `hwrun chat` read no model code)."""
    return args.command in ("generate", "train", "serve") or bool(getattr(args, "local", False))


def quiet_transformers() -> None:
    """Transformers' info/warning logs and its weight-loading progress bars off (they are about the library, not
    the user's command; `-v` keeps them). The Hub's download bars stay on: Transformers' switch turns them off too,
    and a first download can be several GB (HF_HUB_DISABLE_PROGRESS_BARS=1 still turns them off)."""
    try:
        import transformers
        from huggingface_hub.utils import enable_progress_bars
    except ImportError:  # pragma: no cover
        return
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").upper() not in ("1", "ON", "YES", "TRUE"):
        enable_progress_bars()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hwrun` command; errors print one line with the fix and exit 2."""
    from hwattn.errors import HwattnError
    from hwcompile.errors import HwcompileError
    from hwdist.errors import HwdistError
    from hwenv.cli_errors import run_command
    from hwenv.errors import HwenvError

    from ..errors import HwrunError
    from .quiet import library_noise_filtered

    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `--tp N` runs again in each rank
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # bitsandbytes (imported by peft when TrainingArguments is) warns about an optional CPU Hub kernel, and
        # kernels warns that it skipped that kernel's trust check offline: neither is about the user's command.
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_bitsandbytes_hub_kernel)
        if loads_model_here(args):
            quiet_transformers()
    expected = (HwrunError, HwenvError, HwattnError, HwcompileError, HwdistError)
    with library_noise_filtered(enabled=not args.verbose):
        return run_command("hwrun", lambda: int(args.func(args) or 0), expected, verbose=args.verbose)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
