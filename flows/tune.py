"""The tune flow: drive the job's scheduler against real Prefect task runs.

One loop serves every scheduler. While workers are free it submits the segments the
scheduler hands out; as each finishes (in completion order) it records the result, which
may promote, pause or stop trials. A synchronous scheduler (SHA, Hyperband) hands out
nothing at a rung's barrier, so the same loop walks its plan stage by stage; an
asynchronous one (ASHA) keeps every worker busy.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any

import mlflow
import optuna
import torch
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pools import WorkerLost, launch_segment, lost, segment_deployment
from flows.progress import JobProgress
from planners.loop import TuningLoop
from planners.plan import Plan, compile_plan
from planners.schedulers.base import Action, Decision, Segment, rank_key
from planners.space import make_sampler
from planners.spec import JobSpec, SpecError, load_job
from tasks.context import TrialContext
from tasks.tracking import Tracker, flatten, local_uri
from tasks.train import JobRef, SegmentReport, load_trainable, train_segment


class MetricNotReported(SpecError):
    """The trainable finished a segment without ever reporting the job's metric."""


def new_job_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}".lower()


def artifact_key(job_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{job_id}-{what}".lower())


class Job:
    """The state of one running job: its study, scheduler loop, MLflow runs and progress."""

    def __init__(self, spec: JobSpec, job_id: str):
        # Resolve the pool first: a missing pool is bad input, found before anything exists.
        self.deployment = (
            None if spec.compute.pool == "local" else segment_deployment(spec.compute.pool)
        )
        self.spec = spec
        self.job_id = job_id
        self.began = time.monotonic()
        self.tracker = Tracker(spec.tracking.mlflow_uri, spec.experiment)
        self.storage = local_uri(spec.tracking.optuna_storage)
        self.study = optuna.create_study(
            study_name=job_id,
            storage=self.storage,
            direction="maximize" if spec.mode == "max" else "minimize",
            sampler=make_sampler(spec),
        )
        self.loop = TuningLoop(spec, self.study)
        self.plan: Plan = compile_plan(spec)
        self.ref = JobRef.of(spec, job_id, self.tracker.uri)
        self.parent = self.tracker.start_job(
            job_id,
            flatten(spec.model_dump(mode="json")),
            {"elastune.scheduler": spec.scheduler.name, "elastune.sampler": spec.sampler.name},
        )
        self.study.set_user_attr("mlflow_run_id", self.parent)
        self.runs: dict[int, str] = {}
        self.rungs: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        self.segments = 0
        self._stage_results: dict[tuple[int, int], int] = {}
        self._metric_seen = False

    # --- one segment ---------------------------------------------------------------------

    def submit(self, segment: Segment) -> PrefectFuture[SegmentReport]:
        if segment.trial not in self.runs:
            config = self.loop.configs[segment.trial]
            self.runs[segment.trial] = self.tracker.start_trial(
                self.job_id, self.parent, segment.trial, config
            )
        run_id = self.runs[segment.trial]
        if segment.clone_from is not None:
            self.tracker.copy_checkpoint(self.runs[segment.clone_from], run_id)
        config = self.loop.configs[segment.trial]
        if self.deployment is None:
            return train_segment.submit(self.ref, segment, config, run_id)
        deployment, accepted = self.deployment
        stage = self.plan.stage(segment.bracket, segment.rung)
        variables = {"gpu_count": f"{stage.gpus_per_trial:g}"}
        return launch_segment.submit(
            deployment,
            self.ref,
            segment,
            config,
            run_id,
            {k: v for k, v in variables.items() if k in accepted},
        )

    def record(self, segment: Segment, report: SegmentReport) -> list[Decision]:
        self.segments += 1
        if self.spec.metric in report.metrics_seen:
            self._metric_seen = True
        elif report.error is None and not self._metric_seen:
            seen = ", ".join(report.metrics_seen) or "nothing"
            raise MetricNotReported(
                f"metric: {self.spec.trainable} never reported {self.spec.metric!r} "
                f"(it reported: {seen})"
            )
        if report.result.failed:
            self.errors[segment.trial] = report.error or f"no {self.spec.metric} reported"
        self.rungs[segment.trial] = segment.rung
        decisions = self.loop.record(report.result)
        for decision in decisions:
            self._track(decision)
        return decisions

    def _track(self, decision: Decision) -> None:
        run_id = self.runs[decision.trial]
        tags: dict[str, Any] = {"elastune.status": decision.action.value}
        if decision.rung >= 0:
            tags["elastune.rung"] = decision.rung
        if decision.action is Action.FAIL:
            tags["elastune.error"] = self.errors.get(decision.trial, "")[:5000]
        self.tracker.set_tags(run_id, tags)
        if decision.action in (Action.STOP, Action.COMPLETE):
            self.tracker.end_run(run_id)
        elif decision.action is Action.FAIL:
            self.tracker.end_run(run_id, "FAILED")

    def stage_done(self, segment: Segment) -> bool:
        key = (segment.bracket, segment.rung)
        self._stage_results[key] = self._stage_results.get(key, 0) + 1
        return self._stage_results[key] == self.plan.stage(*key).trials

    # --- reports -------------------------------------------------------------------------

    def leaderboard(self) -> list[dict[str, Any]]:
        """Trials ranked by resource reached, then by loss at it."""

        def reached(trial: int) -> tuple[float, float]:
            return self.loop.reached.get(trial, (0, math.nan))

        rows = []
        for trial in sorted(
            self.loop.configs, key=lambda t: (-reached(t)[0], rank_key(reached(t)[1]))
        ):
            resource, loss = reached(trial)
            rows.append(
                {
                    "trial": trial,
                    "status": self.loop.states.get(trial, Action.PAUSE).value,
                    "rung": self.rungs.get(trial, 0),
                    "resource": resource,
                    self.spec.metric: self.spec.loss(loss) if math.isfinite(loss) else None,
                    **self.loop.configs[trial],
                }
            )
        return rows

    def best_metric(self) -> float | None:
        best = self.loop.best()
        return None if best is None else best.metric

    def finish(self) -> dict[str, Any]:
        for decision in self.loop.finish():
            self._track(decision)
        best = self.loop.best()
        if best is not None:
            run_id = self.runs[best.trial]
            self.tracker.set_tags(run_id, {"elastune.best": "true"})
            self.tracker.set_tags(self.parent, {"elastune.best_trial": best.trial})
            self.tracker.log_metrics(self.parent, {f"best_{self.spec.metric}": best.metric}, 0)
            register_best(self.spec, self.ref, best.trial, best.config, run_id)
        self.tracker.end_run(self.parent)
        return {
            "job_id": self.job_id,
            "best": None
            if best is None
            else {"trial": best.trial, "config": best.config, "metric": best.metric},
            "trials": len(self.loop.configs),
            "segments": self.segments,
            "wall_seconds": round(time.monotonic() - self.began, 3),
            "mlflow_run_id": self.parent,
            "optuna_storage": self.storage,
        }

    def abort(self, bad_input: bool) -> None:
        """A failed job keeps what it finished; bad input leaves nothing behind."""
        if bad_input:
            self.tracker.purge([self.parent, *self.runs.values()])
            optuna.delete_study(study_name=self.job_id, storage=self.storage)
        else:
            for run_id in (*self.runs.values(), self.parent):
                self.tracker.end_run(run_id, "FAILED")


def register_best(
    spec: JobSpec, ref: JobRef, trial: int, config: dict[str, Any], run_id: str
) -> None:
    """Rebuild the best trial's model from its last checkpoint and register it.

    The trainable is called once more with nothing left to train: it builds its model and
    restores the checkpoint, and the object it passes as ``model=`` is logged.
    """
    tracker = Tracker(ref.mlflow_uri, ref.experiment)
    ctx = TrialContext(
        trial=trial, start=0, stop=0, max_resource=ref.max_resource, run_id=run_id, tracker=tracker
    )
    load_trainable(spec.trainable)(dict(config), ctx)
    model = ctx.objects.get("model")
    if not isinstance(model, torch.nn.Module):
        get_run_logger().warning("trainable passes no model= to ctx.restore; nothing registered")
        return
    mlflow.set_tracking_uri(tracker.uri)
    with mlflow.start_run(run_id=run_id):
        mlflow.pytorch.log_model(
            model,
            name="model",
            serialization_format="pickle",
            registered_model_name=spec.name,
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )


@flow(name="tune", task_runner=ThreadPoolTaskRunner(max_workers=64))
def tune(job_file: str, overrides: list[str] | None = None, job_id: str | None = None) -> dict:
    """Run the tuning job described by ``job_file`` and return its summary."""
    spec = load_job(job_file, overrides or ())
    return run_job(spec, job_id or new_job_id(spec.name))


def run_job(spec: JobSpec, job_id: str) -> dict[str, Any]:
    logger = get_run_logger()
    load_trainable(spec.trainable)
    # Threads share the cores: give each worker its slice instead of oversubscribing.
    torch.set_num_threads(max(1, torch.get_num_threads() // spec.compute.workers))
    job = Job(spec, job_id)
    create_markdown_artifact(
        key=artifact_key(job_id, "plan"),
        markdown=f"# Plan of {job_id}\n\n{job.plan.to_markdown()}\n\n"
        f"{job.plan.trials} trials, {job.plan.segments} segments, "
        f"{spec.compute.workers} workers.",
        description=f"staged plan of {job_id}",
    )
    logger.info("job %s: %d trials, %d segments", job_id, job.plan.trials, job.plan.segments)
    running: dict[PrefectFuture[SegmentReport], Segment] = {}
    try:
        with JobProgress(spec.metric, job.plan.segments) as progress:
            while True:
                while len(running) < spec.compute.workers:
                    segment = job.loop.next_segment()
                    if segment is None:
                        break
                    running[job.submit(segment)] = segment
                if not running:
                    break
                future = next(as_completed(list(running)))
                segment = running.pop(future)
                try:
                    report = future.result()
                except WorkerLost as exc:
                    report = lost(segment, exc)
                job.record(segment, report)
                stage = f"stage b{segment.bracket}-r{segment.rung}"
                progress.update(stage, job.best_metric())
                if job.stage_done(segment):
                    create_table_artifact(
                        key=artifact_key(job_id, "leaderboard"),
                        table=job.leaderboard(),
                        description=f"leaderboard after {stage} of {job_id}",
                    )
        return job.finish()
    except BaseException as exc:
        for future in running:
            future.wait()
        job.abort(bad_input=isinstance(exc, SpecError))
        raise
