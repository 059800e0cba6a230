"""Arrival schedules: all at once, Poisson, gamma (vLLM's `get_request` rule)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from relaykv.common.workloads.arrivals import arrival_offsets, distribution_name


def test_infinite_rate_sends_everything_at_zero() -> None:
    assert arrival_offsets(5, math.inf) == [0.0] * 5
    assert arrival_offsets(0, 3.0) == []


def test_last_arrival_is_rescaled_to_n_over_rate() -> None:
    times = arrival_offsets(50, 10.0, seed=3)
    assert times[-1] == pytest.approx(5.0)
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert times == arrival_offsets(50, 10.0, seed=3)
    assert times != arrival_offsets(50, 10.0, seed=4)


def test_infinite_burstiness_is_evenly_spaced() -> None:
    assert arrival_offsets(4, 2.0, burstiness=math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_gap_variation_follows_the_gamma_shape(burstiness: float, cv: float) -> None:
    """Gamma(k) gaps have coefficient of variation 1/sqrt(k); rescaling keeps it."""
    gaps = np.diff([0.0, *arrival_offsets(20000, 50.0, burstiness, seed=1)])
    assert np.mean(gaps) == pytest.approx(1 / 50, rel=1e-9)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(cv, rel=0.05)


def test_bad_rate_or_burstiness() -> None:
    with pytest.raises(ValueError, match="--request-rate"):
        arrival_offsets(3, 0.0)
    with pytest.raises(ValueError, match="--burstiness"):
        arrival_offsets(3, 1.0, burstiness=0.0)


def test_distribution_names() -> None:
    assert distribution_name(1.0) == "Poisson process"
    assert distribution_name(2.0) == "Gamma distribution"
