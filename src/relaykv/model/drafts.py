"""The EAGLE drafts shipped with relaykv, by preset name.

`relaykv distill-draft --model NAME` builds a preset's draft on the real engine
(`relaykv.distill`, docs/model.md "Distilling a draft"); its result is committed under
`draft_weights/NAME/` (an EAGLE checkpoint in float16) so that `--speculative-tokens K`
works on that preset with no training on a fresh clone and the same draft on every
machine. `default_draft` loads it in the runtime dtype.
"""

from __future__ import annotations

from pathlib import Path

import torch

from relaykv.model.config import ModelConfig
from relaykv.model.eagle import EagleDraft, load_eagle_checkpoint

DRAFT_WEIGHTS = Path(__file__).parent / "draft_weights"


class NoDefaultDraft(LookupError):
    """The model has no shipped draft: give an EAGLE checkpoint directory instead."""


def shipped_draft_dir(name: str) -> Path | None:
    path = DRAFT_WEIGHTS / name
    return path if (path / "model.safetensors").is_file() else None


def has_default_draft(name: str) -> bool:
    return shipped_draft_dir(name) is not None


def default_draft(name: str, config: ModelConfig, dtype: torch.dtype = torch.float32) -> EagleDraft:
    """The shipped draft of preset `name`, in `dtype`; `NoDefaultDraft` if it has none."""
    path = shipped_draft_dir(name)
    if path is None:
        shipped = sorted(p.name for p in DRAFT_WEIGHTS.iterdir()) if DRAFT_WEIGHTS.is_dir() else []
        raise NoDefaultDraft(
            f"model {name} has no built-in EAGLE draft (built-in: {', '.join(shipped) or 'none'}); "
            f"give an EAGLE checkpoint directory, e.g. one made by `relaykv distill-draft "
            f"--model {name} --out DIR`"
        )
    return load_eagle_checkpoint(path, config, dtype)
