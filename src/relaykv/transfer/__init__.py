"""P/D KV transfer: the connector (which blocks move) and the transports (how they move).

See `relaykv.transfer.transport` for the transports and their contract.
"""

from __future__ import annotations
