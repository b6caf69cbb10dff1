"""AWS credentials never appear in logs, MLflow params, tags or artifacts, Optuna attributes
or Prefect's records.

Fake credentials are planted where a real user keeps them: in the environment of the
driver (boto3's default chain) and in a prefect-aws ``AwsCredentials`` block that the job's
``compute.ecs`` section names. Then everything the job wrote is scanned for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect_aws import AwsCredentials

from elastune.flows.cli import main
from elastune.infra.template import TEMPLATE_PATH
from tests.helpers.aws import ACCESS_KEY, SECRET_KEY

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
ROOT = Path(__file__).resolve().parent.parent

ENV_KEY_ID = "AKIAFAKEENVKEY0000042"
ENV_SECRET = "FAKE/env-secret+planted-by-test-secrets-5a4b3c2d1e"
ENV_TOKEN = "FAKEsessionTOKEN-planted-by-test-secrets-0f1e2d3c4b5a69788796a5b4"
BLOCK_KEY_ID = "AKIAFAKEBLOCKKEY00042"
BLOCK_SECRET = "FAKE/block-secret+planted-by-test-secrets-9e8d7c6b5a"
PLANTED = [ENV_KEY_ID, ENV_SECRET, ENV_TOKEN, BLOCK_KEY_ID, BLOCK_SECRET]
BLOCK = "elastune-secrets-test"

JOB = {
    "name": "secrets",
    # Some trials raise: their tracebacks are written too, and must not carry a key.
    "trainable": "tests.trainables:flaky",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 1},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3, "max_trials": 9},
    "compute": {
        "workers": 2,
        "ecs": {"cluster": "gpu", "credentials": BLOCK, "region": "us-east-1"},
    },
}


def leaks(text: str | bytes, where: str, planted: list[str] = PLANTED) -> list[str]:
    data = text if isinstance(text, bytes) else text.encode()
    return [f"{where}: {secret[:12]}..." for secret in planted if secret.encode() in data]


def save_block(key_id: str, secret: str) -> None:
    AwsCredentials(
        aws_access_key_id=key_id, aws_secret_access_key=secret, region_name="us-east-1"
    ).save(BLOCK, overwrite=True)


def prefect_records(flow_run_ids: list) -> list[tuple[str, str]]:
    """(where, text) of what Prefect holds about these flow runs: parameters, job
    variables, states, their task runs, their logs, and every artifact."""
    out: list[tuple[str, str]] = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids))
        )
        for run in runs:
            out.append((f"flow run {run.name}", run.model_dump_json()))
        for task in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids))
        ):
            out.append((f"task run {task.name}", task.model_dump_json()))
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=flow_run_ids))
        )
        out.append(("Prefect logs", "\n".join(log.message for log in logs)))
        for artifact in client.read_artifacts():
            out.append((f"artifact {artifact.key}", artifact.model_dump_json()))
    return out


def mlflow_records(uri: str) -> list[tuple[str, str]]:
    """(where, text) of every run's params, tags and metric names, and registered models."""
    client = MlflowClient(uri)
    out = []
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments], max_results=1000)
    assert runs, "the job logged nothing to scan"
    for run in runs:
        where = f"MLflow run {run.info.run_name}"
        out.append((f"{where} params", json.dumps(run.data.params)))
        out.append((f"{where} tags", json.dumps(run.data.tags)))
        out.append((f"{where} metric names", json.dumps(sorted(run.data.metrics))))
    for version in client.search_model_versions():
        out.append((f"model version {version.version}", json.dumps(dict(version))))
    return out


def optuna_records(url: str) -> list[tuple[str, str]]:
    """(where, text) of every study's and trial's attributes and parameters."""
    storage = optuna.storages.RDBStorage(url)
    out = []
    for study in storage.get_all_studies():
        study_id = storage.get_study_id_from_name(study.study_name)
        attrs = {**study.user_attrs, **storage.get_study_system_attrs(study_id)}
        out.append((f"study {study.study_name}", json.dumps(attrs, default=str)))
        for trial in storage.get_all_trials(study_id):
            attrs = {**trial.user_attrs, **trial.system_attrs, **trial.params}
            out.append((f"trial {trial.number}", json.dumps(attrs, default=str)))
    return out


def test_planted_credentials_appear_nowhere_the_job_wrote(prefect_api, tmp_path, stores) -> None:
    save_block(BLOCK_KEY_ID, BLOCK_SECRET)
    path = tmp_path / "job" / "job.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(JOB))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PREFECT_API_URL": prefect_api,
        # As much logging as there is: a key must not show up even at DEBUG.
        "PREFECT_LOGGING_LEVEL": "DEBUG",
        "PREFECT_LOGGING_TO_API_LEVEL": "DEBUG",
        "MLFLOW_LOGGING_LEVEL": "DEBUG",
        "AWS_ACCESS_KEY_ID": ENV_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": ENV_SECRET,
        "AWS_SESSION_TOKEN": ENV_TOKEN,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "elastune.flows.cli", "run", str(path), "--json", *stores],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)

    found = leaks(done.stdout, "stdout") + leaks(done.stderr, "stderr")
    # Every file the job wrote: both databases and the artifact store (checkpoints, segment
    # reports, the registered model), which lives beside the MLflow database.
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "job" not in p.parts]
    assert any("checkpoints" in p.parts for p in written), "artifacts not under tmp_path"
    for file in written:
        found += leaks(file.read_bytes(), str(file.relative_to(tmp_path)))
    records = mlflow_records(f"sqlite:///{tmp_path}/mlflow.db")
    records += optuna_records(f"sqlite:///{tmp_path}/optuna.db")
    with get_client(sync_client=True) as client:
        jobs = [
            r.id for r in client.read_flow_runs() if r.parameters.get("job_id") == summary["job_id"]
        ]
    assert jobs, "the tune flow run was not found"
    in_prefect = prefect_records(jobs)
    for where, text in records + in_prefect:
        found += leaks(text, where)
    assert not found, found

    # The scans see what the job wrote: the block's name (not its content) is a parameter,
    # in the raw database too; Prefect holds the job's runs and artifacts; a trial failed,
    # so a traceback was written as well.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.data.params["compute.ecs.credentials"] == BLOCK
    assert leaks((tmp_path / "mlflow.db").read_bytes(), "control", [BLOCK])
    assert any(summary["job_id"] in text for where, text in in_prefect if "artifact" in where)
    assert any(r.info.status == "FAILED" for r in client.search_runs([parent.info.experiment_id]))


@pytest.mark.usefixtures("aws")
def test_credentials_of_an_ecs_pool_job_stay_out_of_its_output(
    tmp_path, stores, capfd, caplog, monkeypatch
) -> None:
    """The ECS path loads the block and talks to AWS (moto) before it finds no worker; the
    keys must not reach its message, its logs or its failed flow run."""
    import logging

    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr("elastune.flows.pools.WORKER_TIMEOUT", 1.0)
    save_block(BLOCK_KEY_ID, BLOCK_SECRET)
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name="secret-ecs",
                type="ecs",
                base_job_template=json.loads(TEMPLATE_PATH.read_text()),
            )
        )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, "compute": {**JOB["compute"], "pool": "secret-ecs"}}))
    code = main(["run", str(path), *stores])
    out, err = capfd.readouterr()
    assert code == 2 and "no worker polled work pool 'secret-ecs'" in err, err
    planted = [*PLANTED, ACCESS_KEY, SECRET_KEY]
    found = leaks(out, "stdout", planted) + leaks(err, "stderr", planted)
    # botocore's own DEBUG lines carry the key id in request signatures (test_ecs_backend);
    # no log line carries a secret, and none of ours carries a key id either.
    secrets = [BLOCK_SECRET, SECRET_KEY]
    found += leaks(caplog.text, "logs", secrets)
    ours = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("botocore"))
    found += leaks(ours, "non-botocore logs", planted)
    with get_client(sync_client=True) as client:
        job_id = err.split("job ", 1)[1].split()[0]  # run prints `job <ID>` first
        runs = [r.id for r in client.read_flow_runs() if r.parameters.get("job_id") == job_id]
    assert runs, "the tune flow run was not found"
    for where, text in prefect_records(runs):
        found += leaks(text, where, planted)
    assert not found, found
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "optuna.db").exists()
