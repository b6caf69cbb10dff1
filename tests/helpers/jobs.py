"""Jobs for tests: small job files, run through the command line or the flows, and what
their stores and Prefect runs hold afterwards."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate

import elastune.flows.pools
import elastune.tasks.worker_processes
from elastune.flows.cli import main

ROOT = Path(__file__).resolve().parents[2]


JOB = {
    "name": "tiny",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "mode": "max",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "tpe", "seed": 0},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 9},
    "compute": {"workers": 2},
}


def run_job(tmp_path: Path, stores: list[str], capsys, **changes) -> tuple[int, dict | None, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    code = main(["run", str(path), "--json", *stores])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def child_runs(tmp_path: Path, parent: str) -> list:
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_run(parent).info.experiment_id
    return client.search_runs(
        [experiment], f"tags.mlflow.parentRunId = '{parent}'", max_results=1000
    )


def runs_by_trial(tmp_path: Path, summary: dict) -> dict:
    """The job's trial runs, by trial id (as a string, MLflow's tag)."""
    runs = child_runs(tmp_path, summary["mlflow_run_id"])
    return {r.data.tags["elastune.trial"]: r for r in runs}


def assert_resumed_never_restarted(client: MlflowClient, run_id: str) -> list[int]:
    """Every epoch logged once: a promoted trial resumed where it stopped, never from
    scratch, and its restored state had counted exactly the epochs before."""
    steps = sorted(m.step for m in client.get_metric_history(run_id, "val_accuracy"))
    trained = {m.step: m.value for m in client.get_metric_history(run_id, "epochs_trained")}
    assert steps == list(range(1, len(steps) + 1))
    assert all(trained[s] == s for s in steps)
    return steps


def flow_runs_named(name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
        )


def run_logs(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return [log.message for log in logs]


def run_cli(tmp_path: Path, stores: list[str], api: str, job: dict) -> tuple[dict, str, list[str]]:
    """Run ``job`` with the CLI against the server ``api``: its summary, its stderr, and
    its flow run's log lines after checking the run is named after the job."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    # A process of its own: the CLI's logging defaults are set before Prefect is imported.
    done = subprocess.run(
        [sys.executable, "-m", "elastune.flows.cli", "run", str(path), "--json", *stores],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    (run,) = flow_runs_named(summary["job_id"])
    assert run.state.is_completed()
    return summary, done.stderr, run_logs(run.id)


GOOD = {
    "name": "bad-input",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "mode": "max",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 0},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3},
}


def edit(path: str, value: object) -> dict:
    return edit_of(GOOD, path, value)


def edit_of(original: dict, path: str, value: object) -> dict:
    job = yaml.safe_load(yaml.safe_dump(original))
    *parents, leaf = path.split(".")
    node = job
    for part in parents:
        node = node[part]
    node[leaf] = value
    return job


def assert_rejected(capsys: pytest.CaptureFixture[str], code: int, field: str, tmp: Path) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert field in err, err
    assert "Traceback" not in err
    # Nothing created: no MLflow database, no Optuna database.
    assert not (tmp / "mlflow.db").exists() and not (tmp / "optuna.db").exists()


PACKABLE_JOB = {
    "name": "wide",
    "trainable": "tests.trainables:wide_quadratic",
    "metric": "val_accuracy",
    "mode": "max",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 0},
    "scheduler": {"name": "sha", "eta": 2, "min_resource": 1, "max_resource": 2, "max_trials": 2},
    "compute": {"workers": 2},
    "profile": {"seconds_per_unit": {1: 1.0}, "speedup": {2: 1.8}},
}


POOL_JOB = {
    "name": "pooled",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 2},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3},
    "compute": {"workers": 2},
}


def create_pool(name: str, pool_type: str = "process") -> None:
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=name, type=pool_type))


def write_job(tmp_path, **changes) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**POOL_JOB, **changes}))
    return str(path)


def two_devices_recorded(monkeypatch) -> list[tuple[float, float, tuple[int, ...], int, int]]:
    """A machine with two CUDA devices, as the driver sees it; training itself stays on the
    CPU here (run_segment ignores device ids without CUDA), so each segment's begin, end,
    device ids, trial and worker process are recorded as it ends."""
    monkeypatch.setattr(elastune.flows.pools, "cuda_devices", lambda: 2)
    calls: list[tuple[float, float, tuple[int, ...], int, int]] = []
    real = elastune.tasks.worker_processes.WorkerProcess.call

    def recording(worker, fn, *args, **kwargs):
        began = time.monotonic()
        try:
            return real(worker, fn, *args, **kwargs)
        finally:
            ids = tuple(kwargs["gpu_ids"])
            calls.append((began, time.monotonic(), ids, args[1].trial, worker.pid))

    monkeypatch.setattr(elastune.tasks.worker_processes.WorkerProcess, "call", recording)
    return calls


def run_four_segments(tmp_path, stores, capsys, trainable: str) -> int:
    """Run 4 one-segment trials of ``tests.trainables.<trainable>``, 2 at once; the segments
    the job reports."""
    scheduler = {"name": "random", "max_resource": 2, "max_trials": 4}
    return run_device_job(tmp_path, stores, capsys, trainable, scheduler, 2)["segments"]


def run_device_job(
    tmp_path, stores, capsys, trainable: str, scheduler: dict, workers: int, **compute: str
) -> dict:
    """``elastune run`` of ``tests.trainables.<trainable>`` with ``scheduler``, ``workers``
    segments at once and the rest of ``compute``; its summary."""
    job = {
        "name": "devices",
        "trainable": f"tests.trainables:{trainable}",
        "metric": "val_accuracy",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "scheduler": scheduler,
        "compute": {"workers": workers, **compute},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    code = main(["run", str(path), "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def overlaps(spans: list[tuple]) -> list[tuple[tuple, tuple]]:
    """The pairs of ``(begin, end, ...)`` spans that overlap in time."""
    return [(a, b) for a, b in itertools.combinations(spans, 2) if a[0] < b[1] and b[0] < a[1]]
