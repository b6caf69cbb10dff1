"""The tracking server's fence (``mlflow server --app-name elastune-fenced``): a write
carrying a segment launch's token is refused once the driver has fenced the run past it,
read from the run's one tag row."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.server import handlers
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from elastune.tasks.fence import HEADER, TAG, Fence, token


def call(app: Fence, run_id: str, value: str) -> int:
    """The status ``app`` answers a fenced log-batch to ``run_id`` with."""
    body = json.dumps({"run_id": run_id, "metrics": []}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/2.0/mlflow/runs/log-batch",
        "headers": [(HEADER.lower().encode(), value.encode())],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"]


async def passed(scope: dict, receive, send) -> None:
    request = await receive()
    assert json.loads(request["body"])["run_id"]  # the body reaches the app whole
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.parametrize("database", [True, False])
def test_a_write_older_than_the_runs_fence_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: bool
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's, in maintenance mode
    uri = f"sqlite:///{tmp_path}/mlflow.db" if database else str(tmp_path / "mlruns")
    client = MlflowClient(uri)
    experiment = client.create_experiment("fence")
    fenced, open_ = (client.create_run(experiment).info.run_id for _ in range(2))
    client.set_tag(fenced, TAG, token(0, 2000, 0))
    store = client._tracking_client.store
    assert isinstance(store, SqlAlchemyStore) == database  # a database's row, or the run
    monkeypatch.setattr(handlers, "_get_tracking_store", lambda *args: store)
    app = Fence(passed)
    assert call(app, fenced, token(0, 1000, 1)) == 409  # the launch given up on
    assert call(app, fenced, token(0, 3000, 2)) == 200  # its relaunch
    assert call(app, fenced, token(3, 1500, 1)) == 200  # a later segment of the trial
    assert call(app, open_, token(0, 1000, 1)) == 200  # a run never fenced
