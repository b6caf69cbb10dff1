"""The tune flow: drive the job's scheduler against real Prefect task runs.

One loop serves every scheduler. While workers are free it submits the segments the
scheduler hands out; as each finishes (in completion order) it records the result, which
may promote, pause or stop trials. A synchronous scheduler (SHA, Hyperband) hands out
nothing at a rung's barrier, so the same loop walks its plan stage by stage; an
asynchronous one (ASHA) keeps every worker busy.

Every segment is journaled in the Optuna study when it is handed out, and every result as
it arrives, so ``resume`` rebuilds a job whose driver died and carries on, re-running no
finished segment: one that finished after its driver died is recorded from its saved report.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from functools import cached_property
from typing import Any

import optuna
import torch
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.futures import PrefectFuture, as_completed
from prefect.states import Failed
from prefect.task_engine import TaskRunTimeoutError
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pools import PoolTarget, WorkerLost, launch_segment, open_pool
from flows.progress import JobProgress
from infra.sizing import InfraError, publish_sizing
from planners.cost import plan_job
from planners.cost.catalog import read_catalog
from planners.search import Action, Best, Decision, Segment, StudyJournal, TuningLoop
from planners.search.schedulers.base import rank_key
from planners.spec import JobSpec, SpecError, load_job, make_sampler, parse_job
from planners.staging import (
    LocalDevices,
    Plan,
    Stage,
    StagePacker,
    allocate,
    compile_plan,
    is_staged,
    stage_packer,
)
from tasks.context import TrialContext
from tasks.tracking import (
    Tracker,
    check_storage,
    check_tracking_uri,
    first_use,
    flatten,
    local_uri,
    sqlite_path,
)
from tasks.train import (
    JobRef,
    SegmentReport,
    check_plan,
    cuda_devices,
    load_trainable,
    report_name,
    supports_distributed,
    train_segment,
)

# Where a job keeps what resume needs: the spec and parent run on the study, each trial's
# MLflow run on its Optuna trial.
SPEC_ATTR, RUN_ATTR = "elastune.spec", "mlflow_run_id"


class MetricNotReported(SpecError):
    """The trainable finished a segment without ever reporting the job's metric."""


def new_job_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}".lower()


def artifact_key(job_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{job_id}-{what}".lower())


class Job:
    """The state of one job: its study, scheduler loop, MLflow runs, pool and progress."""

    def __init__(
        self,
        spec: JobSpec,
        job_id: str,
        study: optuna.Study,
        tracker: Tracker,
        parent: str,
        plan: Plan | None,
    ):
        self.spec = spec
        self.job_id = job_id
        self.study = study
        self.parent = parent
        self.began = time.monotonic()
        self.tracker = tracker
        self.storage = local_uri(spec.tracking.optuna_storage)
        self.journal = StudyJournal(study)
        self.loop = TuningLoop(spec, study, journal=self.journal)
        self.plan = plan
        self.ref = JobRef.of(spec, job_id, self.tracker.uri)
        self.pool: PoolTarget | None = None
        self.runs = {
            t.user_attrs["elastune.trial"]: t.user_attrs[RUN_ATTR]
            for t in study.get_trials(deepcopy=False)
            if RUN_ATTR in t.user_attrs
        }
        # Trial runs MLflow holds but the study does not name (a driver died in between):
        # a resumed job takes them up instead of starting a second run per trial.
        self.untagged_runs: dict[int, str] = {}
        self.rungs: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        self.segments = 0
        self._stage_results: dict[tuple[int, int], int] = {}
        self._active: set[tuple[int, int]] = set()
        self._sized = ""
        self._metric_seen = False

    @classmethod
    def create(
        cls,
        spec: JobSpec,
        job_id: str,
        plan: Plan | None,
        pool: PoolTarget | None,
        warm_start: list[dict[str, Any]],
    ) -> Job:
        check_tracking_uri(spec.tracking.mlflow_uri, "tracking.mlflow_uri")
        check_storage(spec.tracking.optuna_storage, "tracking.optuna_storage")
        tracker = Tracker(spec.tracking.mlflow_uri, spec.experiment)
        storage = local_uri(spec.tracking.optuna_storage)
        with first_use(storage):
            study = optuna.create_study(
                study_name=job_id,
                storage=storage,
                direction="maximize" if spec.mode == "max" else "minimize",
                sampler=make_sampler(spec),
            )
        parent = tracker.start_job(
            job_id,
            flatten(spec.model_dump(mode="json")),
            {"elastune.scheduler": spec.scheduler.name, "elastune.sampler": spec.sampler.name},
        )
        for config in warm_start:  # tried first, before the sampler proposes anything
            study.enqueue_trial(config, skip_if_exists=True)
        # The spec last: a study that has it has everything resume needs.
        study.set_user_attr(RUN_ATTR, parent)
        study.set_user_attr(SPEC_ATTR, spec.model_dump(mode="json"))
        job = cls(spec, job_id, study, tracker, parent, plan)
        job.pool = pool
        return job

    @classmethod
    def resume(cls, job_id: str, storage: str) -> Job:
        """Rebuild a job from its study: replay the journal, then carry on."""
        check_storage(storage, "storage")
        url = local_uri(storage)
        database = sqlite_path(url)
        if database is not None and not database.exists():  # load_study would create it
            raise SpecError(f"job id: no job {job_id!r} in {storage} (no such database)")
        try:
            study = optuna.load_study(study_name=job_id, storage=url)
        except KeyError:
            raise SpecError(f"job id: no job {job_id!r} in {storage}") from None
        attrs = study.user_attrs  # one read of the storage
        if SPEC_ATTR not in attrs:
            raise SpecError(f"job id: study {job_id!r} was not made by elastune")
        spec = parse_job(attrs[SPEC_ATTR], f"job {job_id}")
        tracker = Tracker(spec.tracking.mlflow_uri, spec.experiment)
        job = cls(spec, job_id, study, tracker, attrs[RUN_ATTR], plan_for(spec))
        job.pool = None if spec.compute.pool == "local" else open_pool(spec)
        job.untagged_runs = {
            trial: run_id
            for trial, run_id in tracker.trial_runs(job.parent).items()
            if trial not in job.runs
        }
        for result, note, decisions in job.loop.replay(*job.journal.fold()):
            job._account(result.trial, note or {}, decisions)
        return job

    # --- one segment ---------------------------------------------------------------------

    def submit(self, segment: Segment) -> PrefectFuture[SegmentReport]:
        if segment.trial not in self.runs:
            config = self.loop.configs[segment.trial]
            run_id = self.untagged_runs.pop(segment.trial, None) or self.tracker.start_trial(
                self.job_id, self.parent, segment.trial, config
            )
            self.runs[segment.trial] = run_id
            self.loop.optuna_trial(segment.trial).set_user_attr(RUN_ATTR, run_id)
        run_id = self.runs[segment.trial]
        if segment.clone_from is not None:
            self.tracker.copy_checkpoint(self.runs[segment.clone_from], run_id)
        config = self.loop.configs[segment.trial]
        stage = self.stage_of(segment)
        if self.packer is not None:
            segment = replace(segment, gpus=self.packer.width(segment))
        elif stage is not None:
            segment = replace(segment, gpus=stage.gpus_per_trial)
        timeout = self.spec.compute.segment_timeout
        if self.pool is None:
            # Prefect's timeout interrupts a trainable stuck in Python code; one blocked
            # inside a C call ends when the call returns (work-pool mode kills the process).
            train = train_segment.with_options(timeout_seconds=timeout)
            ids = None if self.devices is None else self.devices.take(segment.trial, segment.gpus)
            return train.submit(self.ref, segment, config, run_id, ids)
        variables = self.pool.job_variables(segment.gpus, stage and stage.instance_type)
        return launch_segment.submit(
            self.pool.deployment, self.ref, segment, config, run_id, variables, timeout
        )

    @cached_property
    def devices(self) -> LocalDevices | None:
        """The CUDA devices segments of a local job share out; None on a pool or on CPU."""
        count = cuda_devices() if self.pool is None else None
        return None if count is None else LocalDevices(count)

    def ended(self, segment: Segment) -> None:
        """A submitted segment's task ended (whatever its outcome)."""
        if self.devices is not None:
            self.devices.release(segment.trial)

    def record(self, segment: Segment, report: SegmentReport) -> list[Decision]:
        if self.spec.metric in report.metrics_seen:
            self._metric_seen = True
        elif report.error is None and not self._metric_seen:
            seen = ", ".join(report.metrics_seen) or "nothing"
            raise MetricNotReported(
                f"metric: {self.spec.trainable} never reported {self.spec.metric!r} "
                f"(it reported: {seen})"
            )
        note = {
            "metrics_seen": list(report.metrics_seen),
            "error": report.error,
            "rung": segment.rung,
            "bracket": segment.bracket,
        }
        decisions = self.loop.record(report.result, note)
        self._account(segment.trial, note, decisions)
        return decisions

    def _account(self, trial: int, note: dict[str, Any], decisions: list[Decision]) -> None:
        """Bookkeeping shared by live results and replayed ones."""
        self.segments += 1
        if note.get("error"):
            self.errors[trial] = note["error"]
        if self.spec.metric in note.get("metrics_seen", ()):
            self._metric_seen = True
        self.rungs[trial] = note.get("rung", 0)
        key = (note.get("bracket", 0), note.get("rung", 0))
        self._stage_results[key] = self._stage_results.get(key, 0) + 1
        for decision in decisions:
            self._track(decision)

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

    def stage_of(self, segment: Segment) -> Stage | None:
        """The segment's stage in the staged plan; None for asynchronous schedulers."""
        return None if self.plan is None else self.plan.stage(segment.bracket, segment.rung)

    def stage_done(self, segment: Segment, decisions: list[Decision]) -> bool:
        """Time for a leaderboard: a stage finished, or (asynchronous schedulers, which have
        no stages) a trial completed."""
        stage = self.stage_of(segment)
        if stage is None:
            return any(d.action is Action.COMPLETE for d in decisions)
        key = (segment.bracket, segment.rung)
        done = self._stage_results.get(key, 0) == stage.trials
        if done:
            self._active.discard(key)
        return done

    @cached_property
    def packer(self) -> StagePacker | None:
        """Fluid for a staged job whose profile gives widths other than 1: each stage's
        segments are packed onto its GPUs (``planners.staging.stagepack``); None: as planned."""
        if self.plan is None or self.spec.profile is None:
            return None
        local = self.spec.compute.pool == "local"
        types = {s.instance_type for s in self.plan.stages} - {None}
        catalog = read_catalog().instance_types if types else {}
        return stage_packer(
            self.spec,
            self.plan,
            distributed=supports_distributed(load_trainable(self.spec.trainable)),
            devices=cuda_devices() if local else None,
            node_gpus={name: t.gpus for name, t in catalog.items()},
        )

    def may_start(self, segment: Segment, running: list[Segment]) -> bool:
        """With a stage packer, segments start when their width's GPUs are free; else a
        planned job caps each stage at its planned concurrency, and otherwise the job runs
        at most ``compute.workers`` segments at once."""
        if self.packer is not None:
            return self.packer.may_start(segment, running)
        stage = self.stage_of(segment)
        if stage is None or stage.slots is None:
            return len(running) < self.spec.compute.workers
        same = sum((s.bracket, s.rung) == (segment.bracket, segment.rung) for s in running)
        return same < stage.slots

    def may_start_any(self, running: list[Segment]) -> bool:
        """Is there room for one more segment of some stage?"""
        if self.packer is not None:
            return self.packer.may_start_any(running)
        if self.plan is None or all(stage.slots is None for stage in self.plan.stages):
            return len(running) < self.spec.compute.workers
        return len(running) < sum(stage.slots or 0 for stage in self.plan.stages)

    # --- the pool ------------------------------------------------------------------------

    def size_pool(self, starting: list[Segment]) -> None:
        """Before segments of a new stage start, size the pool for the stages now active:
        their segments, at most ``compute.workers`` at once."""
        if self.pool is None:
            return
        if self.plan is None:  # asynchronous: one size, compute.workers, for the whole job
            if not self._sized:
                name, slots = self.spec.scheduler.name, self.spec.compute.workers
                self.pool.backend.size(name, slots, gpus_per_trial=1.0)
                self.pool.backend.wait_ready(timeout=600)
                self._sized = self.spec.scheduler.name
            return
        self._active |= {(s.bracket, s.rung) for s in starting}
        stages = [self.plan.stage(*key) for key in sorted(self._active)]
        if not stages:  # between stages with nothing to start: keep the pool as it is
            return
        gpus = max(s.gpus_per_trial for s in stages)
        if self.packer is not None:  # the stages' GPUs, in units of the narrowest width
            slots, gpus = self.packer.demand(stages)
        elif any(s.slots is None for s in stages):
            slots = min(self.spec.compute.workers, sum(s.trials for s in stages))
        else:
            slots = sum(s.slots or 0 for s in stages)
        name = "+".join(s.name for s in stages)
        if name != self._sized:  # every change of the active stages is a sizing action
            self.pool.backend.size(name, slots, gpus, stages[-1].instance_type)
            self.pool.backend.wait_ready(timeout=600)
            self._sized = name

    # --- reports -------------------------------------------------------------------------

    def leaderboard(self) -> list[dict[str, Any]]:
        """Trials ranked by resource reached, then by loss at it."""

        def reached(trial: int) -> tuple[float, float]:
            return self.loop.reached.get(trial, (0, math.nan))

        rows = []
        ordered = sorted(self.loop.configs, key=lambda t: (-reached(t)[0], rank_key(reached(t)[1])))
        for trial in ordered:
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
        model = None
        if best is not None:
            run_id = self.runs[best.trial]
            self.tracker.set_tags(run_id, {"elastune.best": "true"})
            self.tracker.set_tags(self.parent, {"elastune.best_trial": best.trial})
            self.tracker.log_metrics(self.parent, {f"best_{self.spec.metric}": best.metric}, 0)
            model = register_best(self, best)
            self.tracker.set_tags(self.parent, {"elastune.registered": model["version"]})
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
            "model": model,
        }

    def abort(self, bad_input: bool) -> None:
        """A failed job keeps what it finished; bad input leaves nothing behind."""
        if bad_input:
            self.tracker.purge([self.parent, *self.runs.values()])
            optuna.delete_study(study_name=self.job_id, storage=self.storage)
        else:
            for run_id in (*self.runs.values(), self.parent):
                self.tracker.end_run(run_id, "FAILED")


def register_best(job: Job, best: Best) -> dict[str, Any]:
    """Register the best trial's model under the job's name when it beats the registered one.

    The trainable is called once more with nothing left to train: it builds its model and
    restores the best checkpoint, and the object it passes as ``model=`` is logged.
    """
    spec, run_id = job.spec, job.runs[best.trial]
    previous = job.tracker.registered(spec.name)
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
        tracker=job.tracker,
    )
    load_trainable(spec.trainable)(dict(best.config), ctx)
    model = ctx.objects.get("model")
    if not isinstance(model, torch.nn.Module):
        get_run_logger().warning("trainable passes no model= to ctx.restore; nothing registered")
        return outcome
    tags = {
        "elastune.metric": best.metric,
        "elastune.job_id": job.job_id,
        "elastune.trial": best.trial,
    }
    outcome["version"] = job.tracker.register(run_id, model, spec.name, tags)
    return outcome


def plan_for(spec: JobSpec) -> Plan | None:
    """The staged plan (None for asynchronous schedulers); with a deadline or budget and a
    profile, the cost planner sets each stage's GPUs per trial, concurrency and instance type
    (an infeasible plan is bad input)."""
    if not is_staged(spec):
        return None
    plan = compile_plan(spec)
    if spec.profile is None or (spec.budget.deadline is None and spec.budget.max_cost_usd is None):
        return plan
    report = plan_job(spec)
    report.check()
    return allocate(plan, report.allocations)


@flow(name="tune", task_runner=ThreadPoolTaskRunner(max_workers=64))
def tune(
    job_file: str,
    overrides: list[str] | None = None,
    job_id: str | None = None,
    warm_start: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the tuning job described by ``job_file`` and return its summary.

    ``warm_start`` configurations are tried first (the nightly flow passes last night's best).
    """
    with bad_input_fails_the_run() as outcome:
        spec = load_job(job_file, overrides or ())
        load_trainable(spec.trainable)
        plan = plan_for(spec)
        if plan is not None:  # widths the profile, the pool or the trainable cannot run
            check_plan(spec, plan, cuda_devices() if spec.compute.pool == "local" else None)
        pool = None if spec.compute.pool == "local" else open_pool(spec)
        job_id = job_id or new_job_id(spec.name)
        outcome.value = drive(Job.create(spec, job_id, plan, pool, warm_start or []))
    return outcome.value


@flow(name="resume", task_runner=ThreadPoolTaskRunner(max_workers=64))
def resume(job_id: str, storage: str = "sqlite:///.elastune/optuna.db") -> dict[str, Any]:
    """Continue a job whose driver died, losing nothing finished."""
    with bad_input_fails_the_run() as outcome:
        outcome.value = drive(Job.resume(job_id, storage))
    return outcome.value


class _Outcome:
    value: Any = None


@contextlib.contextmanager
def bad_input_fails_the_run() -> Iterator[_Outcome]:
    """Bad input fails the flow run with its one-line message: no traceback in the logs.
    The caller of the flow still gets the exception."""
    outcome = _Outcome()
    try:
        yield outcome
    except (SpecError, InfraError) as exc:
        outcome.value = Failed(message=str(exc), data=exc)


def describe(job: Job) -> str:
    """The plan artifact: the staged DAG, or the rung ladder of an asynchronous scheduler."""
    title = f"# Plan of {job.job_id}\n\n"
    if job.plan is None:
        scheduler = job.spec.scheduler
        ladder = getattr(scheduler, "max_resource", None)
        return (
            f"{title}Asynchronous `{scheduler.name}`: no stages; a new segment starts whenever "
            f"one of {job.spec.compute.workers} workers is free"
            + (f", up to resource {ladder:g}." if ladder else ".")
        )
    return (
        f"{title}{job.plan.to_markdown()}\n\n{job.plan.trials} trials, "
        f"{job.plan.segments} segments, {job.spec.compute.workers} workers."
    )


def drive(job: Job) -> dict[str, Any]:
    """Run a job's segments until its scheduler has nothing left; returns the summary."""
    spec, job_id = job.spec, job.job_id
    load_trainable(spec.trainable)
    # Threads share the cores: give each worker its slice instead of oversubscribing.
    torch.set_num_threads(max(1, torch.get_num_threads() // spec.compute.workers))
    create_markdown_artifact(
        key=artifact_key(job_id, "plan"),
        markdown=describe(job),
        description=f"plan of {job_id}",
    )
    running: dict[PrefectFuture[SegmentReport], Segment] = {}
    # Segments in flight when a driver died: finished ones have their report in MLflow. A
    # segment is journaled before it is submitted, so its trial may have no run yet.
    pending = job.loop.in_flight()
    for segment in list(pending):
        run_id = job.runs.get(segment.trial)
        saved = None if run_id is None else job.tracker.load_report(run_id, report_name(segment))
        if saved is not None:
            pending.remove(segment)
            job.record(segment, SegmentReport.from_dict(saved))
    pool = job.pool.backend if job.pool is not None else contextlib.nullcontext()
    try:
        total = None if job.plan is None else job.plan.segments
        with pool, JobProgress(spec.metric, total) as progress:
            while True:
                starting: list[Segment] = []
                busy = list(running.values())
                for segment in list(pending):
                    if job.may_start(segment, busy + starting):
                        pending.remove(segment)
                        starting.append(segment)
                # Draw from the scheduler while there is room; a segment of a stage already
                # at its planned concurrency waits in pending, and drawing stops.
                while not pending and job.may_start_any(busy + starting):
                    segment = job.loop.next_segment()
                    if segment is None:
                        break
                    if job.may_start(segment, busy + starting):
                        starting.append(segment)
                    else:
                        pending.append(segment)
                job.size_pool(starting)
                for segment in starting:
                    running[job.submit(segment)] = segment
                if not running:
                    break
                future = next(as_completed(list(running)))
                segment = running.pop(future)
                job.ended(segment)
                try:
                    report = future.result()
                except WorkerLost as exc:  # every retry lost its worker
                    report = SegmentReport.failure(segment, f"worker lost: {exc}")
                except TaskRunTimeoutError:
                    timeout = spec.compute.segment_timeout
                    report = SegmentReport.failure(
                        segment, f"timeout: segment ran over {timeout:g} s"
                    )
                decisions = job.record(segment, report)
                stage = f"stage b{segment.bracket}-r{segment.rung}"
                progress.update(stage, job.best_metric())
                if job.stage_done(segment, decisions):
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
    finally:
        if job.pool is not None:
            publish_sizing(job.pool.backend.records, key=artifact_key(job_id, "pool-sizing"))
