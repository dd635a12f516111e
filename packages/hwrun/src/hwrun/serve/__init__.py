"""`hwrun serve`: an OpenAI-compatible HTTP server over hwrun's plan, with continuous batching of live requests.

Rooms inside: `config` (settings, checked before the model loads), `protocol` (OpenAI bodies in and out),
`text` (streamed detokenization, stop strings), `engine` (the front's handle on the engine core, the backend
interface), `core` (the scheduling loop, in its own process), `ipc` (the messages and sockets between them),
`backend_slots` / `backend_transformers` (the two decoders), `startup` (load, choose, warm), `metrics`,
`state`, `app` (Starlette routes), `server` (uvicorn, SIGTERM drain), `client` (what `hwrun chat` speaks).
Importing this package imports neither torch, starlette nor uvicorn.
"""

from .config import ServeConfig, check_config, read_api_key

__all__ = ["ServeConfig", "check_config", "read_api_key"]
