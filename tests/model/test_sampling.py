"""Sampling transforms (top-k, top-p, temperature) against a direct reference, and seeds."""

from __future__ import annotations

import pytest
import torch

from relaykv.model import SamplingParams
from relaykv.model.sampling import GeneratorSource, mix_seed, probabilities, sample_from


def _reference(logits, temperature, top_k, top_p):
    probs = torch.softmax(logits / temperature, -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep = set(order[:top_k] if top_k else order)
    kept_order = [i for i in order if i in keep]
    mass = sum(probs[i] for i in kept_order)
    nucleus, acc = set(), 0.0
    for i in kept_order:  # nucleus within the top-k set, renormalized
        if acc >= top_p:
            break
        nucleus.add(i)
        acc += probs[i] / mass
    out = torch.tensor([probs[i] if i in nucleus else 0.0 for i in range(len(probs))])
    return out / out.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [
        (1.0, 0, 1.0),
        (0.5, 3, 1.0),
        (1.3, 0, 0.7),
        (0.8, 5, 0.5),
        (1.0, 1, 1.0),
        (2.0, 0, 0.01),
    ],
)
def test_probabilities_match_reference(temperature, top_k, top_p):
    logits = torch.randn(12, generator=torch.Generator().manual_seed(5)) * 2
    got = probabilities(logits, SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k))
    torch.testing.assert_close(
        got, _reference(logits, temperature, top_k, top_p), atol=1e-6, rtol=1e-5
    )


def test_seeded_generators_depend_only_on_seed_and_index():
    source = GeneratorSource()
    probs = torch.full((50,), 1 / 50)
    params = SamplingParams(temperature=1.0, seed=3)
    a = [sample_from(probs, source.for_token(params, i)) for i in range(20)]
    b = [sample_from(probs, GeneratorSource(seed=99).for_token(params, i)) for i in range(20)]
    assert a == b and len(set(a)) > 5
    assert mix_seed(3, 0) != mix_seed(3, 1) != mix_seed(4, 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1),
        dict(temperature=float("inf")),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(logprobs=-2),
        dict(seed=1 << 64),
    ],
)
def test_bad_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
