"""vLLM PR #56449's fixed-engine probe, through vLLM 0.33's scheduler (docs/vllm.md).

Two prompts x+a and x+b share a long prefix x (65,536 tokens by default; a and b are 64
tokens each, drawn from one seeded generator like `relaykv probe`), each sent with
`max_tokens=1` through a prefill engine P and a decode engine D, in three phases:
`first_load` (x+a), `serial` (x+a, then x+b after it finished) and `overlap` (x+a and x+b
at once). P and D are vLLM schedulers with the plugin (`pd_policy`; `legacy` = stock vLLM)
and the stand-in worker of `relaykv.vllm.probe`. Per phase and request it reports what D's
vLLM counters and relaykv's load say: local tokens, external tokens, blocks received per
group. The report's failure signature: D local 0 in `serial` and `overlap` (stock vLLM on
hybrid models with an EAGLE draft); the fix: x+b after x+a reuses all of x but the last
block or two.

    python -m relaykv.vllm.fixed_engine --model gpt-oss-20b --pd-policy per-group
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from typing import Any

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.pd_config import PD_POLICIES, PDPolicy
from relaykv.sim.model_presets import model_spec
from relaykv.vllm.probe import EngineSpec, StandInWorker, _request, build_scheduler, model_dirs

MODELS = ("gpt-oss-20b", "dsv4-flash")  # the seed's two models (relaykv.sim.model_presets)
PHASES = ("first_load", "serial", "overlap")


def model_geometry(name: str) -> Geometry:
    """The KV geometry of a seed model with its EAGLE/MTP draft."""
    return model_spec(name).geometry(with_draft=True)


def prompts(
    prefix_len: int, suffix_len: int, seed: int, vocab: int = 32000
) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    x = [rng.randrange(vocab) for _ in range(prefix_len)]
    a = [rng.randrange(vocab) for _ in range(suffix_len)]
    b = [rng.randrange(vocab) for _ in range(suffix_len)]
    while b[:1] == a[:1]:
        b[0] = rng.randrange(vocab)  # b diverges from a at its first token
    return x + a, x + b


class FixedEngineProbe:
    """One P and one D vLLM engine that keep their caches across the three phases."""

    def __init__(
        self, geometry: Geometry, policy: PDPolicy, max_len: int, dirs: tuple[str, str]
    ) -> None:
        self.geometry = geometry
        blocks = 4 * sum(-(-max_len // g.block_size) for g in geometry.groups) + 64
        options = {"pd_policy": policy.value, "retention": "auto"}
        self.p, self.d = (
            StandInWorker(
                build_scheduler(EngineSpec(geometry, options, role, name, blocks, max_len), dirs)
            )
            for role, name in (("kv_producer", "P"), ("kv_consumer", "D"))
        )
        self._ids = 0

    def send(self, batch: Sequence[list[int]]) -> list[dict[str, Any]]:
        """Send prompts at once (P prefills them together, D admits them together)."""
        u = self.geometry.hash_unit
        ids = []
        for prompt in batch:
            self._ids += 1
            ids.append(str(self._ids))
            self.p.scheduler.add_request(
                _request(f"P-{self._ids}", prompt, {"do_remote_decode": True}, u)
            )
        params = self._finish(self.p, [f"P-{i}" for i in ids])
        for i, prompt in zip(ids, batch, strict=True):
            self.d.scheduler.add_request(_request(f"D-{i}", prompt, dict(params[f"P-{i}"]), u))
        self.d.take_hits()
        external_before = self.d.external_hits
        self.d.step()  # D admits every request: loads planned and handed to the worker
        relay = getattr(self.d.scheduler, "relaykv", None)
        loads = {
            i: relay.load_of(self.d.scheduler.requests[f"D-{i}"]) if relay is not None else None
            for i in ids
        }
        vllm_local = self.d.take_hits()
        external = self.d.external_hits - external_before
        self.p.step(finished_sending=[f"P-{i}" for i in ids])
        self._finish(self.d, [f"D-{i}" for i in ids])
        out = []
        for i in ids:
            load = loads[i]
            out.append(
                {
                    "local_tokens": load.local_tokens if load is not None else None,
                    "received_blocks": self.d.received.get(f"D-{i}", []),
                }
            )
        if relay is None:  # stock vLLM: its counters are the only account
            for record in out:
                record["local_tokens"] = vllm_local // len(ids)
        out[0]["vllm_local_hit_tokens"] = vllm_local
        out[0]["vllm_external_hit_tokens"] = external
        return out

    @staticmethod
    def _finish(worker: StandInWorker, rids: list[str]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for _ in range(64):
            _, outputs = worker.step()
            for engine_outputs in outputs.values():
                for output in engine_outputs.outputs:
                    if output.request_id in rids and output.finish_reason is not None:
                        params[output.request_id] = output.kv_transfer_params
            if len(params) == len(rids):
                return params
        raise RuntimeError(f"requests {rids} did not finish")


def run_fixed_engine_probe(
    geometry: Geometry,
    policy: PDPolicy | str,
    *,
    prefix_len: int = 65536,
    suffix_len: int = 64,
    seed: int = 0,
    dirs: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The three phases; per phase the per-request records of `FixedEngineProbe.send`."""
    policy = PDPolicy.parse(policy)
    xa, xb = prompts(prefix_len, suffix_len, seed)
    max_len = len(xa) + 256
    if dirs is None:
        with model_dirs() as made:
            return run_fixed_engine_probe(
                geometry, policy, prefix_len=prefix_len, suffix_len=suffix_len, seed=seed, dirs=made
            )
    probe = FixedEngineProbe(geometry, policy, max_len, dirs)
    return {
        "pd_policy": policy.value,
        "prefix_len": prefix_len,
        "phases": {
            "first_load": probe.send([xa]),
            "serial": probe.send([xa]) + probe.send([xb]),
            "overlap": probe.send([xa, xb]),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relaykv.vllm.fixed_engine")
    parser.add_argument("--model", choices=MODELS, default="gpt-oss-20b")
    parser.add_argument("--pd-policy", choices=PD_POLICIES, default="per-group")
    parser.add_argument("--prefix-len", type=int, default=65536)
    parser.add_argument("--suffix-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.prefix_len < 1 or args.suffix_len < 1:
        parser.error("argument --prefix-len/--suffix-len: must be >= 1")
    result = run_fixed_engine_probe(
        model_geometry(args.model),
        args.pd_policy,
        prefix_len=args.prefix_len,
        suffix_len=args.suffix_len,
        seed=args.seed,
    )
    print(json.dumps({"model": args.model, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
