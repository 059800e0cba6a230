"""relaykv.serve: the OpenAI-compatible HTTP server over one engine (docs/serving.md).

* `engine_factory`: `EngineOptions` -> `ServedEngine` (engine, tokenizer, chat formatter,
  startup summary); `build_engine` loads the model, `assemble_engine` takes any executor;
* `app.create_app(served, api_key=...)`: the FastAPI app; `server.serve_app`: uvicorn with
  a draining SIGTERM; `cli`: `relaykv serve`.
"""

from __future__ import annotations

from relaykv.serve.engine_factory import (
    ModelInfo,
    ServedEngine,
    assemble_engine,
    build_engine,
)
from relaykv.serve.options import EngineOptions, OptionError

__all__ = [
    "EngineOptions",
    "ModelInfo",
    "OptionError",
    "ServedEngine",
    "assemble_engine",
    "build_engine",
]
