"""Checkpoints in MLflow: one file per resource level; a torn file is never loaded."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from tasks.context import TrialContext
from tasks.tracking import Tracker


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
