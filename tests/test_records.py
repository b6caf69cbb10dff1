"""Records stay true: resuming a finished job changes
nothing, a job whose every trial failed says so, bad input answers before Prefect starts,
the plan's table keeps its values whole, and ``ctx.seed`` follows ``sampler.seed``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
import yaml
from mlflow import MlflowClient
from mlflow.entities import ViewType

import elastune.flows.tune
from elastune.flows.cli import main
from elastune.flows.job import Job
from elastune.flows.prepare import prepare
from elastune.flows.stored_job import stored_job
from elastune.planners.search import Segment
from elastune.planners.spec import parse_job
from elastune.tasks.contract import JobRef
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import run_segment

ROOT = Path(__file__).resolve().parent.parent
JOB = {
    "name": "records",
    "trainable": "tests.trainables:quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 3},
    "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 3},
    "compute": {"workers": 2},
}


def run(tmp: Path, stores: list[str], capsys: pytest.CaptureFixture[str], **changes: Any):
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    code = main(["run", str(path), "--json", *stores])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def records(tmp: Path, storage: str, job_id: str) -> dict[str, Any]:
    """Every MLflow run's times, status and tags, the registry, and the Optuna study."""
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments(ViewType.ALL)]
    runs = {
        r.info.run_id: (r.info.start_time, r.info.end_time, r.info.status, r.data.tags)
        for r in client.search_runs(experiments, run_view_type=ViewType.ALL)
    }
    versions = [
        (v.name, v.version, v.run_id, v.tags, v.last_updated_timestamp)
        for v in client.search_model_versions()
    ]
    study = optuna.load_study(study_name=job_id, storage=storage)
    trials = [(t.number, t.state, t.user_attrs, t.datetime_complete) for t in study.trials]
    return {"runs": runs, "versions": versions, "study": study.user_attrs, "trials": trials}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_resuming_a_finished_job_changes_nothing_and_says_so(tmp_path, stores, capsys) -> None:
    code, summary, err = run(tmp_path, stores, capsys)
    assert code == 0, err
    job_id, storage = summary["job_id"], summary["optuna_storage"]
    assert summary["model"]["version"] == "1"
    before = records(tmp_path, storage, job_id)

    code = main(["resume", job_id, "--storage", storage, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"job {job_id} finished at "), err
    assert lines[0].endswith(": nothing to resume"), err
    again = json.loads(out)
    assert again["already_finished"] is True
    assert {k: again[k] for k in summary} == summary  # the stored summary, not a new one
    assert records(tmp_path, storage, job_id) == before

    # Replaying the journal (what resuming an unfinished job does) rewrites no finished
    # run's end time, status or tags.
    stored = stored_job(job_id, storage)
    Job.resume(prepare(stored.spec), stored)
    assert records(tmp_path, storage, job_id) == before


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_job_whose_every_trial_fails_exits_1_with_the_error(tmp_path, stores, capsys) -> None:
    code, summary, err = run(tmp_path, stores, capsys, trainable="tests.trainables:missing_key")
    assert code == 1, err
    assert summary["best"] is None
    assert "KeyError" in summary["error"] and "learning_rate" in summary["error"]
    assert "every trial failed" in err and "KeyError: 'learning_rate'" in err


def no_prefect(*args: object, **kwargs: object) -> None:
    raise AssertionError("Prefect started for input that needs no server")


def test_unknown_job_id_answers_before_prefect(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(elastune.flows.tune, "resume", no_prefect)
    optuna.create_study(study_name="other", storage=f"sqlite:///{tmp_path}/optuna.db")
    for storage in (f"sqlite:///{tmp_path}/optuna.db", f"sqlite:///{tmp_path}/none.db"):
        assert main(["resume", "no-such-job", "--storage", storage]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: job id: no job 'no-such-job'"), err


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("tracking.mlflow_uri=nonsense", "tracking.mlflow_uri"),
        ("tracking.optuna_storage=sqlite:////no/such/folder/optuna.db", "folder"),
        ("compute.pool=gpu/pool", "compute.pool"),
    ],
)
def test_stores_and_pool_names_answer_before_prefect(
    override, field, tmp_path, stores, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(elastune.flows.tune, "tune_prepared", no_prefect)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    assert main(["run", str(path), *stores, "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and field in err, err


def test_plan_table_values_stay_whole_when_narrow_or_piped(monkeypatch, capsys) -> None:
    job = str(ROOT / "examples" / "cloud.yaml")
    assert main(["plan", job, "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    for columns in ("80", "100"):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["plan", job]) == 0
        out = capsys.readouterr().out
        for stage in stages:
            allocation = f"{stage['instance_type']} × {stage['instances']}"
            assert allocation in out, out
            assert f"${stage['cost_usd']:,.2f}" in out, out


def test_trials_initialise_from_the_job_seed(tmp_path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "seeds")

    def first_weight(seed: int) -> float:
        data = {**JOB, "trainable": "tests.trainables:seeded_init", "sampler": {"seed": seed}}
        job = JobRef.of(parse_job(data), "job", uri)
        run_id = tracker.start_trial("job", "parent", 0, {})
        report = run_segment(job, Segment(trial=0, start=0, stop=1, rung=0), {}, run_id)
        return report.result.history[0][1]

    assert first_weight(1) == first_weight(1)
    assert first_weight(1) != first_weight(2)


def test_the_registry_compares_with_the_newest_tagged_version(tmp_path) -> None:
    """docs/cli.md and docs/architecture.md §5: a new version only when strictly better
    than the newest version carrying ``elastune.metric``; untagged versions are skipped."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "registry")
    model = torch.nn.Linear(1, 1)
    for metric in (0.9, 0.5):
        run_id = tracker.start_trial("job", "parent", 0, {})
        tracker.register(run_id, model, "net", {"elastune.metric": metric})
    tracker.register(tracker.start_trial("job", "parent", 1, {}), model, "net", {})
    assert tracker.registered("net") == ("2", 0.5)
