"""Checkpoints in MLflow: one file per resource level; a torn file is never loaded."""

from __future__ import annotations

import io
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from elastune.tasks.context import TrialContext
from elastune.tasks.tracking import Tracker


def context(tracker: Tracker, run_id: str, stop: float) -> TrialContext:
    return TrialContext(trial=0, start=0, stop=stop, max_resource=9, run_id=run_id, tracker=tracker)


def test_a_torn_checkpoint_falls_back_to_the_previous_level(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "ckpt")
    run_id = tracker.start_trial("job", "parent", 0, {"x": 1})
    model = torch.nn.Linear(2, 1)
    ctx = context(tracker, run_id, stop=2)
    for epoch in ctx.range(ctx.restore(model=model)):
        with torch.no_grad():
            model.bias.fill_(float(epoch))
        ctx.checkpoint(model=model)
    # A crash while writing level 3 leaves a truncated file behind.
    buffer = io.BytesIO()
    torch.save({"resource": 3, "state": {"model": model.state_dict()}}, buffer)
    tracker.save_checkpoint(run_id, buffer.getvalue()[:40], 3)
    assert [r for r, _ in tracker.checkpoints(run_id)] == [3, 2, 1]

    fresh = torch.nn.Linear(2, 1)
    resumed = context(tracker, run_id, stop=4)
    assert resumed.restore(model=fresh) == 2  # level 3 is unreadable: level 2 is used
    assert fresh.bias.item() == 2.0
    assert list(resumed.range()) == [3, 4]


def test_no_checkpoint_means_a_fresh_trial(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "ckpt")
    run_id = tracker.start_trial("job", "parent", 0, {})
    ctx = context(tracker, run_id, stop=3)
    assert ctx.restore(model=torch.nn.Linear(1, 1)) == 0
    assert list(ctx.range()) == [1, 2, 3]


def test_a_segment_whose_report_was_lost_is_recovered_not_failed(tmp_path: Path) -> None:
    from elastune.planners.search import Segment
    from elastune.tasks.contract import JobRef
    from elastune.tasks.train import run_segment

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    job = JobRef("job", "tests.trainables:quadratic", "val_accuracy", "max", 9, uri, "ckpt")
    tracker = Tracker(uri, "ckpt")
    run_id = tracker.start_trial("job", "parent", 0, {"x": 0.5})
    segment = Segment(trial=0, start=0, stop=2, rung=0)
    first = run_segment(job, segment, {"x": 0.5}, run_id)
    # The driver died after the checkpoint at 2 but before it recorded the report, so the
    # segment runs again: it restores at its stop and has nothing left to train.
    again = run_segment(job, segment, {"x": 0.5}, run_id)
    assert not again.result.failed
    assert again.result.loss == first.result.loss and again.result.resource == 2
    assert again.result.history == first.result.history


def test_a_segment_resumed_mid_way_reports_the_epochs_before_the_crash(tmp_path: Path) -> None:
    from elastune.planners.search import Segment
    from elastune.tasks.contract import JobRef
    from elastune.tasks.train import run_segment

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    job = JobRef("job", "tests.trainables:quadratic", "val_accuracy", "max", 9, uri, "ckpt")
    tracker = Tracker(uri, "ckpt")
    uninterrupted = run_segment(
        job, Segment(0, 0, 3, 0), {"x": 0.5}, tracker.start_trial("job", "p", 0, {"x": 0.5})
    )
    run_id = tracker.start_trial("job", "p", 1, {"x": 0.5})
    run_segment(job, Segment(1, 0, 1, 0), {"x": 0.5}, run_id)  # died after epoch 1's checkpoint
    retried = run_segment(job, Segment(1, 0, 3, 0), {"x": 0.5}, run_id)  # the retry: 0 -> 3
    assert [r for r, _ in retried.result.history] == [1, 2, 3]
    assert retried.result.history == uninterrupted.result.history
    assert retried.result.loss == uninterrupted.result.loss


def test_a_spooled_segment_hands_its_newest_checkpoint_and_metrics_to_mlflow(
    tmp_path: Path,
) -> None:
    from elastune.tasks.checkpoint_spool import Spool

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "ckpt")
    spool = Spool(tmp_path / "spool")
    run_id = tracker.start_trial("job", "parent", 0, {})
    model = torch.nn.Linear(2, 1)
    ctx = TrialContext(
        trial=0, start=0, stop=3, max_resource=9, run_id=run_id, tracker=tracker, spool=spool
    )
    for epoch in ctx.range(ctx.restore(model=model)):
        ctx.report(val_accuracy=epoch / 10)
        ctx.checkpoint(model=model)
        assert tracker.checkpoints(run_id) == []  # kept locally while the segment trains
    ctx.finish()
    assert [r for r, _ in tracker.checkpoints(run_id)] == [3]  # only the segment's last
    assert tracker.metric_history(run_id, "val_accuracy") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert spool.files(run_id) == []


def test_a_killed_spooled_segment_loses_only_what_followed_its_last_checkpoint(
    tmp_path: Path,
) -> None:
    from elastune.tasks.checkpoint_spool import Spool

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "ckpt")
    spool = Spool(tmp_path / "spool")
    run_id = tracker.start_trial("job", "parent", 0, {})

    def segment(stop: int) -> TrialContext:
        return TrialContext(
            trial=0,
            start=0,
            stop=stop,
            max_resource=9,
            run_id=run_id,
            tracker=tracker,
            spool=spool,
        )

    killed, model = segment(6), torch.nn.Linear(2, 1)
    for epoch in killed.range(killed.restore(model=model)):
        with torch.no_grad():
            model.bias.fill_(float(epoch))
        killed.report(val_accuracy=epoch / 10)
        if epoch <= 4:
            killed.checkpoint(model=model)
        if epoch == 2:
            killed._write_metrics()  # the periodic write happened after epoch 2
        if epoch == 5:
            break  # killed after reporting epoch 5, before its checkpoint: no finish()
    retry, fresh = segment(6), torch.nn.Linear(2, 1)
    assert retry.restore(model=fresh) == 4 and fresh.bias.item() == 4.0
    assert [r for r, _ in tracker.checkpoints(run_id)] == [4]
    # Epochs 1-4 logged once each (3 and 4 from the checkpoint); epoch 5 is trained again.
    assert [s for s, _ in tracker.metric_history(run_id, "val_accuracy")] == [1, 2, 3, 4]
    assert spool.files(run_id) == []


def test_a_new_store_is_mlflows_empty_schema_made_once_per_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new SQLite store starts from the cache's empty copy: the same schema as the one
    MLflow migrates itself, MLflow's migrations run once, not per store, and nothing of
    the cache's own in it (MLflow adds its Default experiment to each store itself)."""
    import sqlalchemy
    from mlflow import MlflowClient
    from mlflow.store.db import utils

    monkeypatch.setenv("ELASTUNE_CACHE", str(tmp_path / "cache"))
    migrations = []
    initialize = utils._initialize_tables
    monkeypatch.setattr(utils, "_initialize_tables", lambda e: migrations.append(initialize(e)))

    def schema(database: Path) -> dict[str, list[str]]:
        inspector = sqlalchemy.inspect(sqlalchemy.create_engine(f"sqlite:///{database}"))
        tables = inspector.get_table_names()
        return {t: sorted(c["name"] for c in inspector.get_columns(t)) for t in tables}

    first, second = (Tracker(f"sqlite:///{tmp_path}/{n}/mlflow.db", "e") for n in "ab")
    assert len(migrations) == 1  # the cache's copy; the second store is copied from it
    MlflowClient(f"sqlite:///{tmp_path}/own/mlflow.db").search_experiments()  # MLflow's own
    assert len(migrations) == 2
    assert schema(tmp_path / "b/mlflow.db") == schema(tmp_path / "own/mlflow.db")
    empty = sqlalchemy.create_engine(f"sqlite:///{next((tmp_path / 'cache').glob('*.db'))}")
    with empty.connect() as connection:
        assert connection.execute(sqlalchemy.text("select count(*) from experiments")).scalar() == 0
    assert second.client.get_experiment("0").name == "Default"
    run = first.client.create_run(first.experiment_id)  # a working store
    assert first.client.get_run(run.info.run_id).info.experiment_id == first.experiment_id


def test_a_time_limit_that_falls_due_while_ctx_writes_leaves_the_store_unlocked(
    tmp_path: Path,
) -> None:
    """The limit is raised into the training thread; were it raised inside one of MLflow's
    SQLite transactions, the store would stay locked for every other connection."""
    from elastune.planners.search import Segment
    from elastune.tasks.contract import JobRef
    from elastune.tasks.train import run_segment

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    trainable = "tests.trainables:checkpoints_until_stopped"
    job = JobRef("job", trainable, "val_accuracy", "max", 9, uri, "ckpt", segment_timeout=0.2)
    tracker = Tracker(uri, "ckpt")
    reports = []

    def segments() -> None:  # a thread, as segments train on the local pool and on nodes
        for trial in range(12):
            run_id = tracker.start_trial("job", "parent", trial, {"x": 0.5})
            reports.append((run_id, run_segment(job, Segment(trial, 0, 1, 0), {"x": 0.5}, run_id)))
            other = sqlite3.connect(tmp_path / "mlflow.db", timeout=0)
            other.execute("BEGIN IMMEDIATE")  # raises "database is locked" if a lock was left
            other.rollback()
            other.close()

    thread = threading.Thread(target=segments)
    thread.start()
    thread.join()
    assert len(reports) == 12
    for run_id, report in reports:
        assert report.result.failed and report.error == "timeout: segment ran over 0.2 s"
        # What the trial reported before the limit is in MLflow, as its report says.
        logged = tracker.metric_history(run_id, "val_accuracy")
        assert len(logged) >= len(report.result.history) >= 1


def test_a_runs_artifact_store_is_never_read_from_the_run_by_its_creator_or_whom_it_tells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment's report and checkpoints go to its run's artifact store without reading the
    run back (a request per segment to a tracking server): the driver knows it from creating
    the run, and a node from the driver."""
    from elastune.tasks import tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setattr(tracking, "_repositories", OrderedDict())
    tracker = Tracker(uri, "reports")
    run_id = tracker.start_trial("job", "parent", 0, {})
    location = tracker.artifact_location(run_id)

    def unexpected(run_id: str) -> None:
        raise AssertionError(f"run {run_id} read back")

    monkeypatch.setattr(tracker.client, "get_run", unexpected)
    assert tracker.load_report(run_id, "0-1") is None
    tracker.save_report(run_id, "0-1", {"seconds": 1.0})
    assert tracker.load_report(run_id, "0-1") == {"seconds": 1.0}
    tracker.save_checkpoint(run_id, b"state", 1)
    assert tracker.load_checkpoint(run_id, lambda f: f.read()) == (1, b"state")
    tracker.end_run(run_id, "FAILED")

    monkeypatch.setattr(tracking, "_repositories", OrderedDict())  # another process
    tracker.know_artifacts(run_id, location)
    assert tracker.load_report(run_id, "0-1") == {"seconds": 1.0}
    monkeypatch.undo()
    assert tracker.status(run_id) == "FAILED"


def test_a_segments_own_tags_go_with_its_metrics_and_are_not_set_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment's width costs no request of its own: it goes with the segment's first
    metrics, or alone at its end when the segment logged none; set again with the same
    value, it is not written again."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "tags")
    run_id = tracker.start_trial("job", "parent", 0, {})
    batches: list[tuple[int, list[str]]] = []
    log_batch = tracker.client.log_batch

    def counted(run_id: str, metrics=(), params=(), tags=(), **kwargs) -> None:
        batches.append((len(metrics), sorted(t.key for t in tags)))
        log_batch(run_id, metrics=metrics, params=params, tags=tags, **kwargs)

    monkeypatch.setattr(tracker.client, "log_batch", counted)
    tracker.keep_tags(run_id, {"elastune.gpus": 1})
    assert batches == []
    tracker.log_history(run_id, [(1, {"acc": 0.5}), (2, {"acc": 0.6})])
    tracker.flush_tags(run_id)
    assert batches == [(2, ["elastune.gpus"])]
    tracker.keep_tags(run_id, {"elastune.gpus": 1})  # the next segment, at the same width
    tracker.log_history(run_id, [(3, {"acc": 0.7})])
    tracker.keep_tags(run_id, {"elastune.gpus": 2})  # one that logs nothing, wider
    tracker.flush_tags(run_id)
    assert batches[1:] == [(1, []), (0, ["elastune.gpus"])]
    assert tracker.client.get_run(run_id).data.tags["elastune.gpus"] == "2"
