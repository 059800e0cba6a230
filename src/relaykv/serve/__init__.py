"""relaykv.serve: `relaykv serve`, one engine behind an OpenAI-compatible HTTP server
(docs/serving.md). Three rooms and the command (`cli`):

* `assembly/`: flags -> a ready engine. `EngineOptions` -> `ServedEngine` (engine, tokenizer,
  chat formatter, startup summary); `build_engine` loads the model, `assemble_engine` takes
  any executor; P/D wiring and CPU threads;
* `api/`: the HTTP API. `app.create_app(served, api_key=...)`: the FastAPI app and its
  routes; `server.serve_app`: uvicorn with a draining SIGTERM;
* `sglang/`: SGLang's bootstrap P/D mode (a room handshake) or its refusal.
"""

from __future__ import annotations

from relaykv.serve.assembly.engine_factory import (
    ModelInfo,
    ServedEngine,
    assemble_engine,
    build_engine,
)
from relaykv.serve.assembly.options import EngineOptions, OptionError

__all__ = [
    "EngineOptions",
    "ModelInfo",
    "OptionError",
    "ServedEngine",
    "assemble_engine",
    "build_engine",
]
