"""The default tuner (bloom + mf-tpe, a job file that names neither) through the real flow:
Prefect, MLflow and Optuna, training the tiny quadratic trainable."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.trial import TrialState

from elastune.flows.cli import main
from tests.helpers.jobs import JOB, assert_resumed_never_restarted, child_runs

# A real server: an ephemeral one can time out on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_the_default_tuner_promotes_by_resuming_from_checkpoints(tmp_path, stores, capsys):
    job = {k: v for k, v in JOB.items() if k not in ("sampler", "scheduler")}
    job["scheduler"] = {"max_resource": 9, "max_trials": 9}  # no name: the default
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    code = main(["run", str(path), "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["trials"] == 9 and summary["segments"] > 9  # some were promoted

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.data.tags["elastune.scheduler"] == "bloom"
    runs = child_runs(tmp_path, parent.info.run_id)
    # Rungs at 1, 3 and 9: every trial resumed where it paused, never from scratch.
    reached = sorted(assert_resumed_never_restarted(client, r.info.run_id)[-1] for r in runs)
    assert set(reached) <= {1, 3, 9} and reached[-1] == 9 and reached.count(1) < 9
    assert summary["best"]["metric"] > 0.9

    study = optuna.load_study(study_name=summary["job_id"], storage=summary["optuna_storage"])
    assert sum(t.state is TrialState.COMPLETE for t in study.trials) == reached.count(9)
    # Every trained epoch reached Optuna, which is what mf-tpe learns from.
    assert all(sorted(t.intermediate_values) == list(range(1, len(t.intermediate_values) + 1))
               for t in study.trials)  # fmt: skip
