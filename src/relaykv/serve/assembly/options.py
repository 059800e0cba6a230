"""Engine options: the `relaykv serve` flags that shape the engine, parsed and checked.

`add_engine_arguments` declares the flags; `engine_options` turns parsed arguments into an
`EngineOptions` or raises `OptionError` naming the flag (the CLI prints it as one line and
exits 2). Checks that need the model (pool too small for `--max-model-len`, a retention
interval that is not a multiple of the alignment) happen in the factory and raise the same
error.

P/D (docs/pd.md): `add_pd_arguments` declares `--role`, `--pd-policy`, `--kv-lease-seconds`,
`--kv-load-failure`, `--sibling-reach`, `--max-local-prefill-tokens` (conditional
disaggregation, docs/routing.md) and the transport's own flags
(`relaykv.transfer.transport.registry`: `--kv-transport`, `--kv-transfer-host/-port/-timeout`);
they land in `EngineOptions` (the transport flags stay on the namespace for
`options_from_args`). A role other than `colocated` needs a connector: `build_engine(options,
connector_factory=...)` builds it over the engine (see `relaykv.serve.assembly.engine_factory`);
without one the factory refuses the role.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from typing import Any

from relaykv.engine import KV_LOAD_FAILURE_POLICIES
from relaykv.kvcache import DEFAULT_PD_POLICY, PD_POLICIES, ROLES, PDPolicy, Role
from relaykv.kvcache.geometry import EAGLE_REUSE_ENGINE, EagleReuse
from relaykv.kvcache.pd_config import eagle_reuse_conflict
from relaykv.kvcache.retention import AUTO_RETENTION, ENGINE_RETENTION_HELP
from relaykv.serve.assembly.sizes import format_bytes, parse_bytes

DEFAULT_MODEL = "tiny-hybrid"
DEFAULT_KV_CACHE_MEMORY = 1 << 30  # 1 GiB of host memory for KV pages
DEFAULT_MAX_MODEL_LEN = 4096  # capped by the model's max_position_embeddings
DTYPES = ("float32", "bfloat16", "float16")
# A decode engine's local prefill per step: one chunk this size costs a running stream about
# as much as a few decode steps of a small batch (docs/routing.md, "Conditional").
DEFAULT_MAX_LOCAL_PREFILL_TOKENS = 256


class OptionError(ValueError):
    """A bad option value; `flag` is the command-line flag to name in the error."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"argument {flag}: {message}")
        self.flag = flag


@dataclass(frozen=True, slots=True)
class EngineOptions:
    model: str = DEFAULT_MODEL
    dtype: str = "float32"
    max_model_len: int | None = None  # None: min(DEFAULT_MAX_MODEL_LEN, model's limit)
    kv_cache_memory: int | None = None  # bytes; None with num_blocks None: the default
    num_blocks: int | None = None
    block_size: int = 16
    retention: str = AUTO_RETENTION  # dense on a prefill engine, boundaries elsewhere
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    speculative_tokens: int = 0
    # An EAGLE checkpoint directory, or "random"; None with speculative tokens: the model's
    # built-in draft (tiny-hybrid's and gemma3-270m's, relaykv.model.drafts).
    draft_model: str | None = None
    # How a prefix hit treats the draft's KV at its last position (docs/design.md §4): drop
    # the last unit (vLLM's rule), or compute that one position again (`recompute`).
    eagle_reuse: EagleReuse = "drop"
    seed: int | None = None
    enable_prefix_caching: bool = True
    served_model_name: str | None = None
    # P/D (see the module docstring).
    role: Role = Role.COLOCATED
    pd_policy: PDPolicy = DEFAULT_PD_POLICY
    kv_transport: str = "shm"  # relaykv.transfer transport name (shm, tcp, nixl, mooncake)
    kv_lease_seconds: float = 30.0  # P holds a request's blocks at most this long for D
    kv_load_failure: str = "recompute"  # D: recompute locally, or fail the request
    sibling_reach: int = 0  # tokens below a received prompt's end D keeps windows for
    # D: prompt tokens computed locally per step (local requests, failed loads)
    max_local_prefill_tokens: int = DEFAULT_MAX_LOCAL_PREFILL_TOKENS
    # The KV tier (docs/tier.md): GiB of it (None: no tier), its backend, its interval.
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    kv_offloading_interval: int | None = None
    kv_store_master: str | None = None  # mooncake: the store's master, HOST:PORT
    kv_secret_file: str | None = None  # the cluster secret (a shared tier names/tags with it)

    def __post_init__(self) -> None:
        # Where a --role / --pd-policy string becomes the enum every layer takes; a bad one
        # stays a string for `check()` to report with its flag.
        for name, enum in (("role", Role), ("pd_policy", PDPolicy)):
            with contextlib.suppress(ValueError):
                object.__setattr__(self, name, enum(getattr(self, name)))

    @property
    def pool_memory(self) -> int:
        return self.kv_cache_memory if self.kv_cache_memory is not None else DEFAULT_KV_CACHE_MEMORY

    def check(self) -> None:
        """Checks that need no model; raises `OptionError`."""
        for flag, given, enum in (
            ("--role", self.role, Role),
            ("--pd-policy", self.pd_policy, PDPolicy),
        ):
            if not isinstance(given, enum):
                try:
                    enum.parse(given)
                except ValueError as exc:
                    raise OptionError(flag, str(exc)) from None
        positive: dict[str, int] = {
            "--block-size": self.block_size,
            "--max-num-batched-tokens": self.max_num_batched_tokens,
            "--max-num-seqs": self.max_num_seqs,
        }
        for flag, value in positive.items():
            if value < 1:
                raise OptionError(flag, f"must be >= 1, got {value}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise OptionError("--max-model-len", f"must be >= 2, got {self.max_model_len}")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise OptionError(
                "--num-blocks", f"must be >= 2 (block 0 is reserved), got {self.num_blocks}"
            )
        if self.speculative_tokens < 0:
            raise OptionError(
                "--speculative-tokens", f"must be >= 0, got {self.speculative_tokens}"
            )
        if self.speculative_tokens and not self.draft_model:
            from relaykv.model.drafts import has_default_draft, shipped_drafts

            if not has_default_draft(self.model):
                raise OptionError(
                    "--speculative-tokens",
                    "needs --draft-model (an EAGLE checkpoint or 'random'); built-in drafts: "
                    + ", ".join(shipped_drafts()),
                )
        if self.eagle_reuse not in EAGLE_REUSE_ENGINE:
            raise OptionError(
                "--eagle-reuse",
                f"choose from {', '.join(EAGLE_REUSE_ENGINE)}, got {self.eagle_reuse!r}",
            )
        if Role.parse(self.role).in_pd_pair and (
            conflict := eagle_reuse_conflict(PDPolicy.parse(self.pd_policy), self.eagle_reuse)
        ):
            raise OptionError("--eagle-reuse", conflict)
        if self.draft_model and not self.speculative_tokens:
            raise OptionError("--draft-model", "needs --speculative-tokens K (K >= 1)")
        if self.dtype not in DTYPES:
            raise OptionError("--dtype", f"choose from {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kv_load_failure not in KV_LOAD_FAILURE_POLICIES:
            raise OptionError(
                "--kv-load-failure", f"choose from {', '.join(KV_LOAD_FAILURE_POLICIES)}"
            )
        if self.sibling_reach < 0:
            raise OptionError("--sibling-reach", f"must be >= 0, got {self.sibling_reach}")
        if self.max_local_prefill_tokens < 1:
            raise OptionError(
                "--max-local-prefill-tokens", f"must be >= 1, got {self.max_local_prefill_tokens}"
            )
        if not self.kv_lease_seconds > 0:
            raise OptionError("--kv-lease-seconds", f"must be > 0, got {self.kv_lease_seconds}")
        if self.kv_offloading_size is not None and not self.kv_offloading_size > 0:
            raise OptionError(
                "--kv-offloading-size", f"must be > 0 GiB, got {self.kv_offloading_size}"
            )
        if self.kv_offloading_interval is not None and self.kv_offloading_interval < 1:
            raise OptionError(
                "--kv-offloading-interval", f"must be >= 1, got {self.kv_offloading_interval}"
            )
        self._check_store()

    def _check_store(self) -> None:
        """`--kv-offloading-backend mooncake` needs a master and the cluster secret; a master
        without that backend is a mistake."""
        mooncake = self.kv_offloading_backend == "mooncake"
        if self.kv_store_master is not None and not mooncake:
            raise OptionError(
                "--kv-store-master", "is the master of --kv-offloading-backend mooncake only"
            )
        if not mooncake:
            return
        if self.kv_offloading_size is None:
            raise OptionError(
                "--kv-offloading-backend",
                "mooncake needs --kv-offloading-size GIB (the memory this engine lends the store)",
            )
        host, _, port = (self.kv_store_master or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(
                "--kv-store-master",
                f"give the Mooncake Store master as HOST:PORT, got {self.kv_store_master!r}",
            )
        if not self.kv_secret_file:
            raise OptionError(
                "--kv-secret-file",
                "--kv-offloading-backend mooncake names and tags the store's objects with the "
                "cluster secret (a 0600 file; `relaykv up` makes one; docs/security.md)",
            )


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="tiny-hybrid (default, embedded), a preset (gemma3-270m, smollm2-135m), "
        "a Hugging Face model directory or a .gguf file",
    )
    model.add_argument("--dtype", choices=DTYPES, default="float32", help="runtime dtype")
    model.add_argument(
        "--speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="draft tokens proposed per step (EAGLE); needs --draft-model",
    )
    model.add_argument(
        "--draft-model",
        default=None,
        metavar="PATH|random",
        help="EAGLE draft: a checkpoint directory, or 'random' (seeded random weights); "
        "tiny-hybrid and gemma3-270m default to their built-in distilled drafts",
    )
    model.add_argument(
        "--eagle-reuse",
        choices=EAGLE_REUSE_ENGINE,
        default="drop",
        help="with a draft, a prefix hit either stops one block before the shared prefix "
        "ends (drop, vLLM's rule; the default) or reuses all of it and computes its last "
        "position again (recompute) (docs/design.md §4)",
    )
    model.add_argument("--seed", type=int, default=None, help="sampling / random-draft seed")
    cache = parser.add_argument_group("KV cache and scheduling")
    cache.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help=f"prompt + output tokens per request (default min({DEFAULT_MAX_MODEL_LEN}, the "
        "model's limit))",
    )
    pool = cache.add_mutually_exclusive_group()
    pool.add_argument(
        "--kv-cache-memory",
        type=_size,
        default=None,
        metavar="SIZE",
        help=f"host memory for KV pages, e.g. 512MiB, 2GiB (default "
        f"{format_bytes(DEFAULT_KV_CACHE_MEMORY)}); blocks = SIZE // block_bytes",
    )
    pool.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    cache.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    cache.add_argument("--retention", default=AUTO_RETENTION, help=ENGINE_RETENTION_HELP)
    cache.add_argument("--max-num-batched-tokens", type=int, default=2048)
    cache.add_argument("--max-num-seqs", type=int, default=64)
    tier = parser.add_argument_group("KV tier (docs/tier.md)")
    tier.add_argument(
        "--kv-offloading-size",
        type=float,
        default=None,
        metavar="GIB",
        help="GiB of KV tier below the pool (vLLM's flag); blocks the pool lets go are kept "
        "there and loaded back on a hit (default: no tier)",
    )
    tier.add_argument(
        "--kv-offloading-backend",
        default="native",
        help="where the tier lives: native (host memory of this engine; default) or "
        "mooncake (a Mooncake Store the cluster's engines share; needs --kv-store-master)",
    )
    tier.add_argument(
        "--kv-store-master",
        default=None,
        metavar="HOST:PORT",
        help="the Mooncake Store master of --kv-offloading-backend mooncake "
        "(`relaykv up --kv-offloading-backend mooncake` starts one)",
    )
    tier.add_argument(
        "--kv-offloading-interval",
        type=int,
        default=None,
        metavar="N",
        help="tokens between the tier's sliding-window checkpoints, a multiple of the "
        "alignment (default: the retention interval, else the alignment)",
    )
    cache.add_argument(
        "--no-prefix-caching",
        dest="enable_prefix_caching",
        action="store_false",
        help="turn the prefix cache off (cached_tokens is then always 0)",
    )


def add_pd_arguments(parser: argparse.ArgumentParser) -> None:
    """P/D flags (docs/pd.md); colocated defaults. See the module docstring."""
    from relaykv.transfer.transport.registry import add_transport_arguments

    pd = parser.add_argument_group("P/D disaggregation")
    pd.add_argument(
        "--role",
        choices=ROLES,
        default=Role.COLOCATED.value,
        help="colocated (default), or prefill / decode engine of a P/D pair",
    )
    pd.add_argument(
        "--pd-policy",
        choices=PD_POLICIES,
        default=DEFAULT_PD_POLICY.value,
        help="which KV blocks move from P to D (docs/design.md §7)",
    )
    pd.add_argument(
        "--kv-lease-seconds",
        type=float,
        default=30.0,
        help="P frees held blocks D has not read after this long",
    )
    pd.add_argument(
        "--kv-load-failure",
        choices=KV_LOAD_FAILURE_POLICIES,
        default="recompute",
        help="D: recompute a failed load locally, or fail the request",
    )
    pd.add_argument(
        "--sibling-reach",
        type=int,
        default=0,
        metavar="TOKENS",
        help="P and D: D also receives the windows of the last TOKENS prompt positions, so it "
        "can prefill siblings of a received prompt itself (conditional disaggregation, "
        "docs/routing.md; every engine of a cluster must use the same value; default 0)",
    )
    pd.add_argument(
        "--max-local-prefill-tokens",
        type=int,
        default=DEFAULT_MAX_LOCAL_PREFILL_TOKENS,
        metavar="TOKENS",
        help="D: prompt tokens it computes itself per step (requests the router sends without "
        f"KV, failed loads), chunked so running streams stay fast (default "
        f"{DEFAULT_MAX_LOCAL_PREFILL_TOKENS})",
    )
    add_transport_arguments(parser)


def engine_options(args: argparse.Namespace, **extra: Any) -> EngineOptions:
    """`EngineOptions` from parsed arguments (plus `extra` fields); raises `OptionError`."""
    options = EngineOptions(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        kv_cache_memory=args.kv_cache_memory,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        retention=args.retention,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        speculative_tokens=args.speculative_tokens,
        draft_model=args.draft_model,
        eagle_reuse=args.eagle_reuse,
        seed=args.seed,
        enable_prefix_caching=args.enable_prefix_caching,
        served_model_name=getattr(args, "served_model_name", None),
        kv_offloading_size=args.kv_offloading_size,
        kv_offloading_backend=args.kv_offloading_backend,
        kv_offloading_interval=args.kv_offloading_interval,
        kv_store_master=getattr(args, "kv_store_master", None),
        kv_secret_file=getattr(args, "kv_secret_file", None),
        **_pd_fields(args),
        **extra,
    )
    options.check()
    return options


def _pd_fields(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "role", "pd_policy", "kv_transport", "kv_lease_seconds", "kv_load_failure",
        "sibling_reach", "max_local_prefill_tokens",
    )
    return {name: getattr(args, name) for name in names if hasattr(args, name)}
