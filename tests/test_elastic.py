"""Elastic trials in real execution: a segment of ``g`` GPUs runs data-parallel
through ``elastune.tasks.train.run_segment`` and its MLflow checkpoint resumes at another width; a
width that cannot run is bad input unless the job allows the fallback to 1 GPU.

Tolerance of the digits comparison: 2 gloo processes and 1 process train on the same global
batches of 128 with averaged gradients, so they can differ only in float32 summation order
(the two half-batch means and their all-reduce against one full-batch mean), about 1e-7
relative per step. Measured on this machine: the validation losses of 3 epochs (33 Adam
steps) agree to the last bit, and the training losses to 3e-7. ``atol=1e-4`` leaves room
for other thread splits yet is far below what one wrong sample per batch or a rank training
on its own gradient shifts the loss by (1e-2 and more).
"""

from __future__ import annotations

import re

import pytest
import torch

from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.staging.plan import compile_plan
from elastune.planners.staging.widths import check_widths, width_problem
from elastune.tasks.contract import JobRef, SegmentReport
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import run_segment

DIGITS = {"lr": 0.003, "width": 4, "dropout": 0.0, "optimizer": "adam", "batch_size": 128}
ATOL = 1e-4
TWO_RANKS = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="2 NCCL ranks need 2 CUDA devices (on CPU, gloo runs any number)",
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow database for the module: creating one takes seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def job_ref(store: str, trainable: str, **elastic) -> JobRef:
    return JobRef("job", trainable, "val_accuracy", "max", 4, store, "elastic", **elastic)


def trial_run(job: JobRef, trial: int = 0) -> tuple[Tracker, str]:
    tracker = Tracker(job.mlflow_uri, job.experiment)
    parent = tracker.start_job(job.job_id, {}, {})
    return tracker, tracker.start_trial(job.job_id, parent, trial, {})


@pytest.mark.slow
@TWO_RANKS
def test_digits_segment_at_two_processes_resumes_at_one(store):
    job = job_ref(store, "examples.digits:train")
    tracker, run_id = trial_run(job)

    first = run_segment(job, Segment(0, 0, 2, rung=0, gpus=2), DIGITS, run_id)
    assert first.error is None and not first.result.failed
    assert [r for r, _ in first.result.history] == [1, 2]
    # Rank 0 alone logs metrics and writes checkpoints.
    assert [step for step, _ in tracker.metric_history(run_id, "val_loss")] == [1, 2]
    assert [r for r, _ in tracker.checkpoints(run_id)] == [2.0, 1.0]
    assert tracker.client.get_run(run_id).data.tags["elastune.gpus"] == "2"

    second = run_segment(job, Segment(0, 2, 3, rung=1, gpus=1), DIGITS, run_id)
    assert second.error is None and [r for r, _ in second.result.history] == [3]
    assert tracker.client.get_run(run_id).data.tags["elastune.gpus"] == "1"

    # The same trial trained on one process without a pause takes the same path.
    _, alone = trial_run(job)
    whole = run_segment(job, Segment(0, 0, 3, rung=0, gpus=1), DIGITS, alone)
    elastic = tracker.metric_history(run_id, "val_loss")
    single = tracker.metric_history(alone, "val_loss")
    assert [s for s, _ in elastic] == [s for s, _ in single] == [1, 2, 3]
    assert max(abs(a - b) for (_, a), (_, b) in zip(elastic, single, strict=True)) < ATOL
    assert single[-1][1] < 0.95 * single[0][1]  # and it does learn
    assert whole.result.loss == pytest.approx(second.result.loss, abs=ATOL)


@pytest.mark.slow
@TWO_RANKS
def test_a_rank_that_raises_fails_its_segment_not_the_job(store):
    job = job_ref(store, "tests.trainables:rank_one_raises")
    tracker, run_id = trial_run(job)
    report = run_segment(job, Segment(0, 0, 2, rung=0, gpus=2), {}, run_id)
    assert report.result.failed and report.result.history == ()
    assert "rank 1 of 2 failed: FloatingPointError: rank 1 diverged at epoch 1" in report.error
    assert SegmentReport.from_dict(tracker.load_report(run_id, "0-2")) == report


def test_a_trainable_without_distributed_support_is_bad_input_at_two_gpus(store):
    job = job_ref(store, "tests.trainables:quadratic")
    _, run_id = trial_run(job)
    segment = Segment(0, 0, 2, rung=0, gpus=2)
    with pytest.raises(SpecError, match=r"trainable: tests.trainables:quadratic does not") as e:
        run_segment(job, segment, {"x": 0.5}, run_id)
    assert "compute.elastic_fallback" in str(e.value) and "quadratic.distributed" in str(e.value)


def test_the_job_file_may_let_such_a_segment_fall_back_to_one_gpu(store):
    job = job_ref(store, "tests.trainables:quadratic", elastic_fallback=True)
    tracker, run_id = trial_run(job)
    report = run_segment(job, Segment(0, 0, 2, rung=0, gpus=2), {"x": 0.5}, run_id)
    assert report.error is None and [r for r, _ in report.result.history] == [1, 2]
    tags = tracker.client.get_run(run_id).data.tags
    assert tags["elastune.gpus"] == "1"
    assert "asked 2 GPUs" in tags["elastune.width_fallback"]


@pytest.mark.parametrize(
    ("gpus", "rules", "message"),
    [
        (4, {"covered": (1, 2)}, "4 GPUs per trial is a width the profile does not cover"),
        (0.5, {"covered": (1, 2)}, "does not cover"),
        (8, {"max_gpus": 4}, r"more than the pool has \(compute.max_gpus: 4\)"),
        (2, {"devices": 1}, r"more than this worker has \(1 CUDA devices\)"),
        (2.5, {}, "a width above 1 must be a whole number"),
        (0, {}, "positive number of GPUs"),
        (2, {"distributed": False}, "does not support distributed training"),
    ],
)
def test_widths_that_cannot_run(gpus, rules, message):
    rules = {"trainable": "m:train", "distributed": True, **rules}
    problem = width_problem(gpus, **rules)
    assert problem is not None and re.search(message, problem), problem


@pytest.mark.parametrize(
    ("gpus", "rules"),
    [
        (1, {"covered": (2, 4), "max_gpus": 1, "distributed": False}),  # always the fallback
        (0.5, {"covered": (0.5, 1), "distributed": False}),  # a share: any trainable
        (4, {"covered": (1, 2, 4), "max_gpus": 8, "devices": 4}),
        (16, {}),  # on CPU, ranks are processes
    ],
)
def test_widths_that_can_run(gpus, rules):
    assert width_problem(gpus, **{"trainable": "m:train", "distributed": True, **rules}) is None


JOB = {
    "name": "elastic",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
}


def test_a_plan_is_checked_before_anything_runs():
    spec = parse_job(JOB)
    plan = compile_plan(spec)
    check_widths(spec, plan, distributed=False, devices=None)  # one GPU per trial: fine
    wide = type(plan)(
        tuple(s.__class__(**{**s.__dict__, "gpus_per_trial": 2}) for s in plan.stages), 2
    )
    with pytest.raises(SpecError, match=r"plan stage b0-r0: trainable: .* distributed"):
        check_widths(spec, wide, distributed=False, devices=None)
    lenient = parse_job({**JOB, "compute": {"elastic_fallback": True}})
    check_widths(lenient, wide, distributed=False, devices=None)
    assert not parse_job(JOB).compute.elastic_fallback


def test_checkpoints_hold_the_unwrapped_model(store):
    job = job_ref(store, "examples.digits:train")
    tracker, run_id = trial_run(job)
    run_segment(job, Segment(0, 0, 1, rung=0, gpus=1), DIGITS, run_id)
    payload = tracker.load_checkpoint(run_id, lambda f: torch.load(f, weights_only=True))
    assert payload is not None
    assert not any(k.startswith("module.") for k in payload[1]["state"]["model"])
