"""Engine factory: `EngineOptions` -> a ready `LLMEngine` plus what the server needs of it.

`build_engine(options)` loads the model (`relaykv.serve.assembly.model_loading`) and calls
`assemble_engine`, which is model-agnostic: given the model's description, its KV geometry
and a function that builds the executor for a pool of N blocks, it sizes the pool
(`--num-blocks`, or `--kv-cache-memory // geometry.block_bytes`, docs/design.md §8), checks
that one request of `max_model_len` tokens fits, builds the engine and writes the startup
summary (geometry, pool, per-request caps, maximum concurrency, shortest reusable prompt),
so a 0% hit rate is never a surprise.

P/D hook (docs/pd.md): pass `connector_factory=` (engine -> `relaykv.engine.KVConnector`,
e.g. a `relaykv.transfer.PDConnector` over `engine.manager`, the runner's KV buffer
`engine.executor.kv_buffer` and the transport named by `options.kv_transport`) together
with `options.role` / `pd_policy` / `kv_load_failure` / `kv_lease_seconds`. The factory puts
role, policy and failure policy in the engine and scheduler configs (so the sizing caps count
the P/D plan's retention), builds the engine, then calls the factory and attaches the
connector. A role other than `colocated` without a factory is refused naming `--role`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relaykv.engine import EngineConfig, Executor, KVConnector, LLMEngine, SchedulerConfig
from relaykv.kvcache import CacheSizing, Geometry, parse_retention
from relaykv.serve.assembly.model_info import ModelInfo
from relaykv.serve.assembly.options import DEFAULT_MAX_MODEL_LEN, EngineOptions, OptionError
from relaykv.serve.assembly.sizes import format_bytes

if TYPE_CHECKING:  # relaykv.model loads torch: not before the flags are parsed
    from relaykv.model.text.chat_template import ChatFormatter, TextTokenizer

log = logging.getLogger("relaykv.serve")

# Builds the P/D connector of an engine (called once, after the engine exists).
ConnectorFactory = Callable[[LLMEngine], KVConnector]


@dataclass(slots=True)
class ServedEngine:
    """The engine and everything the HTTP layer reads about it."""

    engine: LLMEngine
    model: ModelInfo
    served_model_name: str
    max_model_len: int
    options: EngineOptions
    chat: ChatFormatter
    summary: list[str] = field(default_factory=list)

    @property
    def tokenizer(self) -> TextTokenizer | None:
        return self.model.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size


def resolve_max_model_len(options: EngineOptions, model: ModelInfo) -> int:
    limit = model.max_position_embeddings
    if options.max_model_len is None:
        return min(DEFAULT_MAX_MODEL_LEN, limit) if limit else DEFAULT_MAX_MODEL_LEN
    if limit and options.max_model_len > limit:
        raise OptionError(
            "--max-model-len",
            f"{options.max_model_len} exceeds the model's max_position_embeddings ({limit})",
        )
    return options.max_model_len


def pool_blocks(options: EngineOptions, geometry: Geometry) -> int:
    if options.num_blocks is not None:
        return options.num_blocks
    try:
        blocks = CacheSizing.blocks_for_memory(geometry, options.pool_memory)
    except ValueError as exc:
        raise OptionError("--kv-cache-memory", f"{exc}; use --num-blocks") from None
    if blocks < 2:
        raise OptionError(
            "--kv-cache-memory",
            f"{format_bytes(options.pool_memory)} holds {blocks} blocks of "
            f"{format_bytes(geometry.block_bytes)}; at least 2 are needed",
        )
    return blocks


def assemble_engine(
    options: EngineOptions,
    model: ModelInfo,
    geometry: Geometry,
    make_executor: Callable[[int], Executor],
    *,
    connector_factory: ConnectorFactory | None = None,
) -> ServedEngine:
    """Size the pool, build the executor for it and the engine around it (see module doc)."""
    options.check()
    geometry = geometry.with_eagle_reuse(options.eagle_reuse)
    if options.role.in_pd_pair and connector_factory is None:
        raise OptionError(
            "--role",
            f"role {options.role!r} needs a KV connector; this command has no P/D wiring "
            "(build_engine(..., connector_factory=...), docs/serving.md)",
        )
    try:
        retention = parse_retention(options.retention, geometry.alignment, options.role)
    except ValueError as exc:
        raise OptionError("--retention", str(exc)) from None
    max_model_len = resolve_max_model_len(options, model)
    num_blocks = pool_blocks(options, geometry)
    k = options.speculative_tokens
    # The one CacheSizing of this engine: built and checked here, handed to the cache manager.
    sizing = CacheSizing.build(
        geometry,
        num_blocks,
        max_model_len,
        options.max_num_batched_tokens + k,
        options.pd_policy if options.role.in_pd_pair else None,
        options.sibling_reach if options.role.in_pd_pair else 0,
    )
    if not sizing.fits_at_startup():
        flag = "--num-blocks" if options.num_blocks is not None else "--kv-cache-memory"
        need = sizing.blocks_per_request + 1
        raise OptionError(
            flag,
            f"{num_blocks} blocks cannot hold one request of --max-model-len {max_model_len} "
            f"tokens (needs {need} blocks = {format_bytes(need * geometry.block_bytes)}); "
            "raise the pool or lower --max-model-len",
        )
    executor = make_executor(num_blocks)
    if executor.num_speculative_tokens != k:
        raise RuntimeError(f"executor proposes {executor.num_speculative_tokens} tokens, not {k}")
    if [(g.kind, g.block_size, g.parameter) for g in executor.geometry.groups] != [
        (g.kind, g.block_size, g.parameter) for g in geometry.groups
    ]:
        raise RuntimeError("the executor's KV geometry differs from the planned one")
    config = EngineConfig(
        num_blocks=num_blocks,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=options.max_num_batched_tokens,
            max_num_seqs=options.max_num_seqs,
            max_model_len=max_model_len,
            kv_load_failure=options.kv_load_failure,
            max_local_prefill_tokens=(
                options.max_local_prefill_tokens if options.role == "decode" else None
            ),
        ),
        retention=str(retention),
        enable_prefix_caching=options.enable_prefix_caching,
        role=options.role,
        pd_policy=options.pd_policy,
        sibling_reach=options.sibling_reach if options.role.in_pd_pair else 0,
        eagle_reuse=options.eagle_reuse,
        model_name=options.served_model_name or model.name,
        sizing=sizing,
        kv_offloading_interval=options.kv_offloading_interval,
    )
    tier = None
    if options.kv_offloading_size is not None:
        from relaykv.serve.assembly.tier_wiring import build_tier

        tier = build_tier(options, executor, config.model_name)
    try:
        engine = LLMEngine(
            executor,
            config,
            tokenizer=model.tokenizer,
            eos_token_ids=model.eos_token_ids,
            vocab_size=model.vocab_size,
            tier=tier,
        )
    except ValueError as exc:
        if tier is not None and "--kv-offloading-interval" in str(exc):
            tier.shutdown()
            flag = "--kv-offloading-interval"
            raise OptionError(flag, str(exc).removeprefix(f"{flag} ")) from None
        raise
    if options.role.in_pd_pair:
        assert connector_factory is not None
        engine.attach_connector(connector_factory(engine))
    from relaykv.model.text.chat_template import ChatFormatter

    chat = model.chat or ChatFormatter(model.tokenizer, None, model.bos_token_id)
    served = ServedEngine(
        engine, model, config.model_name, max_model_len, options, chat, summary=[]
    )
    served.summary = startup_summary(served, geometry, sizing)
    return served


def startup_summary(served: ServedEngine, geometry: Geometry, sizing: CacheSizing) -> list[str]:
    """What startup prints and logs: model, geometry, pool, caps, concurrency, reuse unit."""
    o, m = served.options, served.model
    pool = sizing.num_blocks
    memory = pool * geometry.block_bytes
    source = (
        f"--num-blocks {pool}"
        if o.num_blocks is not None
        else (f"--kv-cache-memory {format_bytes(o.pool_memory)}")
    )
    lines = [
        f"model: {m.name} ({m.source}){', ' + m.description if m.description else ''}; "
        f"vocab {m.vocab_size}; served as {served.served_model_name!r}",
        f"KV geometry: {geometry.describe()}",
        f"KV pool: {pool} blocks x {format_bytes(geometry.block_bytes)} (block_bytes) = "
        f"{format_bytes(memory)} from {source}",
        f"KV sizing: {sizing.describe()}",
        f"requests: max_model_len {served.max_model_len}, max_num_batched_tokens "
        f"{o.max_num_batched_tokens}, max_num_seqs {o.max_num_seqs}, speculative tokens "
        f"{o.speculative_tokens}" + (f" (draft {o.draft_model})" if o.draft_model else ""),
    ]
    if o.enable_prefix_caching:
        lines.append(
            f"prefix caching: on, retention {served.engine.manager.retention}; a prompt reuses "
            f"cache only in multiples of the alignment {geometry.alignment} and from "
            f"{sizing.min_reusable_prefix} tokens up (shortest reusable prompt"
            f"{', EAGLE unit included' if geometry.eagle else ''})"
        )
    else:
        lines.append("prefix caching: OFF (--no-prefix-caching); cached_tokens will be 0")
    lines.append(f"chat: {served.chat.description}")
    if served.model.tokenizer_dir is not None:
        lines.append(
            f"tokenizer: {served.model.tokenizer_dir} (a Hugging Face directory: "
            "vllm bench serve / bench_serving.py --tokenizer DIR)"
        )
    tier = served.engine.manager.tier
    if tier is not None:
        lines.append(
            f"KV tier: {tier.backend.name}, {tier.backend.capacity_blocks} blocks "
            f"({format_bytes(tier.backend.capacity_blocks * geometry.block_bytes)}) from "
            f"--kv-offloading-size {o.kv_offloading_size}, checkpoints every "
            f"{tier.plan.interval} tokens"
        )
    if o.role != "colocated":
        local = o.max_local_prefill_tokens
        lines.append(
            f"P/D: role {o.role}, policy {o.pd_policy}, KV load failure {o.kv_load_failure}, "
            f"sibling reach {o.sibling_reach}"
            + (f", local prefill <= {local} tokens/step" if o.role == "decode" else "")
        )
    return lines


def build_engine(
    options: EngineOptions,
    *,
    connector_factory: ConnectorFactory | None = None,
    kv_buffer: Callable[[Geometry, int], Any] | None = None,
    progress: bool = True,
) -> ServedEngine:
    """Load the model named by `options.model` and build its engine (raises OptionError).
    `kv_buffer` provides the KV page memory (see `load_for_serving`)."""
    from relaykv.serve.assembly.model_loading import load_for_serving  # torch: only when serving

    options.check()
    model, geometry, make_executor = load_for_serving(options, progress, kv_buffer)
    return assemble_engine(
        options, model, geometry, make_executor, connector_factory=connector_factory
    )
