"""Plan any pool and forecast next to measurement (items 1 and 2): the ``local``
type planned in milliseconds, what a planned local run records of its forecast and its
measurement (``run --json``, the parent MLflow run, the plan artifact), and bad input for
the new fields."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from elastune.flows.cli import main
from elastune.flows.forecast import ForecastCheck
from elastune.planners.cost import plan_job
from elastune.planners.cost.pricing.this_machine import LOCAL
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.staging.plan import compile_plan
from tests.helpers.jobs import assert_rejected

JOB = {
    "name": "forecast",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 0},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 9},
    "budget": {"deadline": "1h"},
    "compute": {"workers": 2},
    "profile": {"seconds_per_unit": {1: 10.0}},
}


def job(**sections: object) -> dict:
    data = yaml.safe_load(yaml.safe_dump(JOB))
    for name, fields in sections.items():
        data[name] = {**data.get(name, {}), **fields} if isinstance(fields, dict) else fields
    return data


# --- planning the local type (pure) ---------------------------------------------------------


def test_a_local_job_is_planned_on_its_slots() -> None:
    report = plan_job(parse_job(job(compute={"workers": 3})), samples=20)
    assert report.feasible
    assert {a.instance_type for a in report.allocations} == {LOCAL}
    assert max(a.instances for a in report.allocations) == 3  # the fastest plan: every slot
    assert report.to_dict()["cost_usd"]["mean"] == 0.0  # price 0 by default
    # 9 trials of 1 unit on 3 slots, 3 of 2 units, 1 of 6 units: 3 waves of 10 s, 20 s, 60 s.
    assert report.outcome.jct_q == pytest.approx(30 + 20 + 60)
    # What it prints calls them slots, not GPUs (this machine may have none).
    assert report.to_table()[0][3] == "slots/trial"
    assert "local × 3 (3 slots) for the whole job" in "\n".join(report.summary_lines())


def test_the_named_local_type_on_a_work_pool_and_cuda_devices_as_slots() -> None:
    spec = parse_job(job(compute={"pool": "gpus", "instance_types": ["local"], "workers": 4}))
    report = plan_job(spec, samples=20, devices=1)
    assert {a.instances for a in report.allocations} == {1}  # one CUDA device, one slot


def test_a_price_bills_the_slots_the_plan_holds() -> None:
    report = plan_job(parse_job(job(compute={"price_per_hour": 7.2})), samples=20)
    # A slot costs $3.60 an hour; no plan holds fewer slot-seconds than the work, 90 + 60 +
    # 60 s, and the cheapest holds no idle slot: $0.21.
    assert report.outcome.cost_mean == pytest.approx(3.6 * 210 / 3600)
    assert report.to_dict()["cost_usd"]["mean"] > 0


def test_the_job_and_segment_overheads_are_in_the_forecast() -> None:
    base = plan_job(parse_job(job()), samples=20).outcome.jct_q
    profile = {"seconds_per_unit": {1: 10.0}, "overhead_s": 1.0, "job_overhead_s": 4.0}
    slower = plan_job(parse_job(job(profile=profile)), samples=20).outcome.jct_q
    # 5 + 2 + 1 waves of segments, each 1 s more, and the job's 4 s.
    assert slower - base == pytest.approx(8 * 1.0 + 4.0)


def test_the_jobs_tail_is_forecast_after_its_last_stage() -> None:
    overhead = {"seconds_per_unit": {1: 10.0}, "job_overhead_s": 4.0}
    priced = {"price_per_hour": 7.2}
    before = plan_job(parse_job(job(profile=overhead, compute=priced)), samples=20)
    tail = {**overhead, "job_tail_s": 3.0}  # 3 of the job's 4 s come after its last segment
    after = plan_job(parse_job(job(profile=tail, compute=priced)), samples=20)
    assert after.forecast()["jct_s"] == before.forecast()["jct_s"]
    for name, stage in after.forecast()["stages"].items():
        assert stage["end_s"]["p50"] == before.forecast()["stages"][name]["end_s"]["p50"] - 3.0
    # The slots are released before the job's end: no plan, static ones included, pays more.
    assert after.to_dict()["cost_usd"] == before.to_dict()["cost_usd"]
    assert after.to_dict()["baselines"] == before.to_dict()["baselines"]
    # Drawn with a spread, the overhead keeps its whole spread in the JCT, the tail or not.
    spread = {**overhead, "job_overhead_sd": 2.0}
    whole = plan_job(parse_job(job(profile=spread)), samples=200).forecast()["jct_s"]
    split = {**spread, "job_tail_s": 4.0}
    assert plan_job(parse_job(job(profile=split)), samples=200).forecast()["jct_s"] == whole


def test_a_catalog_given_plans_on_its_types() -> None:
    from elastune.planners.cost import read_catalog

    spec = parse_job(job(profile={"seconds_per_unit": {1: 10.0}, "gpu": "A10G"}))
    report = plan_job(spec, catalog=read_catalog(), samples=20)
    assert LOCAL not in {a.instance_type for a in report.allocations}
    assert report.to_table()[0][3] == "GPUs/trial"


def test_the_forecast_per_stage_and_in_total() -> None:
    forecast = plan_job(parse_job(job()), samples=20).forecast()
    assert list(forecast["stages"]) == ["b0-r0", "b0-r1", "b0-r2"]
    # 5 waves of 10 s, 2 of 20 s and one of 60 s on 2 slots.
    assert forecast["stages"]["b0-r2"]["end_s"]["p50"] == forecast["jct_s"]["p50"] == 150.0


def test_held_forecast_measures_stages_from_their_brackets_previous_end() -> None:
    stage = {"end_s": {"p50": 10.0, "p95": 11.0}, "cost_usd": 0.01, "usd_per_s": 0.002}
    forecast = {
        "jct_s": {"p50": 20.0, "p95": 22.0},
        "cost_usd": {"p50": 0.02, "p95": 0.02},
        "stages": {"b0-r0": stage, "b0-r1": {**stage, "end_s": {"p50": 20.0, "p95": 22.0}}},
    }
    held = ForecastCheck(forecast)
    held.stage_done(0, 0, 9.0)
    held.stage_done(0, 1, 21.0)
    measured = held.measured(21.5)
    assert measured["stages"]["b0-r1"]["seconds"] == 12.0
    assert measured["cost_usd"] == pytest.approx(0.002 * 21.0)
    assert held.verdict(21.5) == "within p95" and held.verdict(23) == "above p95"
    assert held.contradictions() == []
    held.stage_done(0, 1, 9.0 + 31.0)  # 31 s against 10 s forecast
    assert [c["stage"] for c in held.contradictions()] == ["b0-r1"]


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"compute": {"price_per_hour": -1}}, "compute.price_per_hour"),
        ({"compute": {"instance_types": ["local", "g5.xlarge"]}}, "compute.instance_types"),
        ({"profile": {"seconds_per_unit": {1: 1.0}, "job_overhead_s": -2}}, "job_overhead_s"),
        ({"profile": {"seconds_per_unit": {1: 1.0}, "job_overhead_sd": -1}}, "job_overhead_sd"),
        ({"profile": {"seconds_per_unit": {1: 1.0}, "run_cv": -0.1}}, "profile.run_cv"),
        ({"profile": {"seconds_per_unit": {1: 1.0}, "job_tail_s": 1.0}}, "job_tail_s"),
        ({"compute": {"spot": True}}, "compute.spot"),
        (
            {"scheduler": {"name": "hyperband", "eta": 3, "max_resource": 9}},
            "compute.workers",
        ),
    ],
)
def test_bad_input_names_the_field(sections: dict, field: str, tmp_path, stores, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(**sections)))
    assert_rejected(capsys, main(["plan", str(path), *stores]), field, tmp_path)


def test_hyperband_on_too_few_slots_says_how_many_and_the_ways_out() -> None:
    spec = parse_job(job(scheduler={"name": "hyperband", "eta": 3, "max_resource": 9}))
    with pytest.raises(SpecError) as raised:
        plan_job(spec)
    assert str(raised.value) == (
        "compute.workers: 2 slots of this machine are too few for 3 brackets side by side "
        "(each needs a slot); give at least 3, or plan one bracket (scheduler.name: sha)"
    )
    # Two CUDA devices: no field of the job gives a third.
    with pytest.raises(SpecError, match=r"^scheduler\.name: 2 CUDA devices .*; plan one bracket"):
        plan_job(spec, devices=2)
    # Four slots, but compute.max_gpus lets the job use two of them.
    capped = parse_job({**spec.model_dump(), "compute": {"workers": 4, "max_gpus": 2}})
    with pytest.raises(SpecError, match=r"^compute\.max_gpus: 2 slots .*give at least 3, or"):
        plan_job(capped)


# --- a planned local run --------------------------------------------------------------------


@pytest.mark.usefixtures("prefect_api")
def test_a_planned_local_run_records_forecast_and_measurement(tmp_path: Path, stores, capsys):
    path = tmp_path / "job.yaml"
    fast = {"seconds_per_unit": {1: 0.05}, "overhead_s": 0.2}
    path.write_text(yaml.safe_dump(job(profile=fast)))
    code = main(["run", str(path), "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    forecast, measured = summary["forecast"], summary["measured"]
    assert set(forecast["jct_s"]) == {"p50", "p95"} and set(forecast["cost_usd"]) == {"p50", "p95"}
    assert measured["jct_s"] == summary["wall_seconds"]
    assert list(measured["stages"]) == list(forecast["stages"]) == ["b0-r0", "b0-r1", "b0-r2"]
    ends = [s["end_s"] for s in measured["stages"].values()]
    assert ends == sorted(ends) and ends[-1] <= summary["wall_seconds"]
    # The job's own end follows its last segment's report, which its last stage's end follows.
    assert summary["wall_seconds"] - ends[-1] <= summary["tail_seconds"] < summary["wall_seconds"]

    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"])
    assert run.data.metrics["forecast_jct_p50_s"] == forecast["jct_s"]["p50"]
    assert run.data.metrics["measured_jct_s"] == summary["wall_seconds"]
    assert run.data.tags["elastune.forecast"] in {"within p50", "within p95", "above p95"}

    from prefect.artifacts import Artifact

    artifact = Artifact.get(f"{summary['job_id']}-plan").data
    assert "## Forecast and measurement" in artifact
    assert f"measured {summary['wall_seconds']:.1f} s" in artifact  # the last version


# --- calibration (elastune profile's second half) --------------------------------------------


def test_calibration_jobs_are_full_waves_of_one_rung_or_two(tmp_path: Path) -> None:
    from elastune.flows.calibrate import Run, calibration_job

    spec = parse_job(job(compute={"workers": 3}))
    small = calibration_job(spec, Run(4, 1), 3.0, tmp_path)
    scheduler = small.scheduler
    assert (scheduler.name, scheduler.min_resource, scheduler.max_resource) == ("sha", 3.0, 3.0)
    assert scheduler.max_trials == 12 and small.profile is None
    assert small.budget.deadline is None  # not planned: compute.workers segments at once
    assert str(tmp_path) in small.tracking.mlflow_uri
    # Resumed: 4 waves of new trials to 3 units, then 2 waves of 6 of them to 6 units.
    resumed = calibration_job(spec, Run(4, 1, True), 3.0, tmp_path).scheduler
    assert (resumed.eta, resumed.min_resource, resumed.max_resource) == (2, 3.0, 6.0)
    assert resumed.max_trials == 12
    rungs = compile_plan(calibration_job(spec, Run(4, 1, True), 3.0, tmp_path)).stages
    assert [rung.trials for rung in rungs] == [12, 6]


def test_calibration_on_a_gpu_gives_each_device_one_segment(tmp_path: Path) -> None:
    """The plan's slots on a CUDA machine are its devices, and a slot's seconds per unit
    are a whole device's: 3 workers' segments sharing 2 GPUs would time shares instead."""
    from elastune.flows.calibrate import Run, calibration_job

    spec = parse_job(job(compute={"workers": 3}))
    on_gpus = calibration_job(spec, Run(4, 1), 3.0, tmp_path, devices=2)
    assert on_gpus.compute.workers == 2 and on_gpus.scheduler.max_trials == 8
    capped = parse_job(job(compute={"workers": 3, "max_gpus": 1}))
    assert calibration_job(capped, Run(4, 1), 3.0, tmp_path, devices=2).compute.workers == 1


def test_calibration_solves_the_overheads_and_falls_back_on_noise() -> None:
    from elastune.flows.calibrate import Run, solve

    # F = 2, o = 0.2, c = 0.05, t = 0.5 at a first level of 2 units; each job run twice,
    # 0.1 s apart. A new trial's segment of one level: 1.25 s; a resumed one: 1.2 s.
    exact = {
        Run(1, 1): 2 + 1.25,
        Run(4, 1): 2 + 4 * 1.25,
        Run(4, 3): 2 + 4 * 3.25,
        Run(4, 1, True): 2 + 4 * 1.25 + 2 * 1.2,
    }
    walls = {run: [wall - 0.05, wall + 0.05] for run, wall in exact.items()}
    solved = solve(walls, 2.0, 9.9)
    assert solved.pop("calibration_cov")  # the medians' noise: next test
    assert solved.pop("calibration_dof") == 4 * (2 - 1) - 2  # two runs each, two spreads
    assert solved == {
        "seconds_per_unit": 0.5,
        "overhead_s": 0.2,
        "trial_overhead_s": 0.05,
        "job_overhead_s": 2.0,
        "job_overhead_sd": round((8 * 0.05**2 / 4) ** 0.5, 4),
        "run_cv": 0.0,  # the long jobs spread as the short ones: the start's spread alone
    }
    slowed = {run: [wall, wall * 1.3, wall] for run, wall in exact.items()}
    spreads = ("job_overhead_sd", "run_cv", "calibration_cov", "calibration_dof")
    assert {k: v for k, v in solve(slowed, 2.0, 9.9).items() if k not in spreads} == {
        "seconds_per_unit": 0.5,  # one run in three 30% slower: the medians do not move
        "overhead_s": 0.2,
        "trial_overhead_s": 0.05,
        "job_overhead_s": 2.0,
    }
    # The resumed waves ran 0.5 s slower each: o would come out 0.7 s, more than the 0.25 s
    # a new trial's segment spends outside its units, measured by the new waves alone.
    slow = {run: [wall + (1.0 if run.resumes else 0.0)] for run, wall in exact.items()}
    solved = solve(slow, 2.0, 9.9)
    assert (solved["overhead_s"], solved["trial_overhead_s"]) == (0.25, 0.0)
    # Longer units ran faster: noise; one run each: no spread known.
    noisy = {Run(1, 1): [3.0], Run(4, 1): [6.0], Run(4, 3): [5.9], Run(4, 1, True): [8.0]}
    assert solve(noisy, 1.0, 0.1)["seconds_per_unit"] == 0.1
    assert solve(noisy, 1.0, 0.1)["job_overhead_sd"] == 0.0
    assert solve(noisy, 1.0, 0.1)["run_cv"] == 0.0
    assert "calibration_cov" not in solve(noisy, 1.0, 0.1)  # nor how far the estimate is off


def test_the_calibrations_covariance_is_the_scatter_of_its_estimates() -> None:
    """Calibrations repeated many times over runs with the start's spread: the estimates
    of F, o, c and t (relative) scatter as ``covariance`` says, from one calibration's
    walls (a little above: a median of 3 varies 0.449 times a run's variance, the
    formula takes pi / 6 = 0.52)."""
    from elastune.flows.calibrate import Run, covariance, estimate

    exact = {Run(1, 1): 3.25, Run(8, 1): 12.0, Run(4, 6): 27.0, Run(8, 1, True): 16.8}
    jobs, sd = tuple(exact), 0.1
    rng = np.random.default_rng(0)
    draws = np.array(list(exact.values()))[:, None] + sd * rng.standard_normal((4000, 4, 3))
    estimates = np.array([estimate(jobs, np.median(walls, axis=1), 2.0) for walls in draws])
    estimates[:, 3] /= 0.5  # t's error relative
    walls = {run: list(draws[0, i]) for i, run in enumerate(jobs)}
    predicted = np.array(covariance(walls, 2.0, (sd, 0.0), 2.0, 0.5))
    ratio = np.diag(predicted) / np.diag(np.cov(estimates.T))
    assert ((ratio > 1.0) & (ratio < 1.3)).all(), ratio
    correlations = np.corrcoef(estimates.T)  # F and the waves' costs move together
    predicted_correlations = predicted / np.sqrt(np.outer(np.diag(predicted), np.diag(predicted)))
    assert np.abs(correlations - predicted_correlations).max() < 0.05


def test_calibration_tells_the_starts_spread_from_the_machines() -> None:
    """Four runs of each job, off by 0.1 s (the start) and by 5% of their segments'
    seconds (the machine), the two crossed: each job's variance is 4/3 (0.1**2 + (0.05 *
    s)**2), ``s`` its wall less the job's own 2 s."""
    from elastune.flows.calibrate import Run, solve

    exact = {Run(1, 1): 3.25, Run(4, 1): 7.0, Run(4, 3): 15.0, Run(4, 1, True): 9.4}
    signs = ((1, 1), (-1, 1), (1, -1), (-1, -1))
    walls = {
        run: [wall + a * 0.1 + c * 0.05 * (wall - 2) for a, c in signs]
        for run, wall in exact.items()
    }
    solved = solve(walls, 2.0, 9.9)
    assert solved["job_overhead_s"] == 2.0
    assert solved["job_overhead_sd"] == pytest.approx(0.1 * (4 / 3) ** 0.5, abs=1e-3)
    assert solved["run_cv"] == pytest.approx(0.05 * (4 / 3) ** 0.5, abs=1e-3)


def test_calibration_lengthens_short_units_past_the_timing_noise() -> None:
    from elastune.flows.calibrate import MAX_LEVELS, UNITS_S, Run, runs

    long = runs(1.0, 60.0)  # long units: three levels are plenty
    assert long == (Run(1, 1), Run(4, 1), Run(4, 3), Run(4, 1, True))
    assert runs(1.0, 1e-4)[2] == Run(4, MAX_LEVELS)  # units of no measurable time: capped
    waves, levels, _ = runs(2.0, 0.04)[2]
    assert waves == 4 and (levels - 1) * 2.0 * 0.04 >= UNITS_S > (levels - 2) * 2.0 * 0.04


def test_calibration_runs_more_waves_of_short_segments() -> None:
    """The cost of a wave comes from the extra waves of the second and fourth jobs: enough
    of them to last WAVES_S seconds, at least 4, and even: the fourth job resumes half its
    trials, which then fill whole waves."""
    from elastune.flows.calibrate import SEGMENT_S, WAVES_S, Run, runs

    assert runs(1.0, 60.0)[1] == Run(4, 1)  # one-minute units: 4 waves
    _, many, _, resumed = runs(1.0, 0.05)
    assert many.waves % 2 == 0
    assert (many.waves - 3) * (0.05 + SEGMENT_S) < WAVES_S <= (many.waves - 1) * (0.05 + SEGMENT_S)
    assert resumed == Run(many.waves, 1, resumes=True) and 2 * resumed.resumed == many.waves
    assert runs(1.0, 1e-6)[1].waves == 14  # units of no time: 12 segments' overheads, even


def test_a_trials_first_segment_pays_the_trial_overhead_in_the_forecast() -> None:
    profile = {"seconds_per_unit": {1: 10.0}, "trial_overhead_s": 2.0}
    report = plan_job(parse_job(job(compute={"workers": 3}, profile=profile)), samples=20)
    # As in the test above, but the first rung's 3 waves start trials: 12 s each; the
    # resumed segments of the later rungs (20 s, 60 s) do not pay it.
    assert report.outcome.jct_q == pytest.approx(3 * 12 + 20 + 60)


def _p50_p95(**spread: float) -> tuple[float, float]:
    """The forecast JCT's median and p95 of a job of 10 s units and 4 s of its own, with
    ``spread`` (a profile's spread field) added."""
    profile = {"seconds_per_unit": {1: 10.0}, "job_overhead_s": 4.0, **spread}
    outcome = plan_job(parse_job(job(profile=profile)), samples=400).outcome
    return float(np.median(outcome.jct)), float(np.quantile(outcome.jct, 0.95))


def test_the_job_overhead_spread_widens_the_forecast_not_its_middle() -> None:
    p50, p95 = _p50_p95()
    spread_p50, spread_p95 = _p50_p95(job_overhead_sd=2.0)
    assert p95 == pytest.approx(p50)  # nothing varies: p95 = p50
    assert spread_p50 == pytest.approx(p50, abs=0.3)
    assert spread_p95 - p95 == pytest.approx(1.645 * 2.0, rel=0.15)


def test_the_runs_speed_spread_widens_the_forecast_with_the_segments() -> None:
    p50, p95 = _p50_p95()
    spread_p50, spread_p95 = _p50_p95(run_cv=0.05)
    assert p95 == pytest.approx(p50)
    assert spread_p50 == pytest.approx(p50, rel=0.01)
    # One factor for every segment of a run: the whole segments' time moves with it.
    assert spread_p95 - p95 == pytest.approx(1.645 * 0.05 * (p50 - 4.0), rel=0.15)


def test_the_profile_section_keeps_a_matrix_row_to_a_line() -> None:
    from elastune.flows.cli import profile_yaml

    cov = [[0.04, 0.01, 0.0, 0.0], [0.01, 0.01, 0.0, 0.0], [0.0] * 4, [0.0, 0.0, 0.0, 0.0025]]
    profile = {"seconds_per_unit": {1: 0.2}, "calibration_cov": cov, "calibration_dof": 6}
    text = profile_yaml(profile)
    assert "  - [0.04, 0.01, 0.0, 0.0]\n" in text
    assert yaml.safe_load(text) == {"profile": profile}
    parse_job({**job(), **yaml.safe_load(text)})  # and the job file takes it
