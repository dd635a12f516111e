"""`ServeState`: what one server holds (settings, plan, engine, metrics, the requests in flight), what it learns
from the load (tokenizer, tool-call format, sampling defaults of the model's generation config) and the model
cards it shows (the base model and each `--lora` adapter)."""

from __future__ import annotations

import json
import logging
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from .engine import Backend, Engine, EngineChoice, EngineNotReady
from .metrics import Metrics
from .protocol import GENERATION_DEFAULTS, ServedModels

if TYPE_CHECKING:
    from ..model.plan import RunPlan
    from .config import ServeConfig
    from .ipc import Ready
    from .startup import Loaded
    from .tools.choice import ToolSupport

logger = logging.getLogger(__name__)


class InFlight(Protocol):
    """A request in flight as the state sees it (`hwrun.serve.request.Run`, which imports this module)."""

    def end_now(self, why: str) -> None:
        """End the request at once (a shutdown's grace period ran out)."""


def _say(line: str) -> None:
    print(f"hwrun serve: {line}", file=sys.stderr, flush=True)


class ServeState:
    """One server's state. The engine core runs in its own process, which loads the model
    (`hwrun.serve.startup.load_backend`: load, choose the engine, warm) and sends the tokenizer back; with a
    `loader(plan, config) -> Loaded` (tests: any backend) it runs in a thread of this process instead, the loader
    called there. `say` prints the start-up lines."""

    def __init__(self, config: ServeConfig, plan: RunPlan, *,
                 loader: Callable[[RunPlan, ServeConfig], Loaded] | None = None,
                 say: Callable[[str], None] = _say) -> None:
        self.config = config
        self.plan = plan
        self.loader = loader
        self.say = say
        self.loaded: Loaded | None = None
        self.port: int | None = None  # the bound port, once listening
        self.created = int(time.time())
        limits = {"max_concurrency": config.max_concurrency, "max_queue": config.max_queue,
                  "stall_seconds": config.stall_seconds}
        if loader is None:
            self.engine = Engine(process=(plan, config), **limits)
        else:
            self.engine = Engine(self._build, **limits)
        self.engine.on_loaded = self._on_loaded
        self.engine.on_progress = lambda line: self.say(line)  # the engine's start, bucket by bucket (before it is ready)
        # one thread: fast tokenizers are not safe to share across threads, and encoding stays off the event loop
        self.encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwrun-serve-tokenize")
        self.metrics = Metrics(queue_depth=lambda: self.engine.queue_depth, running=lambda: self.engine.running,
                               steps=lambda: self.engine.steps, kv_stats=lambda: self.engine.kv_stats)
        self.loop: Any = None  # the server's event loop (set when the app starts)
        self.cut_scheduled = False  # the end of the grace period is scheduled (a shutdown began)
        self.runs: set[InFlight] = set()  # requests in flight (ended at once when the grace period of a shutdown ends)
        self.tool_support: ToolSupport | None = None  # set once the tokenizer is known
        self.drop_ids: frozenset[int] | None = None  # special tokens dropped from text (None: all special ones)
        self.token_texts: Any = None  # `text.TokenTexts` of the tokenizer (logprobs)
        self.defaults: dict[str, float] = {}  # sampling defaults from generation_config.json
        self.refuses: dict[str, str] = {}  # request fields the engine's backend cannot apply, and why
        self.served = ServedModels(config.model_id, tuple(name for name, _ in config.adapters))

    def _build(self) -> Backend:
        """The in-process core's backend (runs in the core's thread)."""
        assert self.loader is not None
        loaded = self.loader(self.plan, self.config)
        self.loaded = loaded
        return loaded.backend

    def _on_loaded(self, ready: Ready) -> None:
        """The core is loaded and warm (runs on the server's reader thread, before requests are taken): keep the
        load's facts and the tokenizer, pick the detokenizer, say the start-up lines."""
        from .startup import Loaded
        from .text import detokenizer_factory

        if self.loaded is None:  # the engine process: its facts and its tokenizer came in `ready`
            info = ready.info
            self.loaded = Loaded(
                tokenizer=pickle.loads(ready.tokenizer), choice=EngineChoice(info["engine"], info["engine_reason"]),
                max_model_len=info["max_model_len"], max_model_len_reason=info["max_model_len_reason"],
                eos_ids=tuple(info["eos_ids"]), backend=None, load_seconds=info["load_seconds"],  # type: ignore[arg-type]
                warm_seconds=info["warm_seconds"], threads=info["threads"], threads_reason=info["threads_reason"],
                kv=info.get("kv"))
        loaded = self.loaded
        from .text import TokenTexts, special_ids
        from .tools.choice import choose_tool_support

        self.refuses = dict(ready.info.get("refuses") or getattr(loaded.backend, "refuses", None) or {})
        if self.config.adapters and "adapter" in self.refuses:
            from ..errors import ServeConfigError

            raise ServeConfigError(f"--lora: the {loaded.choice.name} engine cannot run per-request adapters "
                                   f"({self.refuses['adapter']}); serve without --lora, or merge the adapter into "
                                   "its own model and serve that.")
        support = self.tool_support = choose_tool_support(loaded.tokenizer, self.config.tool_parser)
        make, detok_why = detokenizer_factory(loaded.tokenizer, keep_ids=support.keep_token_ids)
        if support.keep_token_ids:
            self.drop_ids = special_ids(loaded.tokenizer) - set(support.keep_token_ids)
        self.token_texts = TokenTexts(loaded.tokenizer)
        self.defaults, defaults_why = generation_defaults(self.plan)
        self.served = ServedModels(self.config.model_id, self.served.adapters, self.defaults,
                                   len(loaded.tokenizer) if loaded.tokenizer is not None else None)
        self.engine.detokenizer = make
        self.metrics.info = {"engine": loaded.choice.name, "device": self.plan.device, "dtype": self.plan.dtype,
                             "model": self.config.model_id}
        self.say(f"engine: {loaded.choice.name} ({loaded.choice.reason})")
        self.metrics.kv = loaded.kv
        if loaded.kv:
            from ..inference.engine.kv_memory import KVReport

            kv = loaded.kv
            self.say(KVReport(kv["blocks"], kv["block_size"], kv["bytes_per_token"], kv["max_cache_len"],
                              kv["reason"]).line())
        self.say(f"context: {loaded.max_model_len} tokens ({loaded.max_model_len_reason}); torch threads: "
                 f"{loaded.threads if loaded.threads is not None else 'unchanged'} ({loaded.threads_reason}); "
                 f"loaded in {loaded.load_seconds:.1f} s, warmed in {loaded.warm_seconds:.1f} s")
        where = (f"its own process (pid {self.engine.core_pid})" if self.engine.mode == "process" else
                 "a thread of the server's process (a backend given in Python)")
        self.say(f"engine core: {where}; requests and token batches over ZeroMQ (msgspec); detokenized in the "
                 f"server's reader thread with {detok_why}")
        if support.parser is not None:
            kept = f"; special tokens kept in the text for it: {len(support.keep_token_ids)}" if (
                support.keep_token_ids) else ""
            self.say(f"tools: tool calls read as {support.why}{kept}")
        else:
            self.say(f"tools: requests with `tools` are refused (400): {support.why}")
        self.say(f"sampling defaults: {defaults_why}")
        for name, path in self.config.adapters:
            self.say(f"adapter: {name} (LoRA from {path}; requests with model={name!r} run it)")

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (set once the engine is ready; `EngineNotReady` before)."""
        return self._loaded().tokenizer

    @property
    def max_model_len(self) -> int:
        """Tokens one request may span, prompt and answer (`EngineNotReady` before the model is loaded)."""
        return self._loaded().max_model_len

    def _loaded(self) -> Loaded:
        if self.loaded is None:
            raise EngineNotReady(f"the model is not loaded yet (engine {self.engine.state}); wait for GET /health 200")
        return self.loaded

    @property
    def engine_name(self) -> str | None:
        """The engine's name once chosen ("slots" | "transformers"), else None."""
        return self.loaded.choice.name if self.loaded is not None else None

    def model_card(self) -> dict[str, Any]:
        """`/v1/models`' entry: OpenAI's fields plus `hwrun` (engine and why, device, dtype, context, limits, plan)."""
        loaded = self.loaded
        plan = self.plan
        meta: dict[str, Any] = {
            "state": self.engine.state,
            "engine": loaded.choice.name if loaded else None,
            "engine_reason": loaded.choice.reason if loaded else "the model is loading",
            "model": plan.model, "device": plan.device, "dtype": plan.dtype,
            "attention": plan.attention.implementation,
            "compile": None if plan.compile is None else str(plan.compile.backend),
            "max_model_len": loaded.max_model_len if loaded else None,
            "max_model_len_reason": loaded.max_model_len_reason if loaded else None,
            "max_concurrency": self.config.max_concurrency, "max_queue": self.config.max_queue,
            "torch_threads": loaded.threads if loaded else None,
            "torch_threads_reason": loaded.threads_reason if loaded else None,
            "engine_core": self.engine.mode, "engine_pid": self.engine.core_pid,
            "reasons": dict(plan.reasons),
        }
        return {"id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "hwrun",
                "root": plan.model, "parent": None, "max_model_len": meta["max_model_len"], "hwrun": meta}

    def adapter_cards(self) -> list[dict[str, Any]]:
        """`/v1/models`' entries of the `--lora` adapters: each a model whose `parent` is the base model (vLLM's
        shape), `root` its folder."""
        max_len = self.loaded.max_model_len if self.loaded else None
        return [{"id": name, "object": "model", "created": self.created, "owned_by": "hwrun", "root": path,
                 "parent": self.config.model_id, "max_model_len": max_len,
                 "hwrun": {"adapter": path, "base": self.config.model_id}} for name, path in self.config.adapters]

    def card(self, model_id: str) -> dict[str, Any] | None:
        """The card of `model_id` (the base model or an adapter), None when it is not served here."""
        if model_id == self.config.model_id:
            return self.model_card()
        return next((c for c in self.adapter_cards() if c["id"] == model_id), None)

    def end_runs(self, why: str) -> int:
        """End every request in flight now (`Run.end_now`); how many there were. Call on the event loop."""
        runs = list(self.runs)
        for run in runs:
            run.end_now(why)
        return len(runs)


def generation_defaults(plan: RunPlan) -> tuple[dict[str, float], str]:
    """(sampling defaults, what the start-up log says): the fields of `GENERATION_DEFAULTS` the model's
    generation_config.json sets, used where a request leaves them out (vLLM's `--generation-config auto`)."""
    path = _generation_config_path(plan.model)
    if path is None:
        return {}, "OpenAI's (the model has no generation_config.json)"
    try:
        config = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as exc:
        logger.warning("generation_config.json of %s is unreadable (%s): OpenAI's sampling defaults", plan.model, exc)
        return {}, f"OpenAI's (generation_config.json is unreadable: {exc})"
    found = {k: config[k] for k in GENERATION_DEFAULTS
             if isinstance(config, dict) and isinstance(config.get(k), (int, float))
             and not isinstance(config.get(k), bool)}
    if not found:
        return {}, ("OpenAI's (generation_config.json sets none of " + ", ".join(GENERATION_DEFAULTS) + ")")
    listed = ", ".join(f"{k}={v}" for k, v in found.items())
    return found, (f"{listed} from the model's generation_config.json, where a request leaves them out (vLLM's "
                   "--generation-config auto)")


def _generation_config_path(model: str) -> str | None:
    import os

    from ..model.source import resolve_source

    try:
        source = resolve_source(model)
    except Exception:  # noqa: BLE001 - the model loaded: its reference resolves; anything else means unknown
        return None
    if source.path is not None:
        path = os.path.join(source.path, "generation_config.json")
        return path if os.path.isfile(path) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "generation_config.json")
    except Exception:  # noqa: BLE001 - a cache miss of any kind
        return None
    return found if isinstance(found, str) and os.path.isfile(found) else None
