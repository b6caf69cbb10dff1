"""The profile a job learns from its own segments (planners/cost/inflight/estimate.py;
docs/algorithms.md §5.8): pure, in milliseconds."""

from __future__ import annotations

import dataclasses
import math

import pytest

from elastune.planners.cost.inflight.estimate import ProfileEstimate, Running, _above
from elastune.planners.staging import Profile

PRIOR = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}, segment_cv=0.05)


def test_the_spread_is_read_with_the_segments_degrees_of_freedom() -> None:
    estimate = ProfileEstimate(PRIOR)
    assert estimate.profile().segment_cv_dof is None  # the prior's, taken as exact
    for seconds in (700.0, 760.0, 720.0):
        estimate.observe(1, 1.0, seconds)
    estimate.observe(2, 1.0, 400.0)  # alone at its width: no spread to read
    assert estimate.spread_dof() == 2 + 1  # around their width's ratio, and the prior's one
    assert estimate.profile().segment_cv_dof == 3


def test_the_estimate_is_the_prior_until_a_segment_is_measured() -> None:
    estimate = ProfileEstimate(PRIOR)
    assert estimate.profile() == PRIOR
    estimate.observe(1, 0.0, 500.0)  # trains nothing: says nothing
    assert estimate.segments == 0


def test_measured_segments_take_over_the_calibrations_error_in_the_unit_time() -> None:
    cov = [[0.04, 0.01, 0.0, -0.002], [0.01, 0.01, 0.0, 0.001]]
    cov += [[0.0, 0.0, 0.02, 0.0], [-0.002, 0.001, 0.0, 0.0025]]
    estimate = ProfileEstimate(dataclasses.replace(PRIOR, calibration_cov=cov))
    assert estimate.profile().calibration_cov == tuple(map(tuple, cov))
    for seconds in (1400.0, 1480.0, 1420.0, 1460.0):
        estimate.observe(1, 1.0, seconds)
    after = estimate.profile().calibration_cov
    assert after is not None and after[3][:3] == (0.0,) * 3
    assert [row[3] for row in after[:3]] == [0.0] * 3
    # The unit time is now as uncertain as the mean of the segments measured: four steady
    # ones know it better than the calibration did.
    known = estimate.spread() ** 2 / (4 + estimate.pseudo_segments())
    assert after[3][3] == pytest.approx(known) and 0 < known < 0.0025
    assert [row[:3] for row in after[:3]] == [tuple(row[:3]) for row in cov[:3]]  # overheads


def test_a_profile_without_a_calibration_learns_how_sure_its_unit_time_is() -> None:
    estimate = ProfileEstimate(PRIOR)  # no calibration_cov: the unit time taken as exact
    estimate.observe(1, 1.0, 1440.0)
    one = estimate.profile().calibration_cov
    for seconds in (1400.0, 1480.0, 1420.0, 1460.0, 1440.0, 1400.0, 1480.0):
        estimate.observe(1, 1.0, seconds)
    eight = estimate.profile().calibration_cov
    assert one is not None and eight is not None
    assert [v for row in one for v in row].count(0.0) == 15  # only the unit time's variance
    assert one[3][3] > eight[3][3] > 0  # more segments, surer


def test_measured_segments_scale_their_width_and_the_pooled_ratio_the_others() -> None:
    estimate = ProfileEstimate(PRIOR, prior_weight=1.0)
    for seconds in (1400.0, 1480.0, 1440.0, 1440.0):
        estimate.observe(1, 1.0, seconds)
    weight = estimate.pseudo_segments()
    assert weight == pytest.approx((estimate.spread() / 0.5) ** 2)
    assert estimate.ratio(1) == pytest.approx((4 * 2.0 + weight * estimate.pooled()) / (4 + weight))
    assert estimate.pooled() == pytest.approx((4 * 2.0 + weight) / (4 + weight))
    assert estimate.ratio(4) == estimate.pooled()
    updated = estimate.profile()
    assert updated.timing(1).mean == pytest.approx(720 * estimate.ratio(1))
    assert updated.timing(4).mean == pytest.approx(225 * estimate.pooled())
    # The spread of the four around their mean (sd 0.0163 relative), mixed with the prior.
    assert 0.02 < estimate.spread() < 0.05


def test_scattered_segments_move_the_estimate_less_than_steady_ones() -> None:
    steady, scattered = ProfileEstimate(PRIOR), ProfileEstimate(PRIOR)
    for low, high in ((1420.0, 1460.0), (1430.0, 1450.0)):
        steady.observe(1, 1.0, low)
        steady.observe(1, 1.0, high)
    for low, high in ((700.0, 2180.0), (1000.0, 1880.0)):
        scattered.observe(1, 1.0, low)
        scattered.observe(1, 1.0, high)
    # Both measured twice the prior's seconds on average; the prior (off by up to half)
    # weighs nearly nothing against the steady ones.
    assert steady.pseudo_segments() < 0.05 < 0.5 < scattered.pseudo_segments()
    assert steady.ratio(1) == pytest.approx(2.0, abs=0.01)
    assert scattered.ratio(1) < steady.ratio(1) - 0.02


def test_the_overhead_is_not_counted_as_work() -> None:
    prior = Profile({1: 100.0}, overhead_s=20.0)
    estimate = ProfileEstimate(prior, prior_weight=1e-9)
    estimate.observe(1, 2.0, 220.0)
    assert estimate.ratio(1) == pytest.approx(1.0)


def test_segments_shorter_than_the_overhead_leave_the_spread_at_the_prior() -> None:
    # Found by a real planned run: segments that end within profile.overhead_s measure no
    # work at all, and their spread must not divide by that zero.
    prior = Profile({1: 0.05}, overhead_s=0.2)
    estimate = ProfileEstimate(prior)
    for seconds in (0.1, 0.15, 0.2):
        estimate.observe(1, 1.0, seconds)
    assert estimate.spread() == prior.segment_cv
    assert estimate.profile().timing(1).mean > 0


def test_segments_still_running_count_as_they_will_likely_end() -> None:
    # The first segments to finish are the fast ones: those still running say the stage is
    # slower than the finished alone read.
    estimate = ProfileEstimate(PRIOR)
    for seconds in (700.0, 720.0, 740.0, 720.0):
        estimate.observe(1, 1.0, seconds)
    slow = estimate.censored([Running(1, 1.0, 1000.0), Running(1, 1.0, 1000.0)])
    assert estimate.ratio(1) == pytest.approx(1.0, abs=0.02)
    assert slow.ratio(1) > 1.1 and slow.spread() > estimate.spread()
    assert slow.segments == estimate.segments == 4  # the unit time's certainty: finished only
    # A segment that has run a few seconds says almost nothing; none, nothing.
    just_begun = estimate.censored([Running(1, 1.0, 10.0)])
    assert just_begun.ratio(1) == pytest.approx(estimate.ratio(1), abs=0.01)
    assert estimate.censored([]) is estimate


def test_a_normal_above_a_bound_has_the_truncated_moments() -> None:
    mean, variance = _above(0.0, 1.0, 0.0)  # the half-normal's
    assert mean == pytest.approx(math.sqrt(2 / math.pi))
    assert variance == pytest.approx(1 - 2 / math.pi)
    far, _ = _above(0.0, 1.0, 50.0)  # the tail underflows: its asymptote
    assert far == pytest.approx(50.02, abs=0.01)
    assert _above(1.0, 0.0, 3.0) == (3.0, 0.0)
