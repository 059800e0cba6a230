"""`cache-probe --engine vllm`: the probe through vLLM 0.33's scheduler (docs/vllm.md).

vLLM lives in its own venv (tools/vllm_venv.sh: vLLM `--no-deps` over relaykv's CPU torch),
and nothing of relaykv outside `relaykv/vllm/` imports it, so this module runs `python -m
relaykv.vllm.probe` with the same arguments in that venv and passes its output through.

The venv is found in this order: `$RELAYKV_VLLM_PYTHON` (an interpreter), `$RELAYKV_VLLM_VENV`,
`.venv-vllm` in the working directory, then `.venv-vllm` beside relaykv's source tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

VENV_DIR = ".venv-vllm"
INSTALL = "tools/vllm_venv.sh (vLLM 0.33.0 --no-deps in .venv-vllm, reusing the CPU torch)"


def vllm_python() -> str | None:
    """The interpreter of the vLLM venv, or None when there is none."""
    explicit = os.environ.get("RELAYKV_VLLM_PYTHON")
    if explicit:
        return explicit if Path(explicit).exists() else None
    candidates = []
    if os.environ.get("RELAYKV_VLLM_VENV"):
        candidates.append(Path(os.environ["RELAYKV_VLLM_VENV"]))
    candidates.append(Path.cwd() / VENV_DIR)
    candidates.append(Path(__file__).resolve().parents[3] / VENV_DIR)  # a source checkout
    for venv in candidates:
        python = venv / "bin" / "python"
        if python.exists():
            return str(python)
    return None


def forwarded_args(args: argparse.Namespace) -> list[str]:
    """The parsed `cache-probe` arguments as the vLLM probe's command line."""
    out = ["--preset", args.preset] if args.preset else []
    if args.groups:
        out = ["--groups", args.groups]
    if args.draft is not None:
        out += ["--draft", args.draft]
    out += ["--eagle-reuse", args.eagle_reuse, "--retention", args.retention]
    out += ["--pd-policy", args.pd_policy, "--prompt-len", str(args.prompt_len)]
    out += ["--extension-len", str(args.extension_len)]
    out += ["--sibling-diverge", str(args.sibling_diverge), "--seed", str(args.seed)]
    return out + (["--json"] if args.json else [])


def run_vllm_probe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    python = vllm_python()
    if python is None:
        parser.error(f"argument --engine: vllm needs vLLM 0.33.0; install it with {INSTALL}")
    src = str(Path(__file__).resolve().parents[2])  # the relaykv this command runs
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [python, "-m", "relaykv.vllm.probe", *forwarded_args(args)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
    return done.returncode
