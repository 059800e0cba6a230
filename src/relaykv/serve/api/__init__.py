"""The OpenAI-compatible HTTP API over one engine (docs/serving.md).

The FastAPI app and its access gate (`app`), the routes (`completions`, `chat`, vLLM's
tokenize/render in `vllm_compat`, what routers poll in `router_probes`, `metrics`,
`kv_cache_info`), request bodies (`protocol`, `inputs`), one engine request under a handler
(`engine_stream`, `generation`) and uvicorn with a draining SIGTERM (`server`).
"""
