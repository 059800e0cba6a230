"""relaykv.sim: the cluster simulator (docs/simulator.md).

relaykv's real `Scheduler`, `KVCacheManager`, P/D plan, decode-side loads and `PDConnector`
run unchanged under a virtual clock; only the model (`CostModelExecutor`), the wire
(`SimTransport` over `SimLink`) and HTTP (the router's policy called directly) are replaced.
Nothing imports this package; it imports kvcache, engine and transfer. `calibration/`
measures a machine for it (`relaykv sim calibrate`).
"""

from __future__ import annotations
