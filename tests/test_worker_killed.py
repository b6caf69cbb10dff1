"""Work-pool mode: the process training a segment dies (SIGKILL) mid-segment; the segment is
retried from the trial's last checkpoint and the job completes.

A real `prefect server` and `prefect worker --type process`: each segment is a flow run in a
subprocess of the worker, which is the process killed here, as a preempted instance would be.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import FlowFilter

from flows.cli import main
from tests.prefect_server import running_worker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

POOL = "preemptible"
EPOCH_SECONDS = 2.0  # long enough to kill the process while it trains epoch 2
JOB = {
    "name": "killed-worker",
    "trainable": "tests.trainables:pid_logged_quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 3},
    # One trial trained straight to 3 epochs: one segment 0 -> 3, checkpointed every epoch.
    "scheduler": {"name": "random", "max_resource": 3, "max_trials": 1},
    "compute": {"workers": 1, "pool": POOL},
}


def lines(path: Path) -> list[tuple[int, int, int]]:
    """(pid, trial, epoch) of every epoch a training process began."""
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def kill_when_epoch_starts(log: Path, epoch: int, timeout: float = 240) -> int:
    """SIGKILL the process that begins ``epoch`` (after checkpointing the one before)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [pid for pid, _, e in lines(log) if e == epoch]
        if started:
            os.kill(started[0], signal.SIGKILL)
            return started[0]
        time.sleep(0.05)
    raise AssertionError(f"no process began epoch {epoch} within {timeout} s")


def test_killed_worker_process_is_retried_from_the_checkpoint(
    prefect_api, tmp_path, stores, capsys, monkeypatch
) -> None:
    log = tmp_path / "epochs.log"
    # The worker hands its environment to the flow-run processes it starts.
    monkeypatch.setenv("ELASTUNE_TEST_PIDS", str(log))
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", str(EPOCH_SECONDS))
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))

    killed: list[int] = []
    killer = threading.Thread(target=lambda: killed.append(kill_when_epoch_starts(log, 2)))
    with running_worker(prefect_api, POOL, tmp_path / "worker"):
        killer.start()
        code = main(["run", str(path), "--json", *stores])
        killer.join()
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["segments"] == 1 and summary["best"] is not None

    # Two processes trained the segment: the killed one got through epoch 1 and began 2;
    # the retry began at epoch 2, from the checkpoint of epoch 1, not from scratch.
    began = lines(log)
    (victim,) = killed
    assert [e for pid, _, e in began if pid == victim] == [1, 2]
    retry = {pid for pid, _, _ in began} - {victim}
    assert len(retry) == 1
    assert [e for pid, _, e in began if pid in retry] == [2, 3]

    # MLflow holds each epoch once, and the restored state had counted epoch 1.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(JOB["name"]).experiment_id
    (run,) = client.search_runs([experiment], "tags.`elastune.trial` = '0'")
    history = client.get_metric_history(run.info.run_id, "epochs_trained")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert run.data.tags["elastune.status"] == "complete"

    # Prefect saw it: the killed flow run crashed, and its launch-segment task run retried
    # once and completed.
    with get_client(sync_client=True) as prefect:
        runs = prefect.read_flow_runs(flow_filter=FlowFilter(name={"any_": ["train-segment"]}))
        ours = [r for r in runs if r.name.startswith(summary["job_id"])]
        # run_deployment records each flow run under a placeholder task run whose parent
        # is the launch-segment task run that called it: one caller for both attempts.
        placeholders = [prefect.read_task_run(r.parent_task_run_id) for r in ours]
        (launcher,) = {p.task_inputs["__parents__"][0].id for p in placeholders}
        task = prefect.read_task_run(launcher)
    assert sorted(r.state_name for r in ours) == ["Completed", "Crashed"]
    assert task.name == "trial-0 0→3"
    assert task.state_name == "Completed" and task.run_count == 2
