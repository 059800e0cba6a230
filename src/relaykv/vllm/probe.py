"""`relaykv cache-probe --engine vllm`: the cache probe through vLLM 0.33's real scheduler.

The same probe and JSON as `relaykv cache-probe` (`relaykv.cache_probe.probe`): a prefill
engine P and a decode engine D, each a vLLM `Scheduler` (relaykv.vllm.Scheduler, with
`RelayKVConnector`), run the first load, then `resend`, `extension` and `sibling`; a
colocated vLLM engine runs the same prompts. Everything vLLM does on its scheduler side runs
for real: request admission and budgets, its KV cache manager (stock under `legacy`,
relaykv's otherwise), the NIXL connector's scheduler half and its metadata. Only the model
is absent: a stand-in worker samples token 0, reads the NIXL metadata of each load (pairing
P's and D's block lists the way NIXL's worker does, end-aligned), counts the blocks it
would read per group and reports the load finished (`finished_recving` on D,
`finished_sending` on P).

Run in the vLLM venv (tools/vllm_venv.sh): `python -m relaykv.vllm.probe ARGS`, with the
arguments of `relaykv cache-probe`; `relaykv cache-probe --engine vllm` does that for you.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from relaykv.cache_probe import cli as probe_cli
from relaykv.cache_probe.probe import FOLLOW_UPS, ProbePrompts, pool_blocks, probe_result
from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.pd_config import PDPolicy
from relaykv.vllm.scheduler import Scheduler
from relaykv.vllm.specs import kv_cache_config_for

SAMPLED_TOKEN = 0  # what the stand-in worker samples (relaykv's probe decodes token 0 too)
MAX_STEPS = 64


def _model_config(path: str, layers: int, arch: str) -> dict[str, Any]:
    return {
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "num_hidden_layers": layers,
        "vocab_size": 32000,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5,
    }


@contextmanager
def model_dirs() -> Iterator[tuple[str, str]]:
    """A config-only target model and EAGLE3 draft (vLLM reads `config.json`, no weights)."""
    with tempfile.TemporaryDirectory(prefix="relaykv-vllm-probe-") as root:
        dirs = []
        for name, layers, arch in (
            ("target", 2, "LlamaForCausalLM"),
            ("draft", 1, "Eagle3LlamaForCausalLM"),
        ):
            path = os.path.join(root, name)
            os.makedirs(path)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(_model_config(path, layers, arch), f)
            dirs.append(path)
        yield dirs[0], dirs[1]


@dataclass
class EngineSpec:
    """What one probe engine is: geometry, plugin options, role, pool and lengths."""

    geometry: Geometry
    options: dict[str, str]
    kv_role: str | None  # kv_producer / kv_consumer, None: colocated (no connector)
    engine_id: str
    num_blocks: int
    max_model_len: int
    stock: bool = False  # vLLM's own Scheduler and NixlConnector, no plugin at all
    scheduler_options: dict[str, Any] = field(default_factory=dict)  # SchedulerConfig fields
    kv_events: bool = False  # vLLM's KV events on (null publisher)


def build_scheduler(spec: EngineSpec, dirs: tuple[str, str]) -> Any:
    """A vLLM scheduler (the class `--scheduler-cls` names) for a geometry, as `vllm serve`
    would build it, minus the worker (`cache_config.num_gpu_blocks` set by hand)."""
    target, draft = dirs
    geometry = spec.geometry
    init_none_hash(sha256)  # vLLM's hash seed, as its engine core sets it at start
    model = ModelConfig(
        model=target, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=spec.max_model_len
    )
    speculative = None
    if geometry.eagle:
        speculative = SpeculativeConfig(
            method="eagle3",
            model=draft,
            num_speculative_tokens=1,
            target_model_config=model,
            target_parallel_config=ParallelConfig(),
            disable_lookahead_block_hashes=True,  # relaykv keys the successor itself
        )
    cache = CacheConfig(block_size=geometry.alignment, enable_prefix_caching=True)
    cache.num_gpu_blocks = spec.num_blocks
    scheduler = SchedulerConfig(
        max_num_batched_tokens=spec.max_model_len,
        max_num_seqs=16,
        max_model_len=spec.max_model_len,
        is_encoder_decoder=False,
        **{
            "scheduler_cls": None if spec.stock else Scheduler,
            "async_scheduling": False,
            **spec.scheduler_options,
        },
    )
    transfer = None
    additional: dict[str, Any] = {"relaykv": dict(spec.options)}
    if spec.kv_role is not None:
        plugin = {} if spec.stock else {"kv_connector_module_path": "relaykv.vllm.connector"}
        transfer = KVTransferConfig(
            kv_connector="NixlConnector" if spec.stock else "RelayKVConnector",
            kv_role=spec.kv_role,
            engine_id=spec.engine_id,
            kv_connector_extra_config=dict(spec.options),
            **plugin,
        )
        additional = {}
    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        model_config=model,
        cache_config=cache,
        scheduler_config=scheduler,
        kv_transfer_config=transfer,
        speculative_config=speculative,
        additional_config=additional,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        if spec.kv_events
        else None,
    )
    # This CPU stands in for a GPU engine: vLLM turns its hybrid manager off off-GPU.
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    cls = config.scheduler_config.get_scheduler_cls()
    return cls(
        config,
        kv_cache_config_for(geometry, spec.num_blocks),
        StructuredOutputManager(config),
        block_size=geometry.alignment,
        hash_block_size=geometry.hash_unit,
        log_stats=True,
    )


class StandInWorker:
    """Drives one scheduler step by step in place of vLLM's model runner."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.received: dict[str, list[int]] = {}  # request -> blocks read per group
        self.pairs: dict[str, list[list[tuple[int, int]]]] = {}  # (remote, local) per group
        self._recving: set[str] = set()
        self.local_hits = 0  # vLLM's prefix-cache hit counter (tokens), summed over steps
        self.external_hits = 0  # vLLM's external (connector) hit counter
        self.steps = 0  # steps that scheduled work or moved a transfer
        self.scheduler_seconds = 0.0  # time inside schedule() + update_from_output()

    def take_hits(self) -> int:
        hits, self.local_hits = self.local_hits, 0
        return hits

    def step(self, finished_sending: Sequence[str] = ()) -> tuple[SchedulerOutput, Any]:
        out, runner = self.launch(finished_sending)
        return out, self.land(out, runner)

    def launch(self, finished_sending: Sequence[str] = ()) -> tuple[SchedulerOutput, Any]:
        """Schedule one step and 'run' it: returns the step and what the model runner will
        report. Under async scheduling the next step may be launched before this one lands."""
        s = self.scheduler
        started = time.perf_counter()
        out = s.schedule()
        self.scheduler_seconds += time.perf_counter() - started
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = s.requests[rid]
            sampled.append([SAMPLED_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
        self._read(out.kv_connector_metadata)
        connector_output = KVConnectorOutput(
            finished_recving=set(self._recving) or None,
            finished_sending=set(finished_sending) or None,
        )
        self._recving.clear()
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        )
        return out, runner

    def land(self, out: SchedulerOutput, runner: Any) -> Any:
        """The model runner's report of a launched step reaches the scheduler."""
        s = self.scheduler
        started = time.perf_counter()
        outputs = s.update_from_output(out, runner)
        self.scheduler_seconds += time.perf_counter() - started
        self.steps += 1
        for engine_outputs in outputs.values():
            stats = engine_outputs.scheduler_stats
            if stats is not None:
                self.local_hits += stats.prefix_cache_stats.hits
                if stats.connector_prefix_cache_stats is not None:
                    self.external_hits += stats.connector_prefix_cache_stats.hits
        return outputs

    def _read(self, meta: Any) -> None:
        """NIXL's worker pairs each group's lists end-aligned (D's list is at most P's)."""
        if not isinstance(meta, NixlConnectorMetadata):
            return
        for rid, req_meta in meta.reqs_to_recv.items():
            local = [list(ids) for ids in req_meta.local_block_ids]
            remote = [list(ids) for ids in req_meta.remote.block_ids] if req_meta.remote else []
            pairs = []
            for g, ids in enumerate(local):
                theirs = remote[g] if g < len(remote) else []
                if len(ids) > len(theirs):
                    raise AssertionError(
                        f"{rid}: group {g} wants {len(ids)} blocks, P offers {len(theirs)}"
                    )
                pairs.append(list(zip(theirs[len(theirs) - len(ids) :], ids, strict=True)))
            self.received[rid] = [len(ids) for ids in local]
            self.pairs[rid] = pairs
            self._recving.add(rid)


def _request(
    rid: str,
    prompt: list[int],
    params: dict[str, Any] | None,
    block_size: int,
    max_tokens: int = 1,
) -> Request:
    extra = {"kv_transfer_params": params} if params is not None else None
    return Request(
        rid,
        list(prompt),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra),
        None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def _run_to_end(
    worker: StandInWorker, rid: str, sending: Sequence[str] = ()
) -> dict[str, Any] | None:
    """Step until `rid` finishes; returns its kv_transfer_params."""
    for _ in range(MAX_STEPS):
        _, outputs = worker.step(sending)
        sending = ()
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                if output.request_id == rid and output.finish_reason is not None:
                    return output.kv_transfer_params
    raise RuntimeError(f"the probe's request {rid} did not finish in {MAX_STEPS} steps")


def probe_colocated(
    geometry: Geometry,
    options: dict[str, str],
    prompts: ProbePrompts,
    dirs: tuple[str, str],
    stock: bool = False,
) -> dict[str, int]:
    spec = EngineSpec(
        geometry, options, None, "C", pool_blocks(geometry, prompts), _max_len(prompts), stock
    )
    worker = StandInWorker(build_scheduler(spec, dirs))
    hits = {}
    for i, name in enumerate(("first", *FOLLOW_UPS)):
        rid = f"C-{i}"
        worker.scheduler.add_request(
            _request(rid, getattr(prompts, name), None, geometry.hash_unit)
        )
        worker.take_hits()
        _run_to_end(worker, rid)
        hits[name] = worker.take_hits()
    del hits["first"]
    return hits


def probe_decode(
    geometry: Geometry,
    options: dict[str, str],
    prompts: ProbePrompts,
    dirs: tuple[str, str],
    stock: bool = False,
) -> dict[str, dict[str, int | list[int]]]:
    blocks, max_len = pool_blocks(geometry, prompts), _max_len(prompts)
    p, d = (
        StandInWorker(
            build_scheduler(EngineSpec(geometry, options, role, name, blocks, max_len, stock), dirs)
        )
        for role, name in (("kv_producer", "P"), ("kv_consumer", "D"))
    )
    out: dict[str, dict[str, int | list[int]]] = {}
    u = geometry.hash_unit
    for i, name in enumerate(("first_load", *FOLLOW_UPS)):
        prompt = prompts.first if name == "first_load" else getattr(prompts, name)
        p_id, d_id = f"P-{i}", f"D-{i}"
        p.scheduler.add_request(_request(p_id, prompt, {"do_remote_decode": True}, u))
        params = _run_to_end(p, p_id)
        if not params:
            raise RuntimeError(f"P returned no kv_transfer_params for {p_id}")
        d.scheduler.add_request(_request(d_id, prompt, dict(params), u))
        d.take_hits()
        d.step()  # D admits the request: the load is planned and handed to the worker
        relay = getattr(d.scheduler, "relaykv", None)
        load = None if relay is None else relay.load_of(d.scheduler.requests[d_id])
        # relaykv's exact count under the plugin (vLLM's counter rounds it down to the
        # scheduler block, docs/vllm.md); vLLM's own counter under legacy.
        local = load.local_tokens if load is not None else d.take_hits()
        if relay is not None:
            _check_pairs(p.scheduler, d.scheduler, p_id, d_id, d.pairs.get(d_id, []))
        p.step(finished_sending=[p_id])  # D read P's blocks: P frees them
        _run_to_end(d, d_id)
        out[name] = {"local_tokens": local, "received_blocks": d.received.get(d_id, [])}
    return out


def _check_pairs(p_sched: Any, d_sched: Any, p_id: str, d_id: str, pairs: list[Any]) -> None:
    """Under relaykv's plan every (P block, D block) pair NIXL forms holds one block index."""
    p_table = p_sched.relaykv.relay.requests[p_id].tables
    d_indices = d_sched.relaykv.received_indices(d_sched.requests[d_id])
    for g, group_pairs in enumerate(pairs):
        for (p_block, _), k in zip(group_pairs, d_indices[g], strict=True):
            if p_table[g][k] != p_block:
                raise AssertionError(f"{d_id}: group {g} block {k} paired with P's block {p_block}")


def _max_len(prompts: ProbePrompts) -> int:
    return len(prompts.extension) + 64


def run_probe(
    geometry: Geometry,
    policy: PDPolicy | str,
    prompt_len: int,
    *,
    retention: str = "boundaries",
    extension_len: int = 48,
    sibling_diverge: int = 24,
    seed: int = 0,
    dirs: tuple[str, str] | None = None,
    stock: bool = False,
) -> dict[str, object]:
    """`relaykv.cache_probe.probe.run_probe`, through vLLM's scheduler. `stock`: vLLM's own
    scheduler and NIXL connector, no plugin (what `legacy` must reproduce)."""
    policy = PDPolicy.parse(policy)
    prompts = ProbePrompts.make(prompt_len, extension_len, sibling_diverge, seed)
    options = {
        "pd_policy": policy.value,
        "retention": retention,
        "eagle_reuse": geometry.eagle_reuse,
    }
    with _dirs(dirs) as paths:
        return probe_result(
            geometry,
            policy,
            prompt_len,
            probe_colocated(geometry, options, prompts, paths, stock),
            probe_decode(geometry, options, prompts, paths, stock),
        )


@contextmanager
def _dirs(dirs: tuple[str, str] | None) -> Iterator[tuple[str, str]]:
    if dirs is not None:
        yield dirs
        return
    with model_dirs() as made:
        yield made


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="relaykv cache-probe --engine vllm",
        description="relaykv's cache probe through vLLM 0.33's scheduler (stand-in worker)",
    )
    probe_cli.add_arguments(parser)
    args = parser.parse_args(argv)
    geometry = probe_cli.build_geometry(parser, args)
    probe_cli.validate(parser, args, geometry)
    with model_dirs() as dirs:
        results = [
            run_probe(geometry, policy, args.prompt_len, dirs=dirs, **probe_cli.probe_options(args))
            for policy in probe_cli.selected_policies(args)
        ]
    print(probe_cli.render(geometry, args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
