"""A finished job tells its story in the Prefect UI (flows/job_log.py): its flow run is named
after the job id, its logs (read back through the client) hold its stages, promotions and
best, and its leaderboard is rounded for reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.jobs import JOB, flow_runs_named, run_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_job_run_is_named_after_the_job_and_logs_its_story(
    tmp_path, stores, prefect_api
) -> None:
    summary, stderr, lines = run_cli(tmp_path, stores, prefect_api, JOB)
    job_id = summary["job_id"]
    story = "\n".join(lines)
    assert any(
        line.startswith(f"job {job_id}: sha on local, metric val_accuracy (max); mode:")
        for line in lines
    ), story
    assert "stage b0-r0 started: 9 trials, resource 0 → 1" in lines
    assert any(line.startswith("stage b0-r2 done: 1 trial, best val_accuracy") for line in lines)
    promoted = [line for line in lines if " promoted from rung 0: val_accuracy " in line]
    assert len(promoted) == 3, story
    stopped = [line for line in lines if " stopped at rung " in line]
    assert len(stopped) == 8, story
    best = summary["best"]
    assert f"best so far: val_accuracy {best['metric']:.4g}, trial {best['trial']}" in story
    assert any(line.startswith(f"job {job_id} done: 9 trials, 13 segments") for line in lines)
    assert len(lines) <= 6 * summary["segments"] + 20  # one line per event, no flood
    # The terminal keeps its own output: the story is in the UI only.
    assert "best so far" not in stderr and "promoted" not in stderr

    from prefect.artifacts import Artifact

    board = json.loads(Artifact.get(f"{job_id}-leaderboard").data)
    for row in board:
        for value in (row["x"], row["val_accuracy"]):
            assert value is None or len(f"{abs(value):e}".split("e")[0].rstrip("0")) <= 5


def test_the_trials_the_jobs_end_stops_are_told(tmp_path, stores, prefect_api) -> None:
    scheduler = {"name": "asha", "eta": 3, "min_resource": 1, "max_resource": 9, "max_trials": 6}
    _, _, lines = run_cli(tmp_path, stores, prefect_api, {**JOB, "scheduler": scheduler})

    ended = [line for line in lines if line.endswith(", the job ended")]
    assert ended and all(" stopped at rung " in line for line in ended), "\n".join(lines)
    assert "rung -1" not in "\n".join(lines)
    assert any(line.startswith("rung 0 started: resource up to 1") for line in lines)


def test_a_deployment_style_run_is_renamed_after_its_job(tmp_path, prefect_api) -> None:
    from elastune.flows.tune import tune

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, "scheduler": {**JOB["scheduler"], "max_resource": 3}}))
    overrides = [
        f"tracking.mlflow_uri=sqlite:///{tmp_path}/mlflow.db",
        f"tracking.optuna_storage=sqlite:///{tmp_path}/optuna.db",
    ]
    # As a deployment calls it: a job file and no job id, which the flow makes.
    summary = tune(str(path), overrides)

    (run,) = flow_runs_named(summary["job_id"])
    assert run.flow_id is not None and run.state.is_completed()
