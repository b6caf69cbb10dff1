"""plan_job: a job file in, a priced plan with baselines out; infeasible input named."""

import json

import pytest

from elastune.planners.cost import InfeasibleError, plan_job
from elastune.planners.cost.inflight.recourse import first_options
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.staging import Profile

CATALOG = parse_catalog(
    {
        "defaults": {"startup": {"mean_s": 120, "sd_s": 30}, "queueing": {"mean_s": 10}},
        "instance_types": {
            "x1": {"gpus": 1, "gpu": "T4", "price_per_hour": 0.5},
            "x4": {"gpus": 4, "gpu": "T4", "price_per_hour": 2.4},
        },
    }
)
JOB = {
    "name": "d",
    "trainable": "m:f",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
    "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
    "compute": {"instance_types": ["x1", "x4"], "max_gpus": 16},
    "profile": {"seconds_per_unit": {1: 300}, "speedup": {2: 1.8, 4: 3.2}, "segment_cv": 0.05},
}


def job(**changes: object):
    return parse_job({**JOB, **changes})


def test_report_fields_and_json() -> None:
    report = plan_job(job(budget={"deadline": "3h", "max_cost_usd": 50}), catalog=CATALOG)
    assert report.feasible
    data = json.loads(json.dumps(report.to_dict()))
    assert data["planner"] == "rubberband" and data["feasible"] and data["problems"] == []
    assert set(data["jct_s"]) == set(data["cost_usd"]) == {"p50", "p95", "mean"}
    assert data["jct_s"]["p95"] <= 3 * 3600 and data["cost_usd"]["p95"] <= 50
    assert [s["trials"] for s in data["stages"]] == [9, 3, 1]
    for stage in data["stages"]:
        assert set(stage) >= {
            "bracket", "rung", "trials", "resource", "gpus_per_trial", "instance_type",
            "instances", "concurrent", "start_s", "end_s", "cost_usd",
        }  # fmt: skip
        assert stage["instance_type"] in {"x1", "x4"} and stage["start_s"] < stage["end_s"]
    assert sum(s["cost_usd"] for s in data["stages"]) == pytest.approx(
        data["cost_usd"]["mean"], rel=1e-3
    )
    for name in ("static_max", "static_min"):
        baseline = data["baselines"][name]
        assert baseline["cost_ratio"] >= 1.0 - 1e-9  # never cheaper than the plan
    assert data["baselines"]["static_max"]["gpus"] <= 16
    assert data["catalog"]["prices_read"] == "unspecified"
    columns, rows = report.to_table()
    assert columns[:3] == ["stage", "trials", "resource"] and len(rows) == 3
    assert rows[0][2] == "0 → 1"
    assert any("static-max" in line for line in report.summary_lines())


def test_allocations_drive_the_staged_flow() -> None:
    report = plan_job(job(budget={"deadline": "3h"}), catalog=CATALOG)
    first = report.allocation(0, 0)
    assert (first.bracket, first.rung, first.trials) == (0, 0, 9)
    assert 1 <= first.concurrent <= 9
    assert first.gpus_per_trial in {1.0, 2.0, 4.0}
    assert [a.rung for a in report.allocations] == [0, 1, 2]
    with pytest.raises(KeyError):
        report.allocation(0, 7)


def test_infeasible_deadline_names_the_field_and_the_smallest_deadline() -> None:
    report = plan_job(job(budget={"deadline": "5m"}), catalog=CATALOG)
    assert not report.feasible
    (problem,) = report.problems
    assert problem.field == "budget.deadline"
    with pytest.raises(InfeasibleError, match=r"budget.deadline: 5m cannot be met .* is \d+m"):
        report.check()
    again = plan_job(job(budget={"deadline": problem.smallest}), catalog=CATALOG)
    assert again.feasible


def test_infeasible_budget_names_the_field_and_the_smallest_budget() -> None:
    report = plan_job(job(budget={"deadline": "3h", "max_cost_usd": 0.01}), catalog=CATALOG)
    (problem,) = report.problems
    assert problem.field == "budget.max_cost_usd" and problem.smallest > 0.01
    assert "smallest budget that works is $" in problem.message
    again = job(budget={"deadline": "3h", "max_cost_usd": problem.smallest})
    assert plan_job(again, catalog=CATALOG).feasible


def test_seer_report_and_its_required_fields() -> None:
    report = plan_job(
        job(budget={"deadline": "2h", "max_cost_usd": 20}), planner="seer", catalog=CATALOG
    )
    assert report.feasible
    data = report.to_dict()
    assert data["planner"] == "seer" and data["seer"]["trials"][0] >= 1
    assert data["jct_s"]["p95"] <= 7200 and data["cost_usd"]["p95"] <= 20
    with pytest.raises(SpecError, match=r"budget.max_cost_usd: the seer planner needs both"):
        plan_job(job(budget={"deadline": "2h"}), planner="seer", catalog=CATALOG)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"profile": None}, "profile: the job has no profile"),
        ({"compute": {"instance_types": ["x1", "p9"]}}, r"compute.instance_types\[1\]: unknown"),
        (
            {"profile": {"seconds_per_unit": {8: 10}}},
            "profile.seconds_per_unit: no GPU count fits one x1 node",
        ),
    ],
)
def test_bad_input_names_the_field(changes: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        plan_job(job(**changes), catalog=CATALOG)


def test_unknown_planner_and_default_instance_types() -> None:
    with pytest.raises(SpecError, match="--planner: unknown planner 'fast'"):
        plan_job(job(), planner="fast", catalog=CATALOG)  # type: ignore[arg-type]
    profile = Profile({1.0: 300.0}, gpu="T4")
    report = plan_job(job(compute={}), catalog=CATALOG, profile=profile)
    assert {a.instance_type for a in report.allocations} <= {"x1", "x4"}


# --- a job re-planned in flight starts from the recourse start (algorithms §5.10) ---


def test_a_replanned_job_starts_on_a_first_stage_chosen_for_the_replanning() -> None:
    spec = job(budget={"deadline": "40m"})
    rubberband = plan_job(spec, catalog=CATALOG)
    report = plan_job(spec, catalog=CATALOG, replanned=True)
    # RubberBand's first stage runs on the dearer 4-GPU nodes, right only if the profile
    # is; the start for re-planning runs on single GPUs and still meets the deadline.
    own, first = rubberband.plan.stages[0], report.plan.stages[0]
    assert (own.instance_type, own.gpus_label) == ("x4", "2")
    assert (first.instance_type, first.gpus_label) == ("x1", "1")
    assert report.feasible and report.outcome.jct_q <= 40 * 60
    assert report.to_dict()["first_stage"]["rubberband"] == {
        "instance_type": "x4",
        "instances": own.instances,
        "gpus_per_trial": "2",
        "plan_cost_mean_usd": round(rubberband.outcome.cost_mean, 4),
    }
    line = [x for x in report.summary_lines() if x.startswith("first stage:")]
    assert line == [
        "first stage: chosen for re-planning after its first wave (recourse start); "
        f"RubberBand's plan starts on x4 × {own.instances} (2 GPUs per trial), mean cost "
        f"${rubberband.outcome.cost_mean:,.2f} if the profile is right"
    ]


def test_the_first_stage_options_start_from_the_rubberband_plan_the_job_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # plan_job hands its RubberBand plan's first stage to first_options instead of having
    # it planned again: the two must be the same stage.
    seen = []

    def options(replanner, profile, own=None):  # type: ignore[no-untyped-def]
        seen.append((first_options(replanner, profile, own), first_options(replanner, profile)))
        return seen[-1][0]

    monkeypatch.setattr("elastune.planners.cost.price_job.first_options", options)
    plan_job(job(budget={"deadline": "40m"}), catalog=CATALOG, replanned=True)
    assert len(seen) == 1
    held, planned_again = seen[0]
    assert held == planned_again


SPOT = parse_catalog(
    {
        "instance_types": {
            name: {**t, "spot": {"discount": 0.6, "interruptions_per_hour": 0.1}}
            for name, t in {
                "x1": {"gpus": 1, "gpu": "T4", "price_per_hour": 0.5},
                "x4": {"gpus": 4, "gpu": "T4", "price_per_hour": 2.4},
            }.items()
        }
    }
)


@pytest.mark.parametrize(
    ("changes", "catalog"),
    [
        ({"budget": {"max_cost_usd": 3}}, CATALOG),  # no deadline to hedge for
        ({"budget": {"deadline": "45m", "max_cost_usd": 1.25}}, CATALOG),  # over the budget
        (  # Hyperband: brackets start side by side, not one first stage
            {
                "budget": {"deadline": "40m"},
                "scheduler": {"name": "hyperband", "min_resource": 1, "max_resource": 9},
            },
            CATALOG,
        ),
        (  # spot: RubberBand's rule for it, which the recourse costing does not model
            {
                "budget": {"deadline": "40m"},
                "compute": {"instance_types": ["x1", "x4"], "max_gpus": 16, "spot": True},
            },
            SPOT,
        ),
    ],
)
def test_where_no_recourse_start_applies_a_replanned_job_starts_as_rubberband(
    changes: dict, catalog
) -> None:
    spec = job(**changes)
    report = plan_job(spec, catalog=catalog, replanned=True)
    assert report.plan == plan_job(spec, catalog=catalog).plan
    assert "first_stage" not in report.to_dict()


def test_a_free_plan_starts_as_rubberband() -> None:
    # Nothing to save: every start costs nothing (this machine at its default price).
    spec = job(budget={"deadline": "40m"}, compute={"instance_types": ["local"], "workers": 4})
    report = plan_job(spec, replanned=True)
    assert report.outcome.cost_mean == 0
    assert report.plan == plan_job(spec).plan
    assert "first_stage" not in report.to_dict()


def test_a_first_stage_with_too_many_options_starts_as_rubberband_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = job(budget={"deadline": "40m"})
    monkeypatch.setattr("elastune.planners.cost.price_job.MAX_OPTIONS", 3)
    report = plan_job(spec, catalog=CATALOG, replanned=True)
    assert report.plan == plan_job(spec, catalog=CATALOG).plan
    chosen_for = report.to_dict()["first_stage"]["chosen_for"]
    assert chosen_for.startswith("the profile alone (RubberBand's): ")
    assert chosen_for.endswith(
        "options for the first stage, more than the 3 a start for re-planning is chosen among"
    )
    assert f"first stage: chosen for {chosen_for}" in report.summary_lines()
