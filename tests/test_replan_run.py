"""A real local run re-planned in flight (flows/replanning.py, docs/algorithms.md §5.8): its
profile is 2x too optimistic, the static plan would miss the deadline, the re-planned run
meets it and says why it re-planned; a packed run re-plans its packed stages."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from elastune.flows.job import Job, new_job_id
from elastune.flows.prepare import prepare
from elastune.flows.replanning import AT_RISK_TAG, InFlight
from elastune.planners.cost import plan_job
from elastune.planners.cost.inflight.replanner import Replanner
from elastune.planners.cost.montecarlo.held import Held
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.reports.plan_report import StageAllocation
from elastune.planners.search import Result, Segment
from elastune.planners.spec import parse_job
from elastune.planners.staging import Profile, StagePacker
from elastune.planners.staging.admission import StageSlots
from elastune.tasks.contract import SegmentReport
from tests.helpers.jobs import JOB, run_job

pytestmark = pytest.mark.slow

EPOCH_S = 3.0  # what an epoch takes (the trainable sleeps)
OVERHEAD_S = 0.5  # per segment here: task start, MLflow, checkpoint (measured, rounded)
JOB_OVERHEAD_S = 3.0  # outside the segments (the model registered at the end), rounded up
SPREAD = 0.2  # stragglers leave parallel slots idle: at a price, fewer slots are cheaper
DEADLINE_S = 55
PLANNED = {
    **JOB,
    "trainable": "tests.trainables:device_counter",
    "compute": {"workers": 4, "price_per_hour": 3.6},
    "budget": {"deadline": DEADLINE_S},
    # The profile is 2x too optimistic: an epoch is said to take half its time.
    "profile": {
        "seconds_per_unit": {1: EPOCH_S / 2},
        "overhead_s": OVERHEAD_S,
        "job_overhead_s": JOB_OVERHEAD_S,
        "segment_cv": SPREAD,
    },
}


def true_profile() -> Profile:
    return Profile(
        {1: EPOCH_S}, overhead_s=OVERHEAD_S, job_overhead_s=JOB_OVERHEAD_S, segment_cv=SPREAD
    )


def test_a_run_slower_than_its_profile_replans_and_meets_its_deadline(
    tmp_path, stores, capsys, monkeypatch
) -> None:
    spec = parse_job(PLANNED)
    static = plan_job(spec)
    assert static.feasible  # the profile says the cheap plan meets the deadline ...
    slots = [row.allocation.concurrent for row in static.rows]
    assert slots[0] < 4
    truth = PlanSimulator(static.catalog, true_profile(), samples=200).run(static.plan)
    assert truth.jct_q > DEADLINE_S  # ... but at the true speed it would miss it

    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", str(EPOCH_S))
    code, summary, err = run_job(tmp_path, stores, capsys, **PLANNED)
    assert code == 0, err
    assert summary is not None
    replanning = summary["replanning"]
    reasons = [d["reason"] for d in replanning["decisions"]]
    assert "late" in reasons, json.dumps(replanning, indent=1)
    first = replanning["decisions"][reasons.index("late")]
    assert first["changed"] and first["kept"]["jct_s"] > first["deadline_left_s"]
    assert summary["wall_seconds"] <= DEADLINE_S, json.dumps(replanning, indent=1)
    assert not replanning["deadline_at_risk"], json.dumps(replanning, indent=1)
    tags = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"])
    assert AT_RISK_TAG not in tags.data.tags


# Two trials may share a slot (the profile's 0.5), where it pays: Fluid packs the stages.
PACKED = {**PLANNED, "profile": {**PLANNED["profile"], "seconds_per_unit": {0.5: 1.4, 1: 1.0}}}


def test_a_packed_run_is_replanned_in_flight(tmp_path, stores, capsys, monkeypatch) -> None:
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.5")
    code, summary, err = run_job(tmp_path, stores, capsys, **PACKED)
    assert code == 0, err
    assert summary is not None
    assert summary["mode"]["packed"] and summary["mode"]["replanned"]
    assert summary["replanning"]["decisions"]  # made at the first wave and each barrier
    assert summary["segments"] == 9 + 3 + 1  # every segment of every stage ran


def in_flight(tmp_path: Path, raw: dict[str, Any]) -> tuple[Job, InFlight]:
    """The job file ``raw`` as its driver holds it (stores, study, runs), and its re-planner,
    before anything runs."""
    stores = {
        "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db",
        "optuna_storage": f"sqlite:///{tmp_path}/optuna.db",
    }
    spec = parse_job({**raw, "tracking": stores})
    job = Job.create(prepare(spec), new_job_id(spec.name), [])
    flight = InFlight.of(job)
    assert flight is not None
    return job, flight


def test_a_changed_plan_repacks_a_packed_stage_keeping_what_runs(tmp_path) -> None:
    job, flight = in_flight(tmp_path, PACKED)
    packer = job.execution.admission
    assert isinstance(packer, StagePacker)
    first = job.loop.next_segment()
    assert first is not None and packer.may_start(first, [])
    # One segment in, the job turns out 4x slower than its profile: the plan must change.
    slower = Profile({0.5: 5.6, 1: 4.0}, overhead_s=OVERHEAD_S, job_overhead_s=JOB_OVERHEAD_S)
    held = {0: Held(flight.plan.stages[0])}
    decision = flight.replanner.decide(flight.plan, {(0, 0): 1}, 1.0, 0.0, slower, held)
    assert decision.changed, decision.describe()
    flight._apply(decision, held)
    repacked = job.execution.admission
    assert isinstance(repacked, StagePacker) and repacked is not packer
    assert repacked.plan == job.execution.plan != packer.plan
    assert repacked.width(first) == packer.width(first)  # the running segment keeps its GPUs


def test_a_stage_is_re_planned_when_what_it_began_with_has_finished(tmp_path) -> None:
    # A stage's first wave is what it started before its first segment finished: its slots
    # for a stage that fills them, or as many as its admission started, should a packed
    # stage's widths start fewer or more.
    # This machine free: RubberBand's own plan (no start chosen for re-planning), whose
    # first stage has several slots.
    job, flight = in_flight(tmp_path, {**PACKED, "compute": {"workers": 4}})
    first = job.loop.next_segment()
    assert first is not None
    stage = job.execution.stage(first)
    assert stage is not None and (stage.slots or 0) > 1
    flight.started([first])  # the stage began with one segment
    asked: list[int] = []
    flight._decide = lambda finished, holding, now, story: asked.append(finished[(0, 0)])  # type: ignore[method-assign]
    job.tally.count(first.trial, {"bracket": 0, "rung": 0}, job.spec.metric)
    flight.finished(first, report(first, seconds=1.0), None)  # type: ignore[arg-type]
    assert asked == [1]  # its first wave has finished: decide now, not after its slots


def report(segment: Segment, seconds: float, failed: bool = False) -> SegmentReport:
    result = Result(segment.trial, segment.stop, 0.5, failed, ((segment.stop, 0.5),), seconds)
    return SegmentReport(result, ("val_accuracy",))


def test_the_speed_learnt_leaves_out_the_wait_for_a_worker(tmp_path) -> None:
    # On a work pool a segment may wait for a node to start: the driver sees that wait, the
    # worker does not. The speed learnt is the worker's, plus the profile's overhead.
    job, flight = in_flight(tmp_path, PLANNED)
    flight._decide = lambda finished, holding, now, story: None  # type: ignore[method-assign,assignment]
    queued, failed = job.loop.next_segment(), job.loop.next_segment()
    assert queued is not None and failed is not None
    flight.started([queued, failed])
    waited = time.monotonic() - 120.0  # submitted two minutes ago, a node started meanwhile
    flight._started = {key: (stage, waited) for key, (stage, _) in flight._started.items()}
    unit = EPOCH_S / 2  # what the profile says an epoch takes
    flight.finished(failed, report(failed, seconds=0.1, failed=True), None)  # type: ignore[arg-type]
    assert flight.estimate.segments == 0  # a failed segment is not timed
    # Two epochs' time on the worker: the segment trained at half the profile's speed.
    flight.finished(queued, report(queued, seconds=2 * unit), None)  # type: ignore[arg-type]
    assert flight.estimate.segments == 1
    learnt = flight.estimate.profile().timing(1).mean
    assert unit < learnt <= 2 * unit  # twice the profile's epoch, shrunk towards it


def test_a_replanner_that_fails_leaves_the_job_on_its_plan(
    tmp_path, stores, capsys, monkeypatch, caplog
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("re-planner bug")

    monkeypatch.setattr(Replanner, "decide", broken)
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.05")
    code, summary, err = run_job(tmp_path, stores, capsys, **PLANNED)
    assert code == 0, err
    assert summary is not None
    assert summary["replanning"]["decisions"] == []
    assert summary["segments"] > 0 and summary["best"] is not None
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("re-planning failed, the job goes on at its plan" in w for w in warned)


def test_segments_running_at_a_re_plan_run_on_where_they_are(tmp_path) -> None:
    # A decision inside a stage changes only its trials not begun: the segments running are
    # told to the re-planner with the time they have run, and keep their nodes.
    job, flight = in_flight(tmp_path, PLANNED)
    first, second, third = (job.loop.next_segment() for _ in range(3))
    assert first is not None and second is not None and third is not None
    flight.started([first, second])
    held = flight._holding({}, time.monotonic())[0]
    assert held.key == (0, 0) and len(held.running) == 2 and min(held.running) >= 0
    stage = held.stage
    gpus = stage.tiers[0].gpus
    node = flight.catalog.get(stage.instance_type).gpus
    allocation = StageAllocation(0, 0, 0, 1, gpus, stage.instance_type, stage.instances, 1)
    # On the same nodes they hold two of its slots; on others they drain apart.
    same, drained = flight._in_flight(allocation, {held.key: held})
    assert not drained
    assert same.concurrent == min(1 + 2, stage.instances * int(node // gpus))
    elsewhere = dataclasses.replace(allocation, instance_type="g5.xlarge")
    moved, drained = flight._in_flight(elsewhere, {held.key: held})
    assert moved == elsewhere and drained == {(0, 0, first.trial), (0, 0, second.trial)}
    plan = job.execution.plan
    assert plan is not None and (plan.stage(0, 0).slots or 0) <= 2
    assert not StageSlots(plan).may_start(third, [first, second])
    assert StageSlots(plan).replanned(plan, frozenset(drained)).may_start(third, [first, second])
