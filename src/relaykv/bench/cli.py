"""`relaykv bench {serve,ab}`: the benchmark subcommands (one parser per sub-subcommand)."""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("relaykv.bench.serve.cli", "streaming load generator (vllm bench serve flags)"),
    "ab": ("relaykv.bench.ab.cli", "one workload on fresh clusters per configuration, A/B/A"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="{serve,ab}")
    for name, (module_name, help_) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        child = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(child)
        child.set_defaults(bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args.bench_run(args) or 0)
