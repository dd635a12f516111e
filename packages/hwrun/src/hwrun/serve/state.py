"""`ServeState`: what one server holds (settings, plan, engine, metrics) and the model card it shows."""

from __future__ import annotations

import logging
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .engine import Backend, Engine, EngineChoice, EngineNotReady
from .metrics import Metrics

if TYPE_CHECKING:
    from ..model.plan import RunPlan
    from .config import ServeConfig
    from .ipc import Ready
    from .startup import Loaded

logger = logging.getLogger(__name__)


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
        # one thread: fast tokenizers are not safe to share across threads, and encoding stays off the event loop
        self.encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwrun-serve-tokenize")
        self.metrics = Metrics(queue_depth=lambda: self.engine.queue_depth, running=lambda: self.engine.running,
                               steps=lambda: self.engine.steps)

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
                warm_seconds=info["warm_seconds"], threads=info["threads"], threads_reason=info["threads_reason"])
        loaded = self.loaded
        make, detok_why = detokenizer_factory(loaded.tokenizer)
        self.engine.detokenizer = make
        self.metrics.info = {"engine": loaded.choice.name, "device": self.plan.device, "dtype": self.plan.dtype,
                             "model": self.config.model_id}
        self.say(f"engine: {loaded.choice.name} ({loaded.choice.reason})")
        self.say(f"context: {loaded.max_model_len} tokens ({loaded.max_model_len_reason}); torch threads: "
                 f"{loaded.threads if loaded.threads is not None else 'unchanged'} ({loaded.threads_reason}); "
                 f"loaded in {loaded.load_seconds:.1f} s, warmed in {loaded.warm_seconds:.1f} s")
        where = (f"its own process (pid {self.engine.core_pid})" if self.engine.mode == "process" else
                 "a thread of the server's process (a backend given in Python)")
        self.say(f"engine core: {where}; requests and token batches over ZeroMQ (msgspec); detokenized in the "
                 f"server's reader thread with {detok_why}")

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
                "max_model_len": meta["max_model_len"], "hwrun": meta}
