"""The engine process's entry point: `run_process(addresses, plan, config, log_level, parent)`, run by the
bootstrap code `hwrun.serve.engine.Engine` starts with `python -c`. It ignores SIGINT (Ctrl-C reaches the whole
process group; the front drains and then stops the core), exits if its parent dies (no orphan holds the device),
loads the model and warms the backend (`hwrun.serve.startup.load_backend`), sends `Ready` with the pickled
tokenizer, and runs the core's loop (`hwrun.serve.core.serve_core`). Kept apart from the core so that the front,
which imports the core, never reaches start-up (which imports the backends)."""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from typing import TYPE_CHECKING, Any

from .core import CLOSE_LINGER, serve_core
from .ipc import Channel

if TYPE_CHECKING:
    from ..model.plan import RunPlan
    from .backend import Backend
    from .config import ServeConfig

logger = logging.getLogger(__name__)

#: Seconds between two checks, in the child, that its parent (the server) still lives.
PARENT_CHECK = 0.5


def run_process(addresses: tuple[str, str], plan: RunPlan, config: ServeConfig, log_level: int,
                parent: int) -> None:
    """The engine process's entry point (spawned by `hwrun.serve.engine.Engine`)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the front drains first, then sends Shutdown
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    if log_level > logging.INFO:
        _quiet_transformers()
    threading.Thread(target=_exit_with_parent, args=(parent,), name="hwrun-serve-parent-watch",
                     daemon=True).start()
    channel = Channel.connect(addresses)
    try:
        serve_core(lambda: _load(plan, config), channel, config.stall_seconds)
    finally:
        channel.close(linger=CLOSE_LINGER)


def _load(plan: RunPlan, config: ServeConfig) -> tuple[Backend, dict[str, Any], bytes]:
    from .startup import load_backend

    loaded = load_backend(plan, config)
    info = {"engine": loaded.choice.name, "engine_reason": loaded.choice.reason,
            "max_model_len": loaded.max_model_len, "max_model_len_reason": loaded.max_model_len_reason,
            "eos_ids": list(loaded.eos_ids), "load_seconds": loaded.load_seconds,
            "warm_seconds": loaded.warm_seconds, "threads": loaded.threads, "threads_reason": loaded.threads_reason,
            "refuses": dict(getattr(loaded.backend, "refuses", {})), "kv": loaded.kv}
    return loaded.backend, info, pickle.dumps(loaded.tokenizer)


def _exit_with_parent(parent: int) -> None:
    """Ends this process when the server that started it is gone (killed with SIGKILL: no Shutdown came)."""
    while True:
        time.sleep(PARENT_CHECK)
        if os.getppid() != parent:
            logger.error("the server process %d is gone: the engine process exits", parent)
            os._exit(1)


def _quiet_transformers() -> None:
    try:
        import transformers
    except ImportError:  # pragma: no cover
        return
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
