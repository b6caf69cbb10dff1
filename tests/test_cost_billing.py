"""Billing rules of docs/algorithms.md §5.2 on hand-worked cases."""

import numpy as np
import pytest

from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
from elastune.planners.cost.pricing.billing import BillingRule
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.staging import Profile

PER_SECOND = BillingRule(quantum_s=1, min_charge_s=60)
HOURLY = BillingRule(quantum_s=3600, min_charge_s=3600)


@pytest.mark.parametrize(
    ("alive", "billed"),
    [
        (0.0, 60),  # requested and released at once: the minimum charge
        (0.2, 60),
        (59.0, 60),
        (60.0, 60),
        (60.4, 61),  # rounded up to the next whole second
        (61.3, 62),
        (1755.0, 1755),
        (1755.0 + 2e-10, 1755),  # float noise from summed durations is not a new second
        (1755.001, 1756),
    ],
)
def test_per_second_billing_rounds_up_with_a_minute_minimum(alive: float, billed: float) -> None:
    assert float(PER_SECOND.billed_seconds(alive)) == billed


@pytest.mark.parametrize(("alive", "billed"), [(1, 3600), (1200, 3600), (3600, 3600), (3601, 7200)])
def test_hourly_billing_charges_whole_hours(alive: float, billed: float) -> None:
    assert float(HOURLY.billed_seconds(alive)) == billed


def test_minute_quantum_without_minimum() -> None:
    rule = BillingRule(quantum_s=60, min_charge_s=0)
    assert rule.billed_seconds([0, 1, 60, 61]).tolist() == [0, 60, 60, 120]


def test_charge_is_price_times_billed_hours() -> None:
    # A p3.8xlarge for 29.25 minutes: 1755 s * 12.24 $/h.
    assert float(PER_SECOND.charge(12.24, 1755)) == pytest.approx(5.967)
    assert float(HOURLY.charge(12.24, 1755)) == pytest.approx(12.24)


def test_negative_time_alive_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        PER_SECOND.billed_seconds(-1)


def _one_node(starts: str, startup: float, seconds_per_unit: float, units: float) -> PlanSimulator:
    catalog = parse_catalog(
        {
            "instance_types": {
                "n1": {
                    "gpus": 1,
                    "gpu": "T4",
                    "price_per_hour": 3.6,  # one cent per 10 seconds
                    "startup": {"mean_s": startup},
                    "billing": {"quantum_s": 1, "min_charge_s": 60, "starts": starts},
                }
            }
        }
    )
    return PlanSimulator(catalog, Profile({1.0: seconds_per_unit}), samples=3)


def _single(units: float) -> AllocationPlan:
    return AllocationPlan(((StagePlan(0, 0, (GpuTier(1, 1.0, units),), "n1", 1),),))


def test_billing_from_request_includes_startup() -> None:
    # 180 s of startup + 600 s of training, billed from the request: 780 s at $3.60/h.
    outcome = _one_node("request", 180, 60, 10).run(_single(10))
    assert np.allclose(outcome.jct, 780)
    assert np.allclose(outcome.cost, 0.78)


def test_billing_from_running_excludes_startup() -> None:
    outcome = _one_node("running", 180, 60, 10).run(_single(10))
    assert np.allclose(outcome.jct, 780)
    assert np.allclose(outcome.cost, 0.60)


def test_short_job_pays_the_minimum_charge() -> None:
    # 10 s of training, no startup: billed 60 s.
    outcome = _one_node("request", 0, 1, 10).run(_single(10))
    assert np.allclose(outcome.jct, 10)
    assert np.allclose(outcome.cost, 0.06)
