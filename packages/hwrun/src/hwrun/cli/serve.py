"""`hwrun serve`: an OpenAI-compatible HTTP server for MODEL, with every plan decision applied.

Every option is checked before the model loads (a bad one is one line on stderr, exit 2). Importing
this module imports neither torch, starlette nor uvicorn.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..serve.config import (
    DEFAULT_MODEL_ID,
    ENGINES,
    TOOL_PARSERS,
    ServeConfig,
    check_config,
    context_limit,
    parse_kv_cache_memory,
    parse_lora,
    read_api_key,
)
from .main import TORCH_THREADS_HELP, _add_plan_options, _plan_from


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `serve` subcommand on `hwrun`'s subparsers (called by hwrun.cli)."""
    p = subparsers.add_parser(
        "serve", help="serve MODEL over an OpenAI-compatible HTTP API (continuous batching, SSE streaming)",
        description="Load MODEL once with hwrun's plan, warm the engine, and serve POST /v1/completions, "
                    "POST /v1/chat/completions, POST /v1/responses, GET /v1/models, GET /health and GET /metrics "
                    "(tools, structured output, n, logprobs: hwrun's README, Serve). Binds 127.0.0.1 "
                    "unless --host says otherwise. SIGTERM or Ctrl-C finishes in-flight requests (up to "
                    "--grace-seconds) and exits 0.")
    p.add_argument("model", nargs="?", default=None, help="local folder or Hub id (default: the shipped tiny model)")
    _add_plan_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", default="8000", help="TCP port (default 8000; 0: any free port, printed at start)")
    p.add_argument("--max-concurrency", default="32", metavar="N",
                   help="requests decoded at once (slots; default 32)")
    p.add_argument("--max-queue", default=None, metavar="N",
                   help="requests waiting for a slot before 429 (default: 2 x --max-concurrency)")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="require `Authorization: Bearer <key>`, the key read from environment variable VAR")
    p.add_argument("--grace-seconds", default="30", metavar="S",
                   help="after SIGTERM, time to finish in-flight requests before they are cancelled (default 30)")
    p.add_argument("--stall-seconds", default="120", metavar="S",
                   help="a request that gets no token for S seconds fails (500), and /health answers 503 while "
                        "the engine's steps have stopped this long (default 120)")
    p.add_argument("--engine", default="auto", choices=ENGINES,
                   help="auto (hwrun's slot decoder with CUDA/XPU graphs, else Transformers' continuous batching), "
                        "slots or transformers")
    p.add_argument("--max-model-len", default=None, metavar="N",
                   help="tokens a request may span, prompt and answer (default: the model's context, at most 4096)")
    p.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                   help="memory for the slot engine's KV blocks: bytes (4GiB, 512MiB) or a fraction of the device "
                        "memory free after the model loads (0.8); default: 0.8 of it on a GPU, 2 GiB on a CPU, "
                        "never more than --max-concurrency requests of the max length hold (said at start-up)")
    p.add_argument("--torch-threads", default=None, metavar="N", help=TORCH_THREADS_HELP)
    p.add_argument("--keep-alive-on-engine-death", action="store_true",
                   help="when the engine process dies, keep serving 503s (/health 'failed') instead of exiting "
                        "(for a supervisor that restarts on a failed health probe)")
    p.add_argument("--served-model-name", default=None, metavar="ID",
                   help="the model id clients send (default: MODEL as given, or hwrun/tiny-llama)")
    p.add_argument("--lora", action="append", default=None, metavar="NAME=PATH",
                   help="serve the LoRA adapter in folder PATH as model NAME beside the base model (repeatable; a "
                        "request's `model` picks the base or an adapter; GET /v1/models lists them)")
    p.add_argument("--tool-parser", default="auto", choices=TOOL_PARSERS,
                   help="how tool calls are read from the model's text: auto (from the chat template: <tool_call> "
                        "-> hermes, [TOOL_CALLS] -> mistral, <|python_tag|> -> llama3_json), or one of them")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="split the model across N processes, one per device (Transformers' tensor-parallel plan; "
                        "hwrun starts them through torchrun): rank 0 serves HTTP and schedules, every rank steps in "
                        "lockstep")
    p.set_defaults(func=run_serve)
    return p


def config_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ServeConfig:
    """The checked `ServeConfig` of parsed `args` (`ServeConfigError` for any bad value)."""
    concurrency = _integer(args.max_concurrency, "--max-concurrency")
    queue = _integer(args.max_queue, "--max-queue") if args.max_queue is not None else (
        2 * concurrency if isinstance(concurrency, int) else 0)
    config = ServeConfig(
        host=args.host, port=_integer(args.port, "--port"), max_concurrency=concurrency, max_queue=queue,
        grace_seconds=_number(args.grace_seconds, "--grace-seconds"), engine=args.engine,
        stall_seconds=_number(args.stall_seconds, "--stall-seconds"),
        max_model_len=_integer(args.max_model_len, "--max-model-len") if args.max_model_len is not None else None,
        model_id=args.served_model_name or args.model or DEFAULT_MODEL_ID,
        torch_threads=_integer(args.torch_threads, "--torch-threads") if args.torch_threads is not None else None,
        keep_alive_on_engine_death=bool(getattr(args, "keep_alive_on_engine_death", False)),
        adapters=parse_lora(getattr(args, "lora", None)),
        tool_parser=getattr(args, "tool_parser", "auto"),
        kv_cache_memory=parse_kv_cache_memory(getattr(args, "kv_cache_memory", None)),
    )
    check_config(config)
    key = read_api_key(args.api_key_env, environ)
    return ServeConfig(**{**config.__dict__, "api_key_env": args.api_key_env, "api_key": key})


def run_serve(args: argparse.Namespace) -> int:
    """Carry out `hwrun serve` for parsed `args`; returns the exit status."""
    from ..errors import ServeConfigError
    from ..model.source import model_config, resolve_source

    config = config_from(args)
    run_plan = _plan_from(args, args.model)  # checks the model source, device, dtype, ... (nothing loads)
    declared = (model_config(resolve_source(run_plan.model)) or {}).get("max_position_embeddings")
    context_limit(config.max_model_len, declared if isinstance(declared, int) else None)
    try:
        import msgspec  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as exc:
        raise ServeConfigError(f"hwrun serve needs Starlette, uvicorn, pyzmq and msgspec ({exc.name} is missing): "
                               "pip install 'hwrun[serve]'.") from None
    if run_plan.tp > 1:  # --tp N: this process starts the ranks; rank 0 serves below, the others follow it
        from ..serve.startup import serve_rank

        follower = serve_rank(run_plan, config, args.argv)
        if follower is not None:
            return follower
    from ..serve.server import serve

    return serve(config, run_plan)


def _integer(text: Any, option: str) -> int:
    from ..errors import ServeConfigError

    try:
        return int(str(text), 10)
    except ValueError:
        raise ServeConfigError(f"{option} {text!r} is not an integer; pass a whole number.") from None


def _number(text: Any, option: str) -> float:
    from ..errors import ServeConfigError

    try:
        return float(str(text))
    except ValueError:
        raise ServeConfigError(f"{option} {text!r} is not a number; pass seconds, e.g. 30.") from None
