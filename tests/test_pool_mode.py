"""Work-pool mode against a real `prefect server` and `prefect worker --type process`."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow import MlflowClient
from prefect.artifacts import Artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate

from flows.cli import main
from infra.pools import read_pool
from tests.prefect_server import running_worker, segment_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

JOB = {
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
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    return str(path)


def test_segments_run_on_the_pool_and_its_limit_follows_the_plan(
    prefect_api, tmp_path, stores, capsys
) -> None:
    create_pool("train-pool")
    with running_worker(prefect_api, "train-pool", tmp_path / "worker"):
        code = main(["run", write_job(tmp_path), "--pool", "train-pool", "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["segments"] == 4 and summary["best"] is not None

    # Each segment was a flow run of the pool's train-segment deployment.
    ours = segment_runs(summary["job_id"])
    assert sorted(r.state_name for r in ours) == ["Completed"] * 4

    # The pool's limit followed the plan stage by stage: 3 trials at rung 0 but 2 workers,
    # then 1 trial; and was put back afterwards.
    sizing = Artifact.get(f"{summary['job_id']}-pool-sizing")
    rows = [(r["stage"], r["after"]) for r in json.loads(sizing.data)]
    assert rows == [("b0-r0", 2), ("b0-r1", 1), ("release", "none")]
    assert read_pool("train-pool").concurrency_limit is None

    # Results and checkpoints came back through MLflow.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    finalist = client.get_run(
        client.search_runs(
            [client.get_experiment_by_name("pooled").experiment_id],
            "tags.`elastune.status` = 'complete'",
        )[0].info.run_id
    )
    history = client.get_metric_history(finalist.info.run_id, "epochs_trained")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
    ]


@pytest.mark.parametrize(
    ("pool", "pool_type", "message"),
    [
        ("no-such-pool", None, "work pool 'no-such-pool' not found"),
        ("ecs-pool", "ecs", "compute.ecs"),
        ("idle-pool", "process", "no worker polled work pool 'idle-pool'"),
    ],
)
def test_pool_mistakes_are_bad_input(
    pool, pool_type, message, tmp_path, stores, capsys, monkeypatch
) -> None:
    monkeypatch.setattr("flows.pools.WORKER_TIMEOUT", 2.0)
    if pool_type:
        create_pool(pool, pool_type)
    code = main(["run", write_job(tmp_path), "--pool", pool, *stores])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1], err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "optuna.db").exists()
