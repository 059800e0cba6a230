"""The `relaykv` command: a thin dispatcher.

Each subcommand lives in the layer that owns it and exposes `add_arguments(parser)` and
`run(args) -> int`. Only the chosen subcommand's module is imported, so `relaykv
cache-probe` never loads torch and `relaykv --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("relaykv.demo", "the showcase: cache-probe, then legacy vs per-group on P/D clusters"),
    "cache-probe": ("relaykv.cache_probe.cli", "what will my hit be? the cache alone, no model"),
    "bench": ("relaykv.bench.cli", "bench serve: load generator; bench ab: A/B/A runs"),
    "probe": ("relaykv.bench.probe.cli", "P/D prefix-cache probe: x+a, x+b; decode hit counters"),
    "distill-draft": (
        "relaykv.distill.cli",
        "train an EAGLE draft for a model on its own greedy text (resumable)",
    ),
    "generate": ("relaykv.generate.cli", "offline generation (tiny-hybrid by default)"),
    "router": ("relaykv.router.cli", "P/D router in front of prefill and decode engines"),
    "serve": ("relaykv.serve.cli", "OpenAI-compatible HTTP server (completions, chat, metrics)"),
    "up": ("relaykv.launch.cli", "a local P/D cluster: prefill + decode engines and a router"),
    "tokenizer": ("relaykv.model.text.tokenizer_cli", "tokenizer export: a HF tokenizer directory"),
    "sim": ("relaykv.sim.cli", "cluster simulator: the real scheduler and cache on a cost model"),
}


class CliParser(argparse.ArgumentParser):
    """argparse with one-line errors that name the flag, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _top_parser() -> CliParser:
    parser = CliParser(prog="relaykv", description="relaykv: hybrid-attention LLM serving")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("command", nargs="?", choices=sorted(COMMANDS), metavar="COMMAND")
    parser.epilog = "commands:\n" + "\n".join(
        f"  {name:<14} {help_}" for name, (_, help_) in sorted(COMMANDS.items())
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        top = _top_parser()
        args = top.parse_args(argv[:1])
        if args.version:
            from relaykv import __version__

            print(__version__)
            return 0
        top.print_help()
        return 0 if not argv else 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(COMMANDS[name][0])
    parser = CliParser(prog=f"relaykv {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    if getattr(module, "FORWARDS_UNKNOWN_FLAGS", False):
        # e.g. `relaykv up` hands the flags it does not know to the engines it starts.
        args, extra = parser.parse_known_args(rest)
        args._extra = extra
    else:
        args = parser.parse_args(rest)
    # A subcommand that validates values after parsing takes the parser too, so its errors
    # use the same one-line format naming the flag.
    if module.run.__code__.co_argcount >= 2:
        return int(module.run(args, parser) or 0)
    return int(module.run(args) or 0)
