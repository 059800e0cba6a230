"""Two engines in one process, joined by a real transport: the P/D flow without a model."""

from __future__ import annotations

import itertools
import time

from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.kvcache import Geometry, assert_consistent
from relaykv.transfer.connector import PDConnector
from relaykv.transfer.transport import TransportOptions, get_transport

from ..engine.reference_executor import ReferenceExecutor

_ids = itertools.count()


def engine(geo: Geometry, role: str, policy: str, blocks: int, k: int = 0, **sched) -> LLMEngine:
    config = EngineConfig(
        num_blocks=blocks,
        role=role,
        pd_policy=policy,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=sched.get("budget", 256),
            max_num_seqs=sched.get("max_num_seqs", 64),
            max_model_len=sched.get("max_model_len", 2048),
            kv_load_failure=sched.get("kv_load_failure", "recompute"),
        ),
    )
    return LLMEngine(ReferenceExecutor(geo, blocks, k=k), config, vocab_size=101)


class PDPair:
    def __init__(
        self,
        geo: Geometry,
        policy: str,
        transport: str = "tcp",
        blocks: int = 600,
        k: int = 0,
        d_blocks: int | None = None,
        lease_seconds: float = 30.0,
        timeout_s: float = 10.0,
        idle_timeout_s: float = 5.0,
        **sched,
    ) -> None:
        n = next(_ids)
        self.finished: dict = {}
        self.p = engine(geo, "prefill", policy, blocks, k, **sched)
        self.d = engine(geo, "decode", policy, blocks if d_blocks is None else d_blocks, k, **sched)
        t = get_transport(transport)
        self.p.attach_connector(
            PDConnector(
                "prefill",
                self.p.manager,
                t,
                self.p.executor.buffer,
                engine_id=f"P{n}",
                lease_seconds=lease_seconds,
            )
        )
        self.d.attach_connector(
            PDConnector(
                "decode",
                self.d.manager,
                t,
                self.d.executor.buffer,
                engine_id=f"D{n}",
                options=TransportOptions(
                    timeout_s=timeout_s,
                    connect_timeout_s=min(timeout_s, 5),
                    idle_timeout_s=idle_timeout_s,
                ),
                quarantine_seconds=0.2,
            )
        )

    def prefill(self, rid: str, prompt: list[int], destination: str | None = None) -> dict:
        """P's transfer parameters for `prompt` (a grant bound to `destination`, if given)."""
        grant: dict = {"do_remote_decode": True}
        if destination is not None:
            grant["destination_engine_id"] = destination
        self.p.add_request(
            rid, prompt, SamplingParams(max_tokens=8, temperature=0), kv_transfer_params=grant
        )
        params = None
        while self.p.has_unfinished():
            for out in self.p.step():
                if out.finished:
                    params = out.kv_transfer_params
        assert params is not None and params["do_remote_prefill"]
        return params

    def decode(self, rid: str, prompt: list[int], params: dict, max_tokens: int) -> None:
        self.d.add_request(
            rid,
            prompt,
            SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            kv_transfer_params=params,
        )

    def step(self, outs: dict[str, list]) -> bool:
        """One step of each engine that has work, with every invariant checked after it;
        D's new tokens go to `outs`. Returns whether either engine had work."""
        busy = False
        if self.d.has_unfinished():
            for o in self.d.step():
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finished:
                    self.finished[o.request_id] = o
            busy = True
        self.p.scheduler.settle_transfers()
        if self.p.has_unfinished():
            self.p.step()
            busy = True
        for eng in (self.p, self.d):
            assert_consistent(eng.manager)
            assert eng.scheduler.check() == []
            assert eng.connector.check() == []
        return busy

    def run(self, timeout_s: float = 30.0, outs: dict[str, list] | None = None) -> dict[str, list]:
        """Step both engines until D is done and P has released every lease; returns D's
        outputs per request (token ids, then the final output)."""
        outs = {} if outs is None else outs
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = self.step(outs)
            if not busy and not self.p.connector._held:
                return outs
            time.sleep(0.0005)
        raise AssertionError("P/D pair did not settle")

    def close(self) -> None:
        self.p.connector.shutdown()
        self.d.connector.shutdown()
