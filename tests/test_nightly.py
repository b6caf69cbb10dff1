"""prefect.yaml deploys against a real server; the nightly flow warm-starts and gates the
model registry."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from prefect.artifacts import Artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists

from elastune.flows.nightly import tune_nightly

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def test_prefect_yaml_deploys_three_deployments_with_the_nightly_schedule(prefect_api) -> None:
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name="local-proc", type="process"))
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with get_client(sync_client=True) as client:
        deployments = {d.name: d for d in client.read_deployments()}
        assert {"tune", "tune-nightly", "train-segment"} <= set(deployments)
        nightly = deployments["tune-nightly"]
        (schedule,) = client.read_deployment_schedules(nightly.id)
    assert schedule.schedule.cron == "0 2 * * *" and schedule.active
    assert nightly.parameters["job_files"] == ["examples/digits.yaml"]


def tiny_job(tmp_path: Path, name: str) -> dict:
    """A job of a few seconds, its stores in ``tmp_path``."""
    return {
        "name": name,
        "trainable": "tests.trainables:quadratic",
        "metric": "val_accuracy",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "sampler": {"name": "random", "seed": 3},
        "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3},
        "tracking": {
            "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db",
            "optuna_storage": f"sqlite:///{tmp_path}/optuna.db",
        },
    }


def test_nightly_warm_starts_from_last_night_and_registers_only_improvements(tmp_path) -> None:
    job = tiny_job(tmp_path, "nightly-tiny")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))

    (first,) = tune_nightly([str(path)])
    assert first["model"]["version"] == "1" and first["model"]["previous"] is None

    (second,) = tune_nightly([str(path)])
    study = optuna.load_study(study_name=second["job_id"], storage=second["optuna_storage"])
    seeded = min(study.trials, key=lambda t: t.number)
    assert seeded.params == first["best"]["config"]  # last night's best is tried first
    assert second["model"]["previous"] == {"version": "1", "metric": first["best"]["metric"]}
    improved = second["best"]["metric"] > first["best"]["metric"]
    assert second["model"]["version"] == ("2" if improved else None)

    board = Artifact.get("tune-nightly")
    assert board is not None and second["job_id"] in board.data


def test_a_bad_job_file_is_reported_and_the_others_still_run(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "nightly-bad", "trainable": "x:y", "metric": "m"}))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_job(tmp_path, "nightly-good")))
    with pytest.raises(RuntimeError, match=r"1 nightly job\(s\) failed: .*bad\.yaml"):
        tune_nightly([str(bad), str(good)])
    board = Artifact.get("tune-nightly")
    assert board is not None
    assert "bad.yaml: space: Field required" in board.data  # the file and the field
    assert "good.yaml | " in board.data and "| failed" not in board.data.split("good.yaml")[1]
