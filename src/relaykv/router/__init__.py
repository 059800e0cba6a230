"""relaykv.router: the request router in front of prefill and decode engines.

It imports kvcache only (docs/architecture.md).
"""
