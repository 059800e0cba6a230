"""relaykv.router: the request router in front of prefill and decode engines.

A request goes top to bottom through `relay.py` (`Router.handle`): its body (`intake.py`),
its prompt tokens (`prompt.py`), the engine choice (`routing.py`: the one `pick`, scored by
`scoring.py` with the policies of `policy.py`, returned as a `decision.py` `Choice`), the calls
to the engines (`engine_calls.py`, `destinations.py`). Between requests the router follows each
engine's health (`backends.py`), load and KV events (`engines.py`, `kv_subscriber.py`,
`index.py`, `holders.py`) and the prefixes it has in flight (`pending.py`). `app.py` is the HTTP
surface, `server.py` the drain, `cli.py` the command. It imports kvcache only
(docs/architecture.md).
"""
