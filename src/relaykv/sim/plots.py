"""PNG plots of a simulated run (matplotlib, Agg backend), written next to the JSON.

One figure per run: left, the TTFT empirical CDF of every policy; right, D's local and
external hit tokens and P's local hit tokens per policy (what `bench ab` plots for real runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot_run(results: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        xs = np.sort(np.asarray(r["ttfts_ms"]))
        if len(xs):
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=r["pd_policy"])
    spread = [v for r in results for v in r["ttfts_ms"] if v > 0]
    if spread and max(spread) > 100 * min(spread):
        ax.set_xscale("log")  # cache hits and misses differ by orders of magnitude
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("TTFT distribution")
    names = [r["pd_policy"] for r in results]
    x = np.arange(len(names))
    series = (
        ("d_local_hit_tokens", "D local"),
        ("d_external_hit_tokens", "D external"),
        ("p_local_hit_tokens", "P local"),
    )
    for i, (key, label) in enumerate(series):
        bx.bar(x + (i - 1) * 0.27, [r[key] for r in results], 0.27, label=label)
    bx.set_xticks(x, names, rotation=15, fontsize=8)
    bx.set_ylabel("hit tokens")
    bx.set_title("prefix hits per policy")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
