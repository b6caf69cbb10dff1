"""Two jobs at once on the same MLflow and Optuna stores do not interfere.

Two ``python -m elastune.flows.cli run`` processes start together on the same SQLite stores, with
the same job name (so the same MLflow experiment) and different samplers and sizes, so that
any cross-talk shows in the counts. The stores exist already, as after any earlier job;
creating them from two processes at once is a known race, tested on its own below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from elastune.planners.search import StudyJournal
from elastune.tasks.tracking import Tracker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
ROOT = Path(__file__).resolve().parent.parent

JOB = {
    "name": "twins",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3},
    "compute": {"workers": 2},
}
# (sampler seed, trials): SHA 1..3 at eta 3 promotes a third of the trials once.
JOBS = {"a": (1, 3), "b": (2, 6)}


def start(tmp: Path, which: str, stores: list[str], api: str) -> subprocess.Popen:
    seed, trials = JOBS[which]
    job = {
        **JOB,
        "sampler": {"name": "random", "seed": seed},
        "scheduler": {**JOB["scheduler"], "max_trials": trials},
    }
    path = tmp / f"{which}.yaml"
    path.write_text(yaml.safe_dump(job))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api}
    with (tmp / f"{which}.err").open("w") as err:  # a file: neither process blocks on a pipe
        return subprocess.Popen(
            [sys.executable, "-m", "elastune.flows.cli", "run", str(path), "--json", *stores],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def test_two_jobs_at_once_on_the_same_stores(prefect_api, tmp_path, stores) -> None:
    # The stores and the experiment as an earlier job of the same name left them.
    Tracker(f"sqlite:///{tmp_path}/mlflow.db", "twins").experiment_id  # noqa: B018
    optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    processes = {which: start(tmp_path, which, stores, prefect_api) for which in JOBS}
    summaries = {}
    for which, process in processes.items():
        out, _ = process.communicate(timeout=300)
        assert process.returncode == 0, f"job {which}:\n{(tmp_path / f'{which}.err').read_text()}"
        summaries[which] = json.loads(out)
    assert summaries["a"]["job_id"] != summaries["b"]["job_id"]

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "twins"]
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.data.tags["elastune.job_id"] for r in parents) == sorted(
        s["job_id"] for s in summaries.values()
    )
    storage = f"sqlite:///{tmp_path}/optuna.db"
    assert sorted(optuna.get_all_study_names(storage)) == sorted(
        s["job_id"] for s in summaries.values()
    )

    for which, summary in summaries.items():
        job_id, (_, trials) = summary["job_id"], JOBS[which]
        assert summary["trials"] == trials
        # Its own parent run, finished, with exactly its own trials as children.
        (parent,) = [r for r in parents if r.data.tags["elastune.job_id"] == job_id]
        assert parent.info.run_id == summary["mlflow_run_id"]
        assert parent.info.status == "FINISHED"
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert len(children) == trials
        assert {r.data.tags["elastune.job_id"] for r in children} == {job_id}
        assert sorted(int(r.data.tags["elastune.trial"]) for r in children) == list(range(trials))

        # Its own study: the same trials, with the configurations its MLflow runs logged.
        study = optuna.load_study(study_name=job_id, storage=storage)
        assert len(study.trials) == trials
        logged = {int(r.data.tags["elastune.trial"]): float(r.data.params["x"]) for r in children}
        sampled = {t.user_attrs["elastune.trial"]: t.params["x"] for t in study.trials}
        assert sampled == logged
        assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {
            r.info.run_id for r in children
        }
        assert len(StudyJournal(study).records()) == summary["segments"]
        assert study.best_value == pytest.approx(summary["best"]["metric"])

    # The registry under the job's name: a job adds a version (of its own best trial) unless
    # a version at least as good was there when it finished, so which of the two registers
    # depends on the order they finish in, but each version is one job's best trial and a
    # job that registered nothing found a version at least as good.
    versions = {str(v.version): v.run_id for v in client.search_model_versions("name = 'twins'")}
    best_runs = {r.info.run_id for r in runs if r.data.tags.get("elastune.best") == "true"}
    assert versions and set(versions.values()) <= best_runs
    for summary in summaries.values():
        model = summary["model"]
        (best_run,) = [
            r.info.run_id
            for r in runs
            if r.data.tags.get("elastune.best") == "true"
            and r.data.tags["elastune.job_id"] == summary["job_id"]
        ]
        if model["version"] is not None:
            assert versions[model["version"]] == best_run
        else:
            assert best_run not in versions.values()
            assert model["previous"]["metric"] >= summary["best"]["metric"]


# --- creating the stores from two processes at once ----------------------------------------

RACE = """
import os, sys, time
uri, go = sys.argv[1:]
from elastune.tasks.tracking import Tracker
open(f"{go}.{os.getpid()}", "w").close()  # imported everything: ready
while not os.path.exists(go):  # start together
    time.sleep(0.005)
Tracker(uri, "shared").experiment_id  # what a job's first MLflow call does
"""


def test_two_jobs_create_a_fresh_mlflow_store_at_once(tmp_path) -> None:
    uri, go = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, uri, str(go)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 120  # imports take seconds: open the gate once both wait
    while len(list(tmp_path.glob("go.*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    go.write_text("")
    errors = [p.communicate(timeout=120)[1] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], errors


def test_experiment_created_by_another_job_in_between(tmp_path, monkeypatch) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    made = MlflowClient(uri).create_experiment("shared")
    # This job looked before the other created it: its first lookup found nothing.
    real, calls = MlflowClient.get_experiment_by_name, []

    def lookup(self: MlflowClient, name: str) -> object:
        calls.append(name)
        return None if len(calls) == 1 else real(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", lookup)
    assert Tracker(uri, "shared").experiment_id == made
