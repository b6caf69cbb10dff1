"""What a job leaves: its leaderboard, its best trial marked in MLflow, the best model
registered when it beats the newest registered version, a planned job's forecast next to
what it measured, and the summary ``elastune run`` prints (with an ``error`` when every
trial failed, and whether the deadline stopped it), also stored on the study.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from prefect import get_run_logger

from elastune.flows.forecast import CONTRADICTS, ForecastCheck
from elastune.flows.job import Job
from elastune.flows.job_log import JobLog, readable
from elastune.planners.search import Best
from elastune.planners.search.schedulers.base import Action, rank_key
from elastune.tasks.context import TrialContext


def leaderboard(job: Job) -> list[dict[str, Any]]:
    """Trials ranked by resource reached, then by loss at it; metric and configuration
    values to 4 significant digits."""
    loop, metric = job.loop, job.spec.metric

    def reached(trial: int) -> tuple[float, float]:
        return loop.reached.get(trial, (0, math.nan))

    ordered = sorted(loop.configs, key=lambda t: (-reached(t)[0], rank_key(reached(t)[1])))
    rows = []
    for trial in ordered:
        resource, loss = reached(trial)
        row = {
            "trial": trial,
            "status": loop.states.get(trial, Action.PAUSE).value,
            "rung": job.tally.rungs.get(trial, 0),
            "resource": resource,
            metric: job.spec.loss(loss) if math.isfinite(loss) else None,
            **loop.configs[trial],
        }
        rows.append(readable(row))
    return rows


def finish(job: Job, job_log: JobLog, check: ForecastCheck | None = None) -> dict[str, Any]:
    """End the job: the last decisions tracked and told, the best trial marked and its
    model registered, a planned job's forecast and measurement logged, the parent run
    ended. Returns the job's summary."""
    last = job.loop.finish()
    for decision in last:
        job.runs.track(decision, job.tally.errors.get(decision.trial))
    job.runs.drain()
    job_log.decided(last, ended=True)
    best = job.loop.best()
    tracker, parent = job.runs.tracker, job.runs.parent
    model = None
    if best is not None:
        tracker.set_tags(job.runs[best.trial], {"elastune.best": "true"})
        tracker.set_tags(parent, {"elastune.best_trial": best.trial})
        tracker.log_metrics(parent, {f"best_{job.spec.metric}": best.metric}, 0)
        model = register_best(job, best)
        tracker.set_tags(parent, {"elastune.registered": model["version"]})
    now = time.monotonic()
    wall_seconds = round(now - job.began, 3)
    checked = {} if check is None else check_forecast(job, check, wall_seconds)
    tracker.end_run(parent)
    summary = {
        "job_id": job.job_id,
        "best": None
        if best is None
        else {"trial": best.trial, "config": best.config, "metric": best.metric},
        "trials": len(job.loop.configs),
        "segments": job.tally.segments,
        "wall_seconds": wall_seconds,
        # The job's end after its last segment: a profile's job_tail_s (flows/calibrate.py).
        "tail_seconds": None if job.last_report is None else round(now - job.last_report, 3),
        "mlflow_run_id": parent,
        "optuna_storage": job.storage,
        "model": model,
        "mode": job.execution.mode.to_dict(),
        **checked,
    }
    if job.spec.budget.deadline is not None:  # passed: it stopped the job (flows/drive.py)
        summary["deadline"] = {
            "seconds": job.spec.budget.deadline,
            "passed": job.past_deadline(),
            "segments_cut": job.tally.cut,
        }
    if best is None and job.tally.errors:  # every trial failed: say why the first one did
        trial, error = next(iter(job.tally.errors.items()))
        summary["error"] = f"trial {trial}: {error}"
    job.mark_finished(summary)
    return summary


def check_forecast(job: Job, check: ForecastCheck, wall_seconds: float) -> dict[str, Any]:
    """Log the forecast and the measurement side by side in the parent run (metrics
    ``forecast_*`` and ``measured_*``, tag ``elastune.forecast``), warn of stages that
    contradict the profile; returns the summary's ``forecast`` and ``measured`` objects."""
    forecast, measured = check.forecast, check.measured(wall_seconds)
    contradictions = check.contradictions()
    if contradictions:
        measured["contradicts_profile"] = contradictions
        get_run_logger().warning(
            "the run contradicts the profile (over %gx): %s", CONTRADICTS, contradictions
        )
    metrics = {f"forecast_jct_{q}_s": v for q, v in forecast["jct_s"].items()}
    metrics |= {f"forecast_cost_{q}_usd": v for q, v in forecast["cost_usd"].items()}
    metrics |= {"measured_jct_s": wall_seconds, "measured_cost_usd": measured["cost_usd"]}
    tracker, parent = job.runs.tracker, job.runs.parent
    tracker.log_metrics(parent, metrics, 0)
    tracker.set_tags(parent, {"elastune.forecast": check.verdict(wall_seconds)})
    return {"forecast": forecast, "measured": measured}


def register_best(job: Job, best: Best) -> dict[str, Any]:
    """Register the best trial's model under the job's name when it beats the registered one.

    The trainable is called once more with nothing left to train: it builds its model and
    restores the best checkpoint, and the object it passes as ``model=`` is logged.
    """
    spec, tracker, run_id = job.spec, job.runs.tracker, job.runs[best.trial]
    previous = tracker.registered(spec.name)
    outcome: dict[str, Any] = {"name": spec.name, "version": None, "previous": None}
    if previous is not None:
        outcome["previous"] = {"version": previous[0], "metric": previous[1]}
        if spec.loss(best.metric) >= spec.loss(previous[1]):
            return outcome  # not better: the registry keeps its model
    ctx = TrialContext(
        trial=best.trial,
        start=0,
        stop=0,
        max_resource=job.ref.max_resource,
        run_id=run_id,
        tracker=tracker,
        seed=job.ref.trial_seed(best.trial),
    )
    try:
        job.prepared.trainable(dict(best.config), ctx)
    except (Exception, SystemExit) as exc:  # the job's results stand without a registry entry
        get_run_logger().warning("the trainable raised building the best model: %r", exc)
        return outcome
    model = ctx.objects.get("model")
    if not isinstance(model, torch.nn.Module):
        get_run_logger().warning("trainable passes no model= to ctx.restore; nothing registered")
        return outcome
    tags = {
        "elastune.metric": best.metric,
        "elastune.job_id": job.job_id,
        "elastune.trial": best.trial,
    }
    outcome["version"] = tracker.register(run_id, model, spec.name, tags)
    return outcome
