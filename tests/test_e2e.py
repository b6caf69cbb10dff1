"""A tiny job end to end through Prefect (ephemeral server), MLflow (SQLite) and Optuna."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.trial import TrialState

from elastune.flows.cli import main
from elastune.tasks.train import GIVE_UP_GRACE_SECONDS
from tests.helpers.jobs import (
    JOB,
    assert_resumed_never_restarted,
    child_runs,
    run_job,
    runs_by_trial,
)

pytestmark = pytest.mark.slow


def test_tiny_job_end_to_end(tmp_path, stores, capsys) -> None:
    code, summary, err = run_job(tmp_path, stores, capsys)
    assert code == 0, err
    assert err.splitlines()[0] == f"job {summary['job_id']}"
    assert summary["trials"] == 9 and summary["segments"] == 13
    assert summary["best"]["metric"] > 0.9

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.data.tags["elastune.scheduler"] == "sha"
    assert parent.data.params["scheduler.eta"] == "3"
    runs = child_runs(tmp_path, parent.info.run_id)
    assert len(runs) == 9
    status = {int(r.data.tags["elastune.trial"]): r.data.tags["elastune.status"] for r in runs}
    assert sorted(status.values()) == ["complete"] + ["stop"] * 8
    for run in runs:
        steps = assert_resumed_never_restarted(client, run.info.run_id)
        if run.data.tags["elastune.status"] == "complete":
            assert steps[-1] == 9
            assert run.data.tags.get("elastune.best") == "true"
    # Each segment hands its last checkpoint to MLflow (the others stay in the local spool,
    # docs/durability.md): the complete trial's segments ended at 1, 3 and 9.
    best_run = next(r for r in runs if r.data.tags["elastune.status"] == "complete")
    levels = sorted(a.path for a in client.list_artifacts(best_run.info.run_id, "checkpoints"))
    assert levels == [f"checkpoints/resource-{r}.pt" for r in (1, 3, 9)]
    (version,) = client.search_model_versions("name = 'tiny'")
    assert version.run_id == best_run.info.run_id

    study = optuna.load_study(study_name=summary["job_id"], storage=summary["optuna_storage"])
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 1 and states.count(TrialState.PRUNED) == 8
    assert study.best_trial.value == pytest.approx(summary["best"]["metric"])
    assert sorted(study.best_trial.intermediate_values) == list(range(1, 10))

    from prefect.artifacts import Artifact

    board = Artifact.get(f"{summary['job_id']}-leaderboard")
    assert board is not None and board.type == "table"
    assert Artifact.get(f"{summary['job_id']}-plan").type == "markdown"


def test_a_job_trains_in_workers_with_their_imports_frozen(tmp_path, stores, capsys) -> None:
    """The command imports with Python's collector paused; its trials train in worker
    processes with it on, the objects their fork server imported frozen (full collections do
    not walk them again); after the command the process collects as before
    (flows/gc_freeze.py, tasks/worker_processes.py)."""
    gc.collect()  # what the test process left, so that the freeze below is the command's
    code, summary, err = run_job(
        tmp_path, stores, capsys, trainable="tests.trainables:collector", compute={"workers": 1}
    )
    assert code == 0, err
    seen = [r.data.metrics for r in child_runs(tmp_path, summary["mlflow_run_id"])]
    assert seen and all(m["gc_on"] == 1.0 for m in seen)
    assert all(m["frozen"] > 10_000 for m in seen)  # the imports' objects: about a million
    assert all(m["pid"] != os.getpid() for m in seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_command_leaves_what_lives_at_exit_out_of_the_last_collections(tmp_path) -> None:
    """At the process's exit every object left is frozen, so CPython's last collections do
    not walk them (seconds after a job, flows/gc_freeze.py): a handler registered before the
    command runs after its own and sees them frozen."""
    code = (
        "import atexit, gc\n"
        "atexit.register(lambda: print(gc.get_freeze_count()))\n"
        "from elastune.flows.cli import main\n"
        "raise SystemExit(main(['plan', 'missing.yaml']))\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 2, done.stderr  # bad input, after the handler was registered
    assert int(done.stdout.split()[-1]) > 10_000  # the modules the command imported


def test_asha_promotes_by_resuming_from_checkpoints(tmp_path, stores, capsys) -> None:
    scheduler = {"name": "asha", "eta": 3, "min_resource": 1, "max_resource": 9, "max_trials": 12}
    code, summary, err = run_job(tmp_path, stores, capsys, scheduler=scheduler)
    assert code == 0, err
    assert summary["trials"] == 12 and summary["segments"] > 12  # some were promoted
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = child_runs(tmp_path, summary["mlflow_run_id"])
    reached = [assert_resumed_never_restarted(client, r.info.run_id)[-1] for r in runs]
    assert max(reached) == 9 and reached.count(1) < len(reached)


def test_failing_nan_and_hung_trials_are_marked_failed_and_the_job_goes_on(
    tmp_path, stores, capsys
) -> None:
    for trainable, reason in [
        ("flaky", "diverged"),
        ("nan_for_small_x", "is nan"),
        ("hangs_for_small_x", "timeout: segment ran over 2 s"),
        ("exits_for_small_x", "SystemExit: 3"),
        ("bad_resource_for_small_x", "resource must be a number in [0, 2**53], got nan"),
        ("silent_for_small_x", "reported no 'val_accuracy' (it reported: nothing)"),
        ("numpy_checkpoint_for_small_x", "torch.load(weights_only=True) refuses"),
    ]:
        code, summary, err = run_job(
            tmp_path,
            stores,
            capsys,
            trainable=f"tests.trainables:{trainable}",
            sampler={"name": "random", "seed": 1},
            compute={"workers": 2, "segment_timeout": "2s"},
        )
        assert code == 0, err
        runs = child_runs(tmp_path, summary["mlflow_run_id"])
        failed = [r for r in runs if r.info.status == "FAILED"]
        assert failed, "the seed must draw some x < 0.3"
        assert all(reason in r.data.tags["elastune.error"] for r in failed)
        assert all(r.data.tags["elastune.status"] == "fail" for r in failed)
        study = optuna.load_study(study_name=summary["job_id"], storage=summary["optuna_storage"])
        assert sum(t.state is TrialState.FAIL for t in study.trials) == len(failed)
        assert summary["best"] is not None


def test_a_segment_still_writing_past_its_limit_is_waited_for(
    tmp_path, stores, capsys, monkeypatch
) -> None:
    """A segment leaves behind a trainable blocked past its limit (tests/test_ephemeral.py),
    never one that trained within it while it hands its metrics and checkpoint to MLflow:
    that segment finished, and is kept."""
    monkeypatch.setenv("ELASTUNE_TEST_FINISH_SECONDS", str(2 + GIVE_UP_GRACE_SECONDS + 1))
    code, summary, err = run_job(
        tmp_path,
        stores,
        capsys,
        trainable="tests.trainables:slow_finish_in_trial_0",
        scheduler={"name": "random", "max_resource": 1, "max_trials": 2},
        compute={"workers": 2, "segment_timeout": "2s"},
    )
    assert code == 0, err
    runs = runs_by_trial(tmp_path, summary)
    assert runs["0"].info.status == "FINISHED", runs["0"].data.tags.get("elastune.error")
    assert "val_accuracy" in runs["0"].data.metrics


def test_a_trial_that_crashes_its_process_fails_alone(tmp_path, stores, capsys) -> None:
    """A trainable that takes its worker process down (a segfault) fails its trial; the
    job goes on, and the next segment trains in a new worker."""
    code, summary, err = run_job(
        tmp_path,
        stores,
        capsys,
        trainable="tests.trainables:crashes_in_trial_0",
        scheduler={"name": "random", "max_resource": 2, "max_trials": 4},
        compute={"workers": 1},
    )
    assert code == 0, err
    runs = runs_by_trial(tmp_path, summary)
    assert runs["0"].info.status == "FAILED"
    assert runs["0"].data.tags["elastune.error"].endswith("was killed by SIGSEGV")
    assert [runs[t].info.status for t in "123"] == ["FINISHED"] * 3
    assert summary["trials"] == 4 and summary["best"]["trial"] != 0


def test_a_trainable_that_raises_building_the_best_model_leaves_the_job_done(
    tmp_path, stores, capsys, caplog
) -> None:
    trainable = "tests.trainables:raises_with_nothing_to_train"
    code, summary, err = run_job(tmp_path, stores, capsys, trainable=trainable)
    assert code == 0, err
    assert summary["best"] is not None and summary["model"]["version"] is None
    assert "the trainable raised building the best model" in caplog.text
    assert "no epochs, no model" in caplog.text


def test_metric_never_reported_is_bad_input_and_leaves_nothing(tmp_path, stores, capsys) -> None:
    code, summary, err = run_job(
        tmp_path, stores, capsys, trainable="tests.trainables:wrong_metric"
    )
    assert code == 2 and summary is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: metric:") and "'val_accuracy'" in last and "accuracy" in last
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_experiment_by_name("tiny") is None
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert client.search_runs(experiments) == []
    assert optuna.get_all_study_names(f"sqlite:///{tmp_path}/optuna.db") == []


def test_cli_process_prints_only_json_on_stdout(tmp_path, stores) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, "scheduler": {**JOB["scheduler"], "max_resource": 3}}))
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "elastune.flows.cli", "run", str(path), "--json", *stores],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert done.stdout.count("\n") == 1
    assert done.stderr.splitlines()[0] == f"job {summary['job_id']}"
    assert set(summary) == {
        "job_id",
        "best",
        "trials",
        "segments",
        "wall_seconds",
        "tail_seconds",
        "mlflow_run_id",
        "optuna_storage",
        "model",
        "mode",
    }
    assert summary["model"]["version"] == "1" and summary["model"]["previous"] is None


def test_profile_measures_seconds_per_unit_and_feeds_the_planner(
    tmp_path, capsys, monkeypatch
) -> None:
    # The loop end to end, once: repeats and lengths are tests/test_forecast.py's (this
    # trainable's instant units would ask for 3 x 4 jobs, one of 50 levels and two of 14
    # waves, 3 minutes).
    monkeypatch.setattr("elastune.flows.calibrate.MAX_LEVELS", 3)
    monkeypatch.setattr("elastune.flows.calibrate.WAVES_S", 0.5)  # 4 waves
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    out = tmp_path / "profile.yaml"
    assert main(["profile", str(path), "--json", "--out", str(out), "--repeats", "1"]) == 0
    printed = capsys.readouterr()
    measured = json.loads(printed.out)
    # The minutes it takes are told as they go, on stderr.
    assert "timing 2 configurations x 3 units here" in printed.err
    assert "calibration 4/4 (4 waves x 1 levels + 2 resumed): job " in printed.err, printed.err
    assert measured["profile"]["seconds_per_unit"]["1"] > 0
    assert {"overhead_s", "trial_overhead_s", "job_overhead_s"} <= set(measured["profile"])
    assert len(measured["calibration_walls_s"]) == 4  # the fourth resumes trials
    # The written section is a valid profile: the job plans with it.
    job = {**JOB, **yaml.safe_load(out.read_text()), "budget": {"deadline": "1h"}}
    path.write_text(yaml.safe_dump(job))
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stages"] and plan["jct_s"]["p95"] > 0


def test_a_planned_job_runs_with_the_plan_allocations(tmp_path, stores, capsys) -> None:
    profile = {"seconds_per_unit": {1: 60}, "speedup": {2: 1.8, 4: 3.2}}
    code, summary, err = run_job(
        tmp_path,
        stores,
        capsys,
        budget={"deadline": "2h"},
        profile=profile,
        compute={"workers": 2, "instance_types": ["g5.xlarge", "g5.12xlarge"]},
    )
    assert code == 0, err
    assert summary["segments"] == 13
    from prefect.artifacts import Artifact

    plan = Artifact.get(f"{summary['job_id']}-plan").data
    assert "g5." in plan  # each stage names the instance type the cost planner chose
