"""The Gantt chart of a plan: a PNG for feasible and infeasible plans alike."""

from pathlib import Path

import pytest

from elastune.planners.cost import plan_job
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.cost.reports.gantt import draw_gantt
from elastune.planners.spec import parse_job

CATALOG = parse_catalog(
    {
        "defaults": {"startup": {"mean_s": 120}},
        "instance_types": {
            "x1": {"gpus": 1, "gpu": "T4", "price_per_hour": 0.5},
            "x4": {"gpus": 4, "gpu": "T4", "price_per_hour": 2.4},
        },
    }
)


@pytest.mark.parametrize(
    ("scheduler", "budget"),
    [
        ({"name": "hyperband", "min_resource": 1, "max_resource": 9}, {"deadline": "1h"}),
        ({"name": "sha", "min_resource": 1, "max_resource": 9}, {"deadline": "2m"}),
    ],
)
def test_draws_a_png(tmp_path: Path, scheduler: dict, budget: dict) -> None:
    spec = parse_job(
        {
            "name": "d",
            "trainable": "m:f",
            "metric": "acc",
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "scheduler": scheduler,
            "budget": {**budget, "max_cost_usd": 30},
            "profile": {"seconds_per_unit": {1: 60}, "speedup": {2: 1.8, 4: 3.2}},
        }
    )
    report = plan_job(spec, catalog=CATALOG)
    path = draw_gantt(report, tmp_path / "plan.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert report.trace is not None and len(report.trace.segments) == sum(
        a.trials for a in report.allocations
    )
