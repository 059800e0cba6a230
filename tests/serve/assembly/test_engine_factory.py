"""The engine factory: pool sizing from memory, the startup summary, checks naming flags."""

from __future__ import annotations

import pytest

from relaykv.kvcache import CacheSizing
from relaykv.serve import EngineOptions, ModelInfo, OptionError, assemble_engine
from relaykv.serve.assembly.sizes import format_bytes, parse_bytes
from tests.engine.reference_executor import VOCAB, with_slot_bytes

from ..harness import HYBRID, PacedExecutor, reference_served

GEOMETRY = with_slot_bytes(HYBRID)  # block_bytes = 4 tokens * 8 bytes = 32


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512MiB", 512 << 20),
        ("2GiB", 2 << 30),
        ("1.5G", 1_500_000_000),
        ("1000", 1000),
        ("64 kib", 64 << 10),
        ("3MB", 3_000_000),
    ],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "-1", "0", "1e9", "0.1"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B" and format_bytes(3 << 29) == "1.50 GiB"


def model(**kw: object) -> ModelInfo:
    return ModelInfo("m", "test", VOCAB, **kw)  # type: ignore[arg-type]


def build(options: EngineOptions, info: ModelInfo | None = None):
    return assemble_engine(options, info or model(), GEOMETRY, lambda n: PacedExecutor(HYBRID, n))


def test_pool_from_memory_uses_block_bytes() -> None:
    assert GEOMETRY.block_bytes == 32
    served = build(EngineOptions(kv_cache_memory=32 * 1000 + 31, max_model_len=256))
    pool = served.engine.manager.pool
    assert pool.num_blocks == 1000 == CacheSizing.blocks_for_memory(GEOMETRY, 32_031)
    assert served.engine.executor.buffer.shape == (1000, 32)  # the executor got the same size
    assert served.max_model_len == 256


def test_startup_summary_says_what_to_expect() -> None:
    served = reference_served(num_blocks=400, max_model_len=512)
    text = "\n".join(served.summary)
    sizing = served.engine.manager.sizing
    assert "KV geometry: g0=full(b=4), g1=sliding(b=4, W=10)" in text
    assert "KV pool: 400 blocks x 32 B (block_bytes)" in text
    assert sizing.describe() in text
    assert f"shortest reusable prompt {sizing.min_reusable_prefix} tokens" in text
    assert "max_model_len 512" in text and "prefix caching: on" in text
    off = reference_served(enable_prefix_caching=False)
    assert any("prefix caching: OFF" in line for line in off.summary)


def test_a_kv_tier_from_its_flags() -> None:
    served = build(EngineOptions(num_blocks=400, max_model_len=256, kv_offloading_size=0.001))
    tier = served.engine.manager.tier
    try:
        assert tier is not None and tier.backend.capacity_blocks == (1 << 30) // 1000 // 32
        assert tier.plan.interval == GEOMETRY.alignment
        assert any(line.startswith("KV tier: native, 33554 blocks") for line in served.summary)
    finally:
        served.engine.manager.tier.shutdown() if tier else None


def test_max_model_len_defaults_to_the_model_limit() -> None:
    served = build(EngineOptions(num_blocks=2000), model(max_position_embeddings=1000))
    assert served.max_model_len == 1000
    with pytest.raises(OptionError, match="max_position_embeddings") as err:
        build(
            EngineOptions(num_blocks=2000, max_model_len=1001), model(max_position_embeddings=1000)
        )
    assert err.value.flag == "--max-model-len"


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        (EngineOptions(num_blocks=50, max_model_len=512), "--num-blocks"),
        (EngineOptions(kv_cache_memory=32 * 50, max_model_len=512), "--kv-cache-memory"),
        (EngineOptions(kv_cache_memory=40, max_model_len=512), "--kv-cache-memory"),
        (EngineOptions(num_blocks=400, retention="interval:6"), "--retention"),
        (EngineOptions(num_blocks=400, retention="sometimes"), "--retention"),
        (EngineOptions(num_blocks=400, role="prefill"), "--role"),
        (EngineOptions(num_blocks=400, role="both"), "--role"),
        (EngineOptions(num_blocks=400, pd_policy="nope"), "--pd-policy"),
        (EngineOptions(num_blocks=400, kv_load_failure="retry"), "--kv-load-failure"),
        (EngineOptions(num_blocks=400, kv_lease_seconds=0), "--kv-lease-seconds"),
        (
            EngineOptions(num_blocks=400, max_model_len=256, kv_offloading_size=0),
            "--kv-offloading-size",
        ),
        (
            EngineOptions(num_blocks=400, max_model_len=256, kv_offloading_size=1e-9),
            "--kv-offloading-size",
        ),
        (
            EngineOptions(
                num_blocks=400,
                max_model_len=256,
                kv_offloading_size=0.001,
                kv_offloading_interval=6,
            ),
            "--kv-offloading-interval",
        ),
        (
            EngineOptions(
                num_blocks=400,
                max_model_len=256,
                kv_offloading_size=0.001,
                kv_offloading_backend="x",
            ),
            "--kv-offloading-backend",
        ),
        (
            EngineOptions(num_blocks=400, kv_offloading_size=0.001, kv_store_master="h:1"),
            "--kv-store-master",  # a master without the mooncake backend
        ),
        (
            EngineOptions(
                num_blocks=400,
                kv_offloading_size=0.001,
                kv_offloading_backend="mooncake",
                kv_store_master="nohost",
                kv_secret_file="f",
            ),
            "--kv-store-master",
        ),
        (
            EngineOptions(
                num_blocks=400,
                kv_offloading_size=0.001,
                kv_offloading_backend="mooncake",
                kv_store_master="127.0.0.1:50051",
            ),
            "--kv-secret-file",
        ),
        (
            EngineOptions(
                num_blocks=400,
                kv_offloading_backend="mooncake",
                kv_store_master="127.0.0.1:50051",
                kv_secret_file="f",
            ),
            "--kv-offloading-backend",  # no --kv-offloading-size
        ),
    ],
)
def test_bad_options_name_their_flag(options: EngineOptions, flag: str) -> None:
    with pytest.raises(OptionError) as err:
        build(options)
    assert err.value.flag == flag and str(err.value).startswith(f"argument {flag}:")


def test_a_pool_that_exactly_fits_one_request_is_accepted() -> None:
    sizing = CacheSizing.build(GEOMETRY, 10_000, 512, 64)
    options = EngineOptions(
        num_blocks=sizing.blocks_per_request + 1, max_model_len=512, max_num_batched_tokens=64
    )
    served = build(options)
    assert served.engine.manager.sizing.fits_at_startup()
    with pytest.raises(OptionError, match="cannot hold one request"):
        build(
            EngineOptions(
                num_blocks=sizing.blocks_per_request, max_model_len=512, max_num_batched_tokens=64
            )
        )


def test_pd_roles_plug_a_connector_in_through_the_factory_hook() -> None:
    built = []

    class Connector:  # the KVConnector surface the engine calls; nothing moves here
        def validate(self, params): ...
        def prefill_finished(self, request): ...
        def start_load(self, request, load): ...
        def release_remote(self, request): ...
        def poll(self):
            return []

        def shutdown(self): ...

    def factory(engine):
        built.append(engine)
        return Connector()

    options = EngineOptions(num_blocks=400, max_model_len=256, role="prefill", pd_policy="exact")
    served = assemble_engine(
        options, model(), GEOMETRY, lambda n: PacedExecutor(HYBRID, n), connector_factory=factory
    )
    engine = served.engine
    assert built == [engine] and isinstance(engine.connector, Connector)
    assert engine.scheduler.connector is engine.connector
    assert engine.config.role == "prefill" and engine.manager.pd_policy == "exact"
    assert any(line.startswith("P/D: role prefill, policy exact") for line in served.summary)
