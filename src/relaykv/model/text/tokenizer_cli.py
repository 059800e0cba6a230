"""`relaykv tokenizer export --model NAME --out DIR`: a Hugging Face tokenizer directory.

Writes what `transformers.AutoTokenizer.from_pretrained(DIR)` loads offline
(`relaykv.model.text.tokenizer_export`): for `vllm bench serve --tokenizer DIR`, SGLang's
`bench_serving.py --tokenizer DIR`, or any tool that needs the served model's tokenizer.
`relaykv serve` writes the same directory into its cache at startup and prints its path.
"""

from __future__ import annotations

import argparse
import sys

from relaykv.model.presets import PRESET_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = sub.add_parser("export", help="write the model's tokenizer as a HF directory")
    export.add_argument(
        "--model",
        default="tiny-hybrid",
        help=f"{', '.join(PRESET_NAMES)}, a Hugging Face directory or a .gguf file",
    )
    export.add_argument("--out", required=True, help="the directory to write")


def run(args: argparse.Namespace) -> int:
    from relaykv.model import PackageNotInstalled, load_model
    from relaykv.model.text.served_text import chat_formatter, tokenizer_export
    from relaykv.model.text.tokenizer_export import ExportError, export_tokenizer

    try:
        loaded = load_model(args.model)
    except (PackageNotInstalled, ValueError, FileNotFoundError, KeyError) as exc:
        print(f"relaykv tokenizer: error: argument --model: {exc}", file=sys.stderr)
        return 2
    if loaded.tokenizer is None:
        print(f"relaykv tokenizer: error: {args.model} has no tokenizer", file=sys.stderr)
        return 1
    try:
        out = export_tokenizer(tokenizer_export(loaded, chat_formatter(loaded)), args.out)
    except (ExportError, OSError) as exc:
        print(f"relaykv tokenizer: error: {exc}", file=sys.stderr)
        return 1
    print(f"relaykv tokenizer: wrote {out} (tokenizer.json, tokenizer_config.json)")
    return 0
