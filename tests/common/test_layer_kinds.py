"""HF config -> layer kinds: the one reading the model and the simulator share."""

from __future__ import annotations

from relaykv.common.layer_kinds import FULL, SLIDING, LayerKinds, layer_kinds

BASE = {"num_hidden_layers": 6}


def test_qwen3_slides_only_with_use_sliding_window_from_max_window_layers() -> None:
    raw = {**BASE, "model_type": "qwen3", "sliding_window": 32, "max_window_layers": 4}
    assert layer_kinds(raw) == LayerKinds((FULL,) * 6, None)
    on = layer_kinds({**raw, "use_sliding_window": True})
    assert on == LayerKinds((FULL,) * 4 + (SLIDING,) * 2, 32) and on.num_sliding == 2
    # Without max_window_layers no layer slides.
    del raw["max_window_layers"]
    assert layer_kinds({**raw, "use_sliding_window": True}).num_sliding == 0


def test_gemma3_pattern_defaults_to_five_sliding_to_one_full() -> None:
    raw = {**BASE, "model_type": "gemma3_text", "sliding_window": 512}
    assert layer_kinds(raw).types == (SLIDING,) * 5 + (FULL,)
    assert layer_kinds({**raw, "sliding_window_pattern": 2}).types == (SLIDING, FULL) * 3


def test_layer_types_win_unless_llama_or_mistral() -> None:
    listed = [SLIDING, FULL] * 3
    raw = {**BASE, "sliding_window": 8, "layer_types": listed}
    assert layer_kinds({**raw, "model_type": "gpt_oss"}) == LayerKinds(tuple(listed), 8)
    assert layer_kinds({**raw, "model_type": "mistral"}).types == (SLIDING,) * 6
    assert layer_kinds({**raw, "model_type": "llama"}) == LayerKinds((FULL,) * 6, None)


def test_other_types_use_a_pattern_else_slide_everywhere_and_no_window_means_full() -> None:
    assert layer_kinds({**BASE, "sliding_window": 8}).types == (SLIDING,) * 6
    assert layer_kinds({**BASE, "sliding_window": 8, "sliding_window_pattern": 3}).num_sliding == 4
    listed = [SLIDING] * 6
    assert layer_kinds({**BASE, "layer_types": listed}) == LayerKinds((FULL,) * 6, None)
