"""PNG plots of an A/B/A run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _run_name(run: dict[str, Any]) -> str:
    return f"{run['label']} ({run['config']})"


def plot_ttft_distribution(runs: list[dict[str, Any]], path: Path) -> Path:
    """One panel per workload group: the TTFT empirical CDF of every run."""
    plt = _pyplot()
    groups = list(dict.fromkeys(g["group"] for run in runs for g in run["groups"]))
    fig, axes = plt.subplots(
        1, max(1, len(groups)), figsize=(5 * max(1, len(groups)), 4), squeeze=False
    )
    for ax, group in zip(axes[0], groups, strict=False):
        for run in runs:
            ttfts: list[float] = next(
                (g["ttfts_ms"] for g in run["groups"] if g["group"] == group), []
            )
            if ttfts:
                xs = np.sort(np.asarray(ttfts))
                ys = np.arange(1, len(xs) + 1) / len(xs)
                ax.step(xs, ys, where="post", label=_run_name(run))
        ax.set_title(f"TTFT, {group}")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _phases(runs: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for run in runs:
        for phase in (run.get("probe") or {}).get("phases", []):
            names.append(f"probe/{phase['name']}")
        names += [g["group"] for g in run["groups"]]
    return list(dict.fromkeys(names))


def _phase_value(run: dict[str, Any], phase: str, role: str, key: str) -> float:
    if phase.startswith("probe/"):
        for p in (run.get("probe") or {}).get("phases", []):
            if f"probe/{p['name']}" == phase and role == "decode":
                return float(p.get(key, 0))
        return 0.0
    for g in run["groups"]:
        if g["group"] == phase:
            return float(g.get("counters", {}).get(role, {}).get(key) or 0)
    return 0.0


def _grouped_bars(ax, runs, phases, role: str, key: str, title: str) -> None:
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(phases))
    for i, run in enumerate(runs):
        values = [_phase_value(run, p, role, key) for p in phases]
        ax.bar(x + i * width - 0.4 + width / 2, values, width, label=_run_name(run))
    ax.set_xticks(x, phases, rotation=20, ha="right", fontsize=8)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def plot_hit_tokens(runs: list[dict[str, Any]], path: Path) -> Path:
    """Decode local and external hit tokens, and prefill local hits, per phase and run."""
    plt = _pyplot()
    phases = _phases(runs)
    fig, axes = plt.subplots(3, 1, figsize=(max(6, 1.6 * len(phases) * len(runs) / 2 + 4), 10))
    _grouped_bars(axes[0], runs, phases, "decode", "local_hit_tokens", "D local hit tokens")
    _grouped_bars(axes[1], runs, phases, "decode", "external_hit_tokens", "D external hit tokens")
    _grouped_bars(axes[2], runs, phases, "prefill", "local_hit_tokens", "P local hit tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_kv_bytes(runs: list[dict[str, Any]], path: Path) -> Path:
    """KV bytes the decode engines received, per phase and run."""
    plt = _pyplot()
    phases = _phases(runs)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(phases) * len(runs) / 2 + 4), 4))
    _grouped_bars(ax, runs, phases, "decode", "kv_bytes_received", "KV bytes received by D")
    ax.set_ylabel("bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    return [
        plot_ttft_distribution(runs, out_dir / "ttft_distribution.png"),
        plot_hit_tokens(runs, out_dir / "hit_tokens.png"),
        plot_kv_bytes(runs, out_dir / "kv_bytes.png"),
    ]
