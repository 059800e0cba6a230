"""Prepacked CPU linears: same results as `F.linear`, and the pack is used only when valid."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relaykv.model.packed_linear import (
    PACKED_MIN_ROWS,
    Linear,
    packing_available,
    prepack_linears,
)

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu")), reason="this torch build has no oneDNN packing"
)


def _layer(bias: bool = True, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    layer = Linear(96, 160, bias=bias)
    with torch.no_grad():
        layer.weight.normal_()
        if layer.bias is not None:
            layer.bias.normal_()
    return layer


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, PACKED_MIN_ROWS - 1, PACKED_MIN_ROWS, 65, 300])
def test_packed_matches_linear(bias: bool, rows: int) -> None:
    layer = _layer(bias)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        plain = layer(x)
        assert prepack_linears(layer) == 1
        packed = layer(x)
    ref = F.linear(x.double(), layer.weight.double(), None if not bias else layer.bias.double())
    torch.testing.assert_close(packed.double(), ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(packed, plain, atol=1e-4, rtol=1e-5)


def _with_foreign_pack(layer: Linear) -> Linear:
    """`layer` carrying the pack of another weight: shows which path `forward` took."""
    other = _layer(seed=1)
    other.prepack()
    layer.prepack()
    layer.packed = other.packed
    return layer


def test_forward_uses_the_pack_from_min_rows_on() -> None:
    layer = _with_foreign_pack(_layer())
    with torch.inference_mode():
        many, few = torch.randn(PACKED_MIN_ROWS, 96), torch.randn(PACKED_MIN_ROWS - 1, 96)
        wrong = F.linear(many, _layer(seed=1).weight, layer.bias)
        torch.testing.assert_close(layer(many), wrong, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(layer(few), F.linear(few, layer.weight, layer.bias))


def test_changed_weight_falls_back_to_f_linear() -> None:
    layer = _with_foreign_pack(_layer())
    x = torch.randn(32, 96)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place: _version moves
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    layer = _with_foreign_pack(_layer())
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone() * 3.0)  # a new tensor
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_autograd_uses_f_linear_and_trains() -> None:
    layer = _with_foreign_pack(_layer())
    x = torch.randn(32, 96)
    out = layer(x)  # grad on: never the pack (it has no backward)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    out.sum().backward()
    assert layer.weight.grad is not None


def test_state_dict_is_nn_linear_s() -> None:
    layer = _layer()
    layer.prepack()
    assert set(layer.state_dict()) == set(torch.nn.Linear(96, 160).state_dict())


def test_other_devices_are_not_packed() -> None:
    assert not packing_available(torch.device("meta"))
    with torch.device("meta"):
        layer = Linear(4, 4)
    assert prepack_linears(layer) == 0 and layer.packed is None


def test_runner_prepacks_and_scores_like_unpacked(tiny, tiny_draft) -> None:
    """The runner packs the target's projections and the draft's (and only those), and a
    prompt's logits equal the unpacked runner's up to summation order."""
    from relaykv.model import ModelRunner, SequenceWork, StepBatch

    from .conftest import TableMaker, random_tokens

    layers = [m for m in [*tiny.model.modules(), *tiny_draft.modules()] if isinstance(m, Linear)]
    for m in layers:  # the session's model may carry packs from earlier runners
        m.packed = None
    plain = ModelRunner(tiny.model, num_blocks=60, prepack_weights=False)
    assert layers and all(m.packed is None for m in layers)
    prompt = random_tokens(70, 259, seed=3)
    work = [SequenceWork("a", prompt, 0, TableMaker(plain).fresh(80))]
    want = plain.score(StepBatch(work))[0]
    packed = ModelRunner(tiny.model, num_blocks=60, draft=tiny_draft, num_speculative_tokens=2)
    assert all(m.packed is not None for m in layers)
    assert tiny.model.lm_head is None or not isinstance(tiny.model.lm_head, Linear)
    got = packed.score(StepBatch(work))[0]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
