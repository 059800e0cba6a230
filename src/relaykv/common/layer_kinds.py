"""A Hugging Face text config -> the attention kind of each layer and the window.

The one reading of `layer_types`, `sliding_window`, Gemma's `sliding_window_pattern` and
Qwen3's `use_sliding_window` / `max_window_layers`, shared by the model (`model/config.py`)
and the simulator (`sim/model_presets.py`), so a config the simulator is given gets the
layers the engine would build:

* `llama`: every layer full (no window); `mistral`: one window on every layer;
* otherwise `layer_types` when the config lists them;
* Gemma-3 (`gemma3`, `gemma3_text`): every `sliding_window_pattern`-th layer full (default
  6: 5 sliding : 1 full);
* Qwen3: a window only with `use_sliding_window`, and then only on the layers from
  `max_window_layers` on (default: none);
* any other model type: `sliding_window_pattern` when given, else one window on every layer;
* no window: every layer full (transformers treats a "sliding" layer without one as full).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FULL = "full_attention"
SLIDING = "sliding_attention"
GEMMA3 = ("gemma3", "gemma3_text")


@dataclass(frozen=True, slots=True)
class LayerKinds:
    """Each layer's type (`full_attention` or `sliding_attention`) and the window of the
    sliding ones (None when no layer slides)."""

    types: tuple[str, ...]
    window: int | None

    @property
    def num_sliding(self) -> int:
        return sum(1 for t in self.types if t == SLIDING)


def layer_kinds(config: Mapping[str, Any]) -> LayerKinds:
    """The layer kinds of an HF text config (the rules of the module docstring)."""
    model_type = config.get("model_type", "")
    n = int(config["num_hidden_layers"])
    window = config.get("sliding_window") or None
    if model_type == "qwen3" and not config.get("use_sliding_window", False):
        window = None
    types = config.get("layer_types")
    if model_type == "llama":
        window, types = None, [FULL] * n
    elif model_type == "mistral":
        types = [SLIDING] * n
    elif types is not None:
        pass
    elif model_type == "qwen3":
        start = int(config.get("max_window_layers", n))
        types = [SLIDING if i >= start else FULL for i in range(n)]
    elif model_type in GEMMA3 or "sliding_window_pattern" in config:
        pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
        types = [SLIDING if (i + 1) % int(pattern) else FULL for i in range(n)]
    else:
        types = [SLIDING] * n
    if not window:
        return LayerKinds((FULL,) * n, None)
    return LayerKinds(tuple(types), int(window))
