"""The EAGLE drafts shipped with relaykv, by preset name.

`relaykv distill-draft --model NAME` builds a preset's draft from the target's own text
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
    if not name or Path(name).name != name or name.startswith("."):
        return None  # a path (an HF directory, a .gguf file): no shipped draft
    path = DRAFT_WEIGHTS / name
    return path if (path / "model.safetensors").is_file() else None


def has_default_draft(name: str) -> bool:
    return shipped_draft_dir(name) is not None


def shipped_drafts() -> list[str]:
    """Names of the presets that ship a draft."""
    if not DRAFT_WEIGHTS.is_dir():
        return []
    return sorted(p.name for p in DRAFT_WEIGHTS.iterdir() if shipped_draft_dir(p.name))


def default_draft(name: str, config: ModelConfig, dtype: torch.dtype = torch.float32) -> EagleDraft:
    """The shipped draft of preset `name`, in `dtype`; `NoDefaultDraft` if it has none."""
    path = shipped_draft_dir(name)
    if path is None:
        shipped = ", ".join(shipped_drafts()) or "none"
        raise NoDefaultDraft(
            f"model {name} has no built-in EAGLE draft (built-in: {shipped}); give "
            f"--draft-model PATH (an EAGLE checkpoint directory, e.g. one made by `relaykv "
            f"distill-draft --model {name} --out DIR`) or --draft-model random"
        )
    return load_eagle_checkpoint(path, config, dtype)
