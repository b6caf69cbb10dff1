"""A trial's run follows the scheduler's decisions from a thread of its own: the driver's
next segment does not wait on those writes, which still arrive in order, and one that
fails is not lost."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from elastune.flows.trial_runs import TrialRuns
from elastune.planners.search.schedulers.base import Action, Decision
from elastune.tasks.tracking import Tracker


def runs_of(tmp_path: Path) -> tuple[TrialRuns, Tracker]:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "decisions")
    runs = TrialRuns(tracker, "job", tracker.start_job("job", {}, {}), {})
    runs.start(0, {"x": 1})
    return runs, tracker


def test_decisions_reach_the_run_in_order_without_holding_the_driver(tmp_path: Path) -> None:
    runs, tracker = runs_of(tmp_path)
    gate, set_tags = threading.Event(), tracker.set_tags

    def slow(run_id: str, tags: dict) -> None:
        gate.wait(10)
        set_tags(run_id, tags)

    tracker.set_tags = slow  # type: ignore[method-assign]
    runs.track(Decision(0, Action.PROMOTE, 1), None)
    runs.track(Decision(0, Action.COMPLETE, 2), None)  # returns while the first still waits
    assert tracker.status(runs[0]) == "RUNNING"
    gate.set()
    runs.drain()
    run = tracker.client.get_run(runs[0])
    assert (run.data.tags["elastune.status"], run.data.tags["elastune.rung"]) == ("complete", "2")
    assert run.info.status == "FINISHED"


def test_a_decision_that_could_not_be_written_fails_the_next_one(tmp_path: Path) -> None:
    runs, tracker = runs_of(tmp_path)

    def down(run_id: str, tags: dict) -> None:
        raise ConnectionError("tracking server down")

    tracker.set_tags = down  # type: ignore[method-assign]
    runs.track(Decision(0, Action.PROMOTE, 1), None)
    with pytest.raises(ConnectionError):
        runs.drain()
    runs.track(Decision(0, Action.PROMOTE, 1), None)
    runs._writes[0].exception(timeout=10)  # written (and failed) by now
    with pytest.raises(ConnectionError):
        runs.track(Decision(0, Action.COMPLETE, 2), None)
