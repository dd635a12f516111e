"""`ServeConfig`: every `hwrun serve` setting, checked before the model loads (no torch, no starlette here)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field

from ..devices import torch_threads_for  # noqa: F401  (the rule is shared with `hwrun generate`: hwrun.devices)
from ..errors import ServeConfigError

#: Engines `hwrun serve --engine` accepts: `auto` picks (`hwrun.inference.decision.decide_serving`, the one place
#: that decides how hwrun decodes, asked at start-up through `hwrun.serve.startup.decide_engine`).
ENGINES = ("auto", "slots", "transformers")
#: Model id served when no MODEL is given (the shipped tiny model).
DEFAULT_MODEL_ID = "hwrun/tiny-llama"
#: Longest context the server serves by default when the model's is longer (`--max-model-len` raises it).
DEFAULT_MAX_MODEL_LEN = 4096
#: Largest request body, in bytes (a larger one is answered 413 before it is parsed).
MAX_BODY_BYTES = 4 * 2**20
#: Most requests decoded at once (`--max-concurrency`): the slot engine's step has a row per request (their K/V
#: share the blocks `--kv-cache-memory` sizes), and its row buckets go up to it; more than this is a typo, not a
#: server (vLLM's default is 256 sequences).
MAX_CONCURRENCY = 4096
#: Most requests waiting for a slot (`--max-queue`).
MAX_QUEUE = 65536
#: Most LoRA adapters one server takes (`--lora`).
MAX_ADAPTERS = 64
#: `--tool-parser` values: `auto` reads the format from the chat template (see `hwrun.serve.tools.choice`).
TOOL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")
_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ServeConfig:
    """Where and how `hwrun serve` listens and schedules. `api_key` is read from the variable named by
    `api_key_env` (never given on the command line); `None` means no key is asked for."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_concurrency: int = 32
    max_queue: int = 64
    grace_seconds: float = 30.0
    stall_seconds: float = 120.0  # a request without a token this long fails; /health is 503 past it
    engine: str = "auto"
    max_model_len: int | None = None
    model_id: str = DEFAULT_MODEL_ID
    torch_threads: int | None = None  # None: decided by `torch_threads_for` when the engine starts
    # the engine process died or stopped on an error: False (default) ends the server once the requests in flight
    # got their errors (a supervisor restarts it); True keeps it up, /health answering 503 "failed"
    keep_alive_on_engine_death: bool = False
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    # LoRA adapters served beside the base model (`--lora NAME=PATH`): (name, path) pairs; a request's `model`
    # naming one runs it (the engine process loads them from here)
    adapters: tuple[tuple[str, str], ...] = ()
    tool_parser: str = "auto"  # how tool calls are read from the model's text (`--tool-parser`; see serve.tools)
    # bytes (int) or a fraction of the device memory free after load (float) for the slot engine's KV blocks
    # (`--kv-cache-memory`); None: decided per device (hwrun.inference.engine.kv_memory.kv_budget)
    kv_cache_memory: int | float | None = None

    @property
    def loopback(self) -> bool:
        """Whether `host` only accepts connections from this machine."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def read_api_key(variable: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The API key held by environment variable `variable` (None when no variable is named).

    A named variable that is unset or empty is a `ServeConfigError`: a server started to require a key
    must not start open."""
    if variable is None:
        return None
    environ = os.environ if environ is None else environ
    if not _ENV_NAME.match(variable):
        # the value is left out of the message: it may be a key pasted by mistake
        raise ServeConfigError("the value given to --api-key-env is not an environment variable name (letters, "
                               "digits, _; not starting with a digit). Name the variable, not the key: "
                               "export HWRUN_API_KEY=... and pass --api-key-env HWRUN_API_KEY.")
    value = environ.get(variable)
    if not value:
        state = "unset" if value is None else "empty"
        raise ServeConfigError(f"--api-key-env {variable}: the variable is {state}, so no key could be read. "
                               f"Export it first (export {variable}=<key>) or leave out --api-key-env to serve "
                               "without a key.")
    return value


def check_config(config: ServeConfig) -> ServeConfig:
    """`config` when every field is valid, else a `ServeConfigError` naming the value, the rule and the fix."""
    checks = [
        (_is_int(config.port) and 0 <= config.port <= 65535,
         f"--port {config.port!r} is outside 0-65535; pass a TCP port such as 8000 (0: any free port, printed at start)."),
        (_is_int(config.max_concurrency) and 1 <= config.max_concurrency <= MAX_CONCURRENCY,
         f"--max-concurrency {config.max_concurrency!r} must be an integer >= 1 and <= {MAX_CONCURRENCY} (requests "
         "decoded at once; each holds a slot of the engine's cache, sized at start)."),
        (_is_int(config.max_queue) and 0 <= config.max_queue <= MAX_QUEUE,
         f"--max-queue {config.max_queue!r} must be an integer >= 0 and <= {MAX_QUEUE} (requests waiting for a slot; "
         "more get 429)."),
        (isinstance(config.grace_seconds, (int, float)) and not isinstance(config.grace_seconds, bool)
         and 0 <= config.grace_seconds <= 3600,
         f"--grace-seconds {config.grace_seconds!r} must be between 0 and 3600 (time to finish in-flight requests "
         "after SIGTERM)."),
        (isinstance(config.stall_seconds, (int, float)) and not isinstance(config.stall_seconds, bool)
         and 1 <= config.stall_seconds <= 86400,
         f"--stall-seconds {config.stall_seconds!r} must be between 1 and 86400 (a request that gets no token this "
         "long fails)."),
        (config.engine in ENGINES, f"--engine {config.engine!r} is not one of {', '.join(ENGINES)}."),
        (config.max_model_len is None or (_is_int(config.max_model_len) and config.max_model_len >= 2),
         f"--max-model-len {config.max_model_len!r} must be an integer >= 2 (prompt plus answer tokens)."),
        (bool(config.host) and not any(c.isspace() for c in config.host),
         f"--host {config.host!r} is not a host name or address; use 127.0.0.1 (this machine only) or 0.0.0.0."),
        (bool(config.model_id.strip()), "--served-model-name is empty; give the id clients send as `model`."),
        (config.torch_threads is None or (_is_int(config.torch_threads) and config.torch_threads >= 1),
         f"--torch-threads {config.torch_threads!r} must be an integer >= 1 (leave it out to let hwrun decide)."),
    ]
    for ok, message in checks:
        if not ok:
            raise ServeConfigError(message)
    if config.tool_parser not in TOOL_PARSERS:
        raise ServeConfigError(f"--tool-parser {config.tool_parser!r} is not one of {', '.join(TOOL_PARSERS)} (auto: "
                               "read the format from the model's chat template).")
    check_adapters(config.adapters, config.model_id)
    if (config.api_key_env is None) != (config.api_key is None):
        raise ServeConfigError("api_key and api_key_env go together: read the key with read_api_key(api_key_env).")
    return config


def parse_kv_cache_memory(text: str | None) -> int | float | None:
    """`--kv-cache-memory` as bytes (e.g. "4GiB", "512MiB", "8000000000") or a fraction of the device memory free
    after load ("0.8"); None when not given. A `ServeConfigError` naming the value otherwise."""
    from ..errors import FastDecodeError
    from ..inference.engine.kv_memory import parse_kv_memory

    try:
        return parse_kv_memory(text, "--kv-cache-memory")
    except FastDecodeError as exc:
        raise ServeConfigError(str(exc)) from None


def parse_lora(values: list[str] | tuple[str, ...] | None) -> tuple[tuple[str, str], ...]:
    """`--lora NAME=PATH` values as (name, path) pairs (checked by `check_adapters`)."""
    pairs = []
    for value in values or ():
        name, sep, path = str(value).partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ServeConfigError(f"--lora {value!r} must be NAME=PATH (the name clients send as `model`, the adapter "
                                   "folder), e.g. --lora bible=runs/bible-lora.")
        pairs.append((name.strip(), path.strip()))
    return tuple(pairs)


def check_adapters(adapters: tuple[tuple[str, str], ...], model_id: str) -> None:
    """Each `--lora` adapter: a name clients can send (unique, not the base model's id) and a folder holding a
    valid adapter_config.json; else a `ServeConfigError` naming it (before anything loads)."""
    from ..errors import AdapterFormatError
    from ..model.adapters import ADAPTER_CONFIG, check_adapter_config

    if len(adapters) > MAX_ADAPTERS:
        raise ServeConfigError(f"--lora is given {len(adapters)} times; at most {MAX_ADAPTERS} adapters per server.")
    seen: set[str] = set()
    for name, path in adapters:
        if not _ADAPTER_NAME.match(name):
            raise ServeConfigError(f"--lora {name}={path}: the name {name!r} must be 1-128 letters, digits, '.', '_', "
                                   "'-', '/' or ':' (clients send it as `model`).")
        if name == model_id:
            raise ServeConfigError(f"--lora {name}={path}: {name!r} is the base model's id (--served-model-name); "
                                   "give the adapter another name.")
        if name in seen:
            raise ServeConfigError(f"--lora {name}=...: the name {name!r} is given twice; names must be unique.")
        seen.add(name)
        folder = os.path.expanduser(path)
        if not os.path.isdir(folder):
            raise ServeConfigError(f"--lora {name}={path}: no such folder; pass the folder `hwrun train` wrote (it "
                                   f"holds {ADAPTER_CONFIG} and adapter_model.safetensors).")
        if not os.path.isfile(os.path.join(folder, ADAPTER_CONFIG)):
            raise ServeConfigError(f"--lora {name}={path}: the folder has no {ADAPTER_CONFIG}, so it is not a LoRA "
                                   "adapter; pass an adapter folder (the one `hwrun train` wrote).")
        try:
            check_adapter_config(folder)
        except AdapterFormatError as exc:
            raise ServeConfigError(f"--lora {name}={path}: {exc}") from None


def context_limit(max_model_len: int | None, model_context: int | None) -> tuple[int, str]:
    """(tokens a request may span, why): `--max-model-len` when given (never past the model's context), else the
    model's context capped at `DEFAULT_MAX_MODEL_LEN` (the static cache of the slot engine is that long)."""
    if max_model_len is not None:
        if model_context is not None and max_model_len > model_context:
            raise ServeConfigError(f"--max-model-len {max_model_len} exceeds the model's context of {model_context} "
                                   f"tokens (max_position_embeddings); past it the model's answers are wrong. "
                                   f"Pass at most {model_context}.")
        return max_model_len, "given (--max-model-len)"
    if model_context is None:
        return DEFAULT_MAX_MODEL_LEN, (f"the model's config gives no context length; {DEFAULT_MAX_MODEL_LEN} assumed "
                                       "(set --max-model-len)")
    if model_context > DEFAULT_MAX_MODEL_LEN:
        return DEFAULT_MAX_MODEL_LEN, (f"the model's context ({model_context}) capped at {DEFAULT_MAX_MODEL_LEN}: "
                                       "a request may span this many tokens (raise it with --max-model-len)")
    return model_context, "the model's context (max_position_embeddings)"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
