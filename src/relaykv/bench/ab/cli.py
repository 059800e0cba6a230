"""`relaykv bench ab`: one workload on a fresh cluster per configuration, A/B/A order.

Each run starts `<up-cmd> --json <config flags>` (default `relaykv up`), reads its JSON line
for the router and engine URLs, optionally runs the probe, runs every workload group while
reading the engines' counters before and after, then stops the cluster (SIGTERM, wait).
Writes ab_runs.json (everything), ab_table.md/.json, PNG plots, per-group vLLM-style result
JSONs under results/, and each cluster's log.

With `--front-cmd`, each run also starts a production router (vllm-router, ...) over the
cluster's engines and sends the workload through it instead of relaykv's router; the
engines' counters are read the same way (`relaykv.bench.ab.front`, docs/pd.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import string
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from relaykv.bench.ab.cluster import ClusterProcess, ClusterStartError
from relaykv.bench.ab.front import FrontProcess, check_template
from relaykv.bench.ab.plots import write_plots
from relaykv.bench.ab.report import build_rows, markdown_table, write_tables
from relaykv.bench.ab.workload import (
    DEFAULT_GROUPS,
    Workload,
    count_differing_outputs,
    parse_group,
    run_group,
    run_group_interleaved,
)
from relaykv.bench.client import ApiTarget
from relaykv.bench.engine_counters import ClusterUrls
from relaykv.bench.probe.run import probe_prompts, run_probe
from relaykv.bench.server_info import ServerError, fetch_served_model
from relaykv.common.workloads import DatasetError

PROG = "relaykv bench ab"
DEFAULT_VOCAB_SIZE = 32000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--configs",
        nargs="+",
        required=True,
        metavar="NAME=FLAGS",
        help='named flag sets for `up`, e.g. legacy="--pd-policy legacy"; the '
        "first is the baseline (A), then B, C, ...",
    )
    parser.add_argument(
        "--order",
        default="A/B/A",
        help="runs by letter or config name, separated by / (default A/B/A)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="start every run's cluster at once and send each group in waves of its "
        "concurrency, one wave per run in turn (the first rotating): the runs share the "
        "host's minutes, so a slower stretch of a shared host slows them alike "
        "(docs/benchmarking.md, 'Interleaved runs')",
    )
    parser.add_argument(
        "--up-cmd",
        default="relaykv up",
        help="cluster command; `--json` and the config flags are appended",
    )
    parser.add_argument(
        "--front-cmd",
        default=None,
        metavar="TEMPLATE",
        help="a router to put in front of each cluster's engines, e.g. 'vllm-router "
        "--vllm-pd-disaggregation --prefill {prefill} --decode {decode} --port {port}'; "
        "the workload goes through it (see docs/pd.md)",
    )
    parser.add_argument(
        "--up-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the cluster's JSON line",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=60.0,
        help="seconds to wait after SIGTERM before SIGKILL",
    )
    parser.add_argument(
        "--groups",
        nargs="+",
        default=list(DEFAULT_GROUPS),
        metavar="cC/outputO:N",
        help="workload groups: concurrency C, output tokens O, N prompts (prefix_repetition; "
        "gsp:cC/outputO:N: generated-shared-prefix)",
    )
    parser.add_argument(
        "--prefix-len",
        type=int,
        default=8192,
        help="prefix_repetition prefix length (the upstream report, vLLM PR #56449, used 65504)",
    )
    parser.add_argument("--suffix-len", type=int, default=64)
    parser.add_argument("--num-prefixes", type=int, default=1)
    parser.add_argument("--num-warmups", type=int, default=1, help="warmups per group")
    parser.add_argument("--seed", type=int, default=0, help="group i uses seed + i")
    parser.add_argument(
        "--save-detailed",
        action="store_true",
        help="per-request arrays (start_times, ttfts, itls, ...) in results/*.json, as "
        "`bench serve --save-detailed`: which streams' gaps make a P99 ITL",
    )
    parser.add_argument("--probe", action="store_true", help="run the probe on each cluster first")
    parser.add_argument("--probe-prefix-len", type=int, default=8192)
    parser.add_argument("--probe-suffix-len", type=int, default=16)
    parser.add_argument("--model", default=None, help="default: the router's /v1/models")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help=f"default: /v1/models vocab_size, else {DEFAULT_VOCAB_SIZE}",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="let requests stop at EOS (default: ignore_eos, exact lengths)",
    )
    parser.add_argument("--request-timeout", type=float, default=6 * 60 * 60)
    parser.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds to wait after a probe phase before reading counters",
    )
    parser.add_argument(
        "--output-dir",
        default=None,
        help="default: bench-ab-YYYYmmdd-HHMMSS in the current directory",
    )
    parser.add_argument("--disable-tqdm", action="store_true")


def parse_configs(items: list[str]) -> dict[str, list[str]]:
    configs: dict[str, list[str]] = {}
    for item in items:
        name, sep, flags = item.partition("=")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"--configs: expected NAME=FLAGS with a plain name, got {item!r}")
        if name in configs:
            raise ValueError(f"--configs: {name!r} given twice")
        try:
            configs[name] = shlex.split(flags)
        except ValueError as exc:
            raise ValueError(f"--configs: cannot split the flags of {name!r}: {exc}") from None
    return configs


def parse_order(text: str, names: list[str]) -> list[str]:
    """`A/B/A` (letters index the configs) or config names -> config names per run."""
    plan = []
    for token in (t.strip() for t in re.split(r"[/,]", text)):
        if token in names:
            plan.append(token)
        elif len(token) == 1 and token in string.ascii_uppercase[: len(names)]:
            plan.append(names[string.ascii_uppercase.index(token)])
        else:
            raise ValueError(
                f"--order: {token!r} is neither a config letter "
                f"(A..{string.ascii_uppercase[len(names) - 1]}) nor a config name"
            )
    if len(plan) < 2:
        raise ValueError("--order: an A/B comparison needs at least two runs")
    return plan


def run_labels(plan: list[str], names: list[str]) -> list[str]:
    """A1, B1, A2, ...: the config's letter and its occurrence count."""
    seen: dict[str, int] = {}
    labels = []
    for config in plan:
        seen[config] = seen.get(config, 0) + 1
        labels.append(f"{string.ascii_uppercase[names.index(config)]}{seen[config]}")
    return labels


async def _measure(
    args: argparse.Namespace,
    cluster: ClusterUrls,
    workload: Workload,
    record: dict[str, Any],
    out_dir: Path,
    log: Callable[[str], None],
) -> None:
    served = None
    if args.model is None or args.vocab_size is None:
        served = await fetch_served_model(cluster.router)
    model = args.model or served.id  # type: ignore[union-attr]
    vocab = args.vocab_size or (served.vocab_size if served else None) or DEFAULT_VOCAB_SIZE
    target = ApiTarget(
        api_url=f"{cluster.router}/v1/completions",
        model=model,
        sampling={"temperature": args.temperature},
        ignore_eos=not args.no_ignore_eos,
        timeout_s=args.request_timeout,
    )
    record.update(model=model, vocab_size=vocab)
    label = record["label"]
    if args.probe:
        prompts = probe_prompts(args.probe_prefix_len, args.probe_suffix_len, vocab, args.seed)
        report = await run_probe(
            target,
            cluster.router,
            prompts,
            settle_s=args.settle,
            cluster=cluster,
            log=lambda m: log(f"{label} probe: {m}"),
        )
        record["probe"] = {**report.as_json(), "errors": report.errors}
    for index, group in enumerate(workload.groups):
        result = await run_group(
            target, cluster, workload, index, vocab, progress=not args.disable_tqdm, log=log
        )
        record["groups"].append(asdict(result))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", group.label)
        (out_dir / "results").mkdir(exist_ok=True)
        (out_dir / "results" / f"{label}-{name}.json").write_text(json.dumps(result.result))
        r = result.result
        log(
            f"{label} {group.label}: {r['completed']}/{r['completed'] + r['failed']} ok, "
            f"{r['request_throughput']:.3f} req/s, mean TTFT {r['mean_ttft_ms']:.1f} ms, "
            f"P99 TTFT {r['p99_ttft_ms']:.1f} ms"
        )
        for error in result.errors[:3]:
            log(f"{label} {group.label}: request failed: {error}")


def _prefixed(log: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda message: log(prefix + message)


async def _measure_interleaved(
    args: argparse.Namespace,
    urls: list[ClusterUrls],
    workload: Workload,
    records: list[dict[str, Any]],
    out_dir: Path,
    log: Callable[[str], None],
) -> None:
    """`--interleave`: the probe on each cluster in turn, then each group on all of them
    at once (`run_group_interleaved`)."""
    served = None
    if args.model is None or args.vocab_size is None:
        served = await fetch_served_model(urls[0].router)
    model = args.model or served.id  # type: ignore[union-attr]
    vocab = args.vocab_size or (served.vocab_size if served else None) or DEFAULT_VOCAB_SIZE
    targets = [
        ApiTarget(
            api_url=f"{u.router}/v1/completions",
            model=model,
            sampling={"temperature": args.temperature},
            ignore_eos=not args.no_ignore_eos,
            timeout_s=args.request_timeout,
        )
        for u in urls
    ]
    for record, target, cluster in zip(records, targets, urls, strict=True):
        record.update(model=model, vocab_size=vocab)
        if args.probe:
            prompts = probe_prompts(args.probe_prefix_len, args.probe_suffix_len, vocab, args.seed)
            report = await run_probe(
                target, cluster.router, prompts, settle_s=args.settle, cluster=cluster,
                log=_prefixed(log, f"{record['label']} probe: "),
            )
            record["probe"] = {**report.as_json(), "errors": report.errors}
    for index, group in enumerate(workload.groups):
        results = await run_group_interleaved(targets, urls, workload, index, vocab, log=log)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", group.label)
        (out_dir / "results").mkdir(exist_ok=True)
        for record, result in zip(records, results, strict=True):
            record["groups"].append(asdict(result))
            label, r = record["label"], result.result
            (out_dir / "results" / f"{label}-{name}.json").write_text(json.dumps(r))
            log(
                f"{label} {group.label}: {r['completed']}/{r['completed'] + r['failed']} ok, "
                f"{r['request_throughput']:.3f} req/s, mean TTFT {r['mean_ttft_ms']:.1f} ms, "
                f"P99 TTFT {r['p99_ttft_ms']:.1f} ms (interleaved)"
            )


def _run_interleaved(
    args: argparse.Namespace,
    configs: dict[str, list[str]],
    plan: list[str],
    labels: list[str],
    workload: Workload,
    out_dir: Path,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], int]:
    """Every run's cluster up at once, the workload interleaved, then every cluster
    stopped. Returns the run records and the exit status."""
    records: list[dict[str, Any]] = []
    clusters: list[ClusterProcess] = []
    urls: list[ClusterUrls] = []
    status = 0
    try:
        for i, (label, config) in enumerate(zip(labels, plan, strict=True), start=1):
            argv = [*shlex.split(args.up_cmd), "--json", *configs[config]]
            cluster = ClusterProcess(
                argv,
                out_dir / f"{label}-cluster.log",
                ready_timeout_s=args.up_timeout,
                stop_timeout_s=args.stop_timeout,
            )
            clusters.append(cluster)
            records.append({
                "label": label, "config": config, "flags": configs[config],
                "command": shlex.join(argv), "probe": None, "groups": [], "interleaved": True,
            })
            log(f"[{i}/{len(plan)}] {label} ({config}): starting `{cluster.command}`")
            urls.append(cluster.start())
            records[-1]["cluster"] = asdict(urls[-1])
            log(f"[{i}/{len(plan)}] {label}: cluster ready, router {urls[-1].router}")
        asyncio.run(_measure_interleaved(args, urls, workload, records, out_dir, log))
    except (ClusterStartError, ServerError) as exc:
        log(f"{PROG}: interleaved runs failed: {exc}")
        status = 1
    finally:
        for record, cluster in zip(records, clusters, strict=False):
            code = cluster.stop()
            log(f"{record['label']}: cluster stopped (exit status {code})")
    (out_dir / "ab_runs.json").write_text(json.dumps({"baseline": plan[0], "runs": records}))
    return records, status


def check_workload(args: argparse.Namespace, workload: Workload) -> None:
    """Reject bad workload flags before any cluster starts (raises ValueError)."""
    if args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if args.prefix_len < 0 or args.suffix_len < 0 or args.prefix_len + args.suffix_len == 0:
        raise ValueError("--prefix-len and --suffix-len must be >= 0 with a positive sum")
    if args.num_prefixes < 1:
        raise ValueError(f"--num-prefixes must be >= 1, got {args.num_prefixes}")
    for group in workload.groups:
        if group.num_prompts // args.num_prefixes == 0:
            raise ValueError(
                f"--groups: {group.label} has {group.num_prompts} prompts, fewer "
                f"than --num-prefixes {args.num_prefixes} (0 requests)"
            )
    if args.probe:
        probe_prompts(args.probe_prefix_len, args.probe_suffix_len, 2, 0)
    try:
        if not shlex.split(args.up_cmd):
            raise ValueError("--up-cmd is empty")
    except ValueError as exc:
        raise ValueError(f"--up-cmd: {exc}") from None
    if args.front_cmd is not None:
        if args.interleave:
            raise ValueError("--interleave does not take --front-cmd")
        check_template(args.front_cmd)
    if not (args.up_timeout > 0 and args.stop_timeout > 0 and args.request_timeout > 0):
        raise ValueError("--up-timeout, --stop-timeout and --request-timeout must be > 0")


def run(args: argparse.Namespace) -> int:
    def log(message: str) -> None:
        print(message, flush=True)

    try:
        configs = parse_configs(args.configs)
        names = list(configs)
        plan = parse_order(args.order, names)
        groups = tuple(parse_group(g) for g in args.groups)
        workload = Workload(
            groups=groups,
            prefix_len=args.prefix_len,
            suffix_len=args.suffix_len,
            num_prefixes=args.num_prefixes,
            num_warmups=args.num_warmups,
            seed=args.seed,
            detailed=args.save_detailed,
        )
        check_workload(args, workload)
    except (ValueError, DatasetError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    baseline = names[0]
    labels = run_labels(plan, names)
    out_dir = Path(args.output_dir or datetime.now().strftime("bench-ab-%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_text = " ".join(f"{lb}={c}" for lb, c in zip(labels, plan, strict=True))
    log(
        f"{PROG}: {len(plan)} runs ({runs_text}), "
        f"baseline {baseline}, groups {' '.join(g.label for g in groups)}, output {out_dir}"
    )
    runs: list[dict[str, Any]] = []
    status = 0
    if args.interleave:
        runs, status = _run_interleaved(args, configs, plan, labels, workload, out_dir, log)
    for i, (label, config) in enumerate(zip(labels, plan, strict=True), start=1):
        if args.interleave:
            break
        argv = [*shlex.split(args.up_cmd), "--json", *configs[config]]
        record: dict[str, Any] = {
            "label": label,
            "config": config,
            "flags": configs[config],
            "command": shlex.join(argv),
            "probe": None,
            "groups": [],
        }
        cluster = ClusterProcess(
            argv,
            out_dir / f"{label}-cluster.log",
            ready_timeout_s=args.up_timeout,
            stop_timeout_s=args.stop_timeout,
        )
        log(f"[{i}/{len(plan)}] {label} ({config}): starting `{cluster.command}`")
        front: FrontProcess | None = None
        try:
            urls = cluster.start()
            record["cluster"] = asdict(urls)
            log(
                f"[{i}/{len(plan)}] {label}: cluster ready, router {urls.router}, "
                f"{len(urls.prefill)} prefill, {len(urls.decode)} decode"
            )
            if args.front_cmd is not None:
                front = FrontProcess(
                    args.front_cmd,
                    urls,
                    out_dir / f"{label}-front.log",
                    ready_timeout_s=args.up_timeout,
                    stop_timeout_s=args.stop_timeout,
                )
                record["front"] = front.command
                urls = replace(urls, router=front.start())
                log(f"[{i}/{len(plan)}] {label}: front end ready at {urls.router}")
            asyncio.run(_measure(args, urls, workload, record, out_dir, log))
        except (ClusterStartError, ServerError) as exc:
            log(f"{PROG}: run {label} ({config}) failed: {exc}")
            status = 1
        finally:
            if front is not None:
                front.stop()
            code = cluster.stop()
            log(f"[{i}/{len(plan)}] {label}: cluster stopped (exit status {code})")
        runs.append(record)
        (out_dir / "ab_runs.json").write_text(json.dumps({"baseline": baseline, "runs": runs}))
        if status:
            break
    complete = [r for r in runs if r["groups"] or r["probe"]]
    count_differing_outputs(complete)
    (out_dir / "ab_runs.json").write_text(json.dumps({"baseline": baseline, "runs": runs}))
    if complete:
        rows = build_rows(complete, baseline)
        md, js = write_tables(rows, complete, baseline, out_dir)
        plots = write_plots(complete, out_dir)
        print(markdown_table(rows, complete, baseline))
        log(f"wrote {md}, {js}, " + ", ".join(str(p) for p in plots))
    return status
