"""A driver killed with SIGKILL resumes, re-running no finished segment and losing nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml

from elastune.planners.search import StudyJournal

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

JOB = {
    "name": "chaos",
    "trainable": "tests.trainables:logged_quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "tpe", "seed": 5},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 9},
    "compute": {"workers": 2},
}


def elastune(args: list[str], tmp: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ELASTUNE_TEST_LOG": str(log)}
    return subprocess.Popen(
        [sys.executable, "-m", "elastune.flows.cli", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def setup(tmp: Path, name: str) -> tuple[Path, str]:
    (tmp / name).mkdir()
    storage = f"sqlite:///{tmp / name}/optuna.db"
    job = {
        **JOB,
        "tracking": {"mlflow_uri": f"sqlite:///{tmp / name}/mlflow.db", "optuna_storage": storage},
    }
    path = tmp / name / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path, storage


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return json.loads(out)


def test_killed_driver_resumes_without_rerunning_or_losing_anything(tmp_path: Path) -> None:
    # The same job never interrupted, for its leaderboard: beside the other, to save time.
    clean_path, clean_storage = setup(tmp_path, "clean")
    clean_run = elastune(["run", str(clean_path), "--json"], tmp_path, tmp_path / "c.log")
    try:
        summary, job_id, storage = kill_and_resume(tmp_path)
        clean = finish(clean_run)
    finally:
        if clean_run.poll() is None:
            os.killpg(clean_run.pid, signal.SIGKILL)
    # Same leaderboard as a run that was never interrupted.
    assert summary["best"] == clean["best"]
    assert summary["trials"] == clean["trials"] == 9

    def board(job: str, where: str) -> list:
        trials = optuna.load_study(study_name=job, storage=where).trials
        ranked = sorted(trials, key=lambda t: t.user_attrs["elastune.trial"])
        return [(t.params, t.state, t.value, t.intermediate_values) for t in ranked]

    assert board(job_id, storage) == board(clean["job_id"], clean_storage)


def kill_and_resume(tmp_path: Path) -> tuple[dict, str, str]:
    """Kill the job's driver mid-job and resume it: nothing finished is lost or run again.
    Returns the resumed summary, the job id and its storage."""
    path, storage = setup(tmp_path, "killed")
    log = tmp_path / "killed" / "epochs.log"
    driver = elastune(["run", str(path), "--json"], tmp_path, log)
    job_id = driver.stderr.readline().split()[-1]
    # Kill -9 once a few results are journaled and segments are in flight.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with_results = 0
        try:
            study = optuna.load_study(study_name=job_id, storage=storage)
            with_results = len(StudyJournal(study).records())
        except KeyError:
            pass
        if with_results >= 5:
            break
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = StudyJournal(optuna.load_study(study_name=job_id, storage=storage)).records()
    assert 5 <= len(before) < 13, "killed mid-job"
    finished = {(r["result"]["trial"], r["result"]["resource"]) for r in before}

    summary = finish(elastune(["resume", job_id, "--storage", storage, "--json"], tmp_path, log))
    after = StudyJournal(optuna.load_study(study_name=job_id, storage=storage)).records()
    # Nothing lost: every result journaled before the kill is still there, in order.
    assert after[: len(before)] == before
    assert len(after) == summary["segments"] == 13
    # No finished segment re-ran: an epoch trains twice only if its segment was in flight.
    trained = Counter(tuple(map(int, line.split())) for line in log.read_text().splitlines())
    for (trial, epoch), times in trained.items():
        if times > 1:
            assert not any(t == trial and r >= epoch for t, r in finished), (trial, epoch)
    return summary, job_id, storage


def test_trial_run_left_untagged_by_a_killed_driver_is_taken_up(
    prefect_api, tmp_path, monkeypatch
) -> None:
    from mlflow import MlflowClient

    from elastune.flows.job import Job, new_job_id
    from elastune.flows.prepare import prepare
    from elastune.flows.tune import resume
    from elastune.planners.spec import parse_job

    monkeypatch.chdir(tmp_path)  # local flow runs: their results stay under tmp_path
    spec = parse_job(
        {
            **JOB,
            "trainable": "tests.trainables:quadratic",
            "scheduler": {"name": "random", "max_resource": 2, "max_trials": 2},
            "tracking": {
                "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "optuna_storage": f"sqlite:///{tmp_path}/optuna.db",
            },
        }
    )
    job_id = new_job_id(spec.name)
    # What a driver killed inside Job.submit leaves: trial 0 handed out (journaled) and its
    # MLflow run started, but the run's id not yet stored on the Optuna trial.
    job = Job.create(prepare(spec), job_id, [])
    segment = job.loop.next_segment()
    config = job.loop.configs[segment.trial]
    left = job.runs.tracker.start_trial(job_id, job.runs.parent, segment.trial, config)

    summary = resume(job_id, f"sqlite:///{tmp_path}/optuna.db")
    assert summary["trials"] == 2 and summary["segments"] == 2

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs(
        [client.get_experiment_by_name(spec.experiment).experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{job.runs.parent}'",
    )
    by_trial = Counter(r.data.tags["elastune.trial"] for r in runs)
    assert by_trial == {"0": 1, "1": 1}, "a trial got a second MLflow run"
    (first,) = [r for r in runs if r.data.tags["elastune.trial"] == "0"]
    assert first.info.run_id == left and first.info.status == "FINISHED"
    assert "val_accuracy" in first.data.metrics
    study = optuna.load_study(study_name=job_id, storage=f"sqlite:///{tmp_path}/optuna.db")
    assert {t.user_attrs["elastune.trial"]: t.user_attrs["mlflow_run_id"] for t in study.trials}[
        0
    ] == left
