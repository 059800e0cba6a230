"""Records that cross a layer or process boundary, written once: the step records between
a scheduler and an executor (`steps`), the OpenAI-style error body (`api_errors`), the
KV-event wire schema an engine publishes and a router reads (`kv_events`), the cache
geometry of `/v1/kv_cache_info` (`geometry_json`) and the server-sent-event frames of a
stream, written by the engine and the router and read by the benchmark client (`sse`)."""
