"""Drive a job: recover what a dead driver left in flight, then run its segments until the
scheduler has nothing left, or its deadline passes.

One loop serves every scheduler. While the admission policy has room it submits the
segments the scheduler hands out; as each finishes (in completion order) it records the
result, which may promote, pause or stop trials. A synchronous scheduler (SHA, Hyperband)
hands out nothing at a rung's barrier, so the same loop walks its plan stage by stage; an
asynchronous one (ASHA) keeps every worker busy.

Once ``budget.deadline`` has passed (counted from the driver's start) nothing new starts,
the segments running stop at their next step (``TrialContext.range``), each trial kept
where it got to, and the job ends as if its scheduler had run out.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from elastune.flows.forecast import ForecastCheck
from elastune.flows.job import Job
from elastune.flows.job_log import JobLog
from elastune.flows.launch import Launcher
from elastune.flows.pools import PoolSizer, PoolTarget
from elastune.flows.progress import JobProgress
from elastune.flows.replanning import InFlight
from elastune.flows.results import finish, leaderboard
from elastune.infra.sizing import RELEASE_STAGE, publish_sizing
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import SpecError
from elastune.tasks.contract import SegmentReport


def artifact_key(job_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{job_id}-{what}".lower())


def drive(job: Job, pool: PoolTarget) -> dict[str, Any]:
    """Run a job's segments until its scheduler has nothing left, or its deadline has
    passed and nothing runs; returns the summary."""
    spec, execution = job.spec, job.execution
    print(execution.mode, file=sys.stderr, flush=True)
    report = execution.report
    check = None if report is None else ForecastCheck(report.forecast())
    flight = InFlight.of(job)
    publish_plan(job, check, flight=flight)
    job_log = JobLog(job)
    pending = recover(job)
    job_log.begin(len(pending))
    launcher = Launcher(job.ref, pool)
    sizer = PoolSizer(pool.backend, execution, spec.scheduler.name)
    with launcher.signals:  # a stop waits for the store writes under way (flows/signals.py)
        try:
            total = None if execution.plan is None else execution.plan.segments
            with pool.backend, JobProgress(spec.metric, total) as progress:
                run_segments(job, launcher, sizer, pending, progress, job_log, check, flight)
            launcher.close()  # what the workers hold (memory, a GPU) is free for the end
            summary = finish(job, job_log, check)
            if summary.get("deadline", {}).get("passed"):  # where the deadline left each trial
                publish_leaderboard(job, "the deadline")
            if flight is not None:
                summary["replanning"] = flight.to_dict()
            publish_plan(job, check, summary["wall_seconds"], flight)
            job_log.end(summary)
            return summary
        except BaseException as exc:
            job_log.failed(exc)
            launcher.wait_all()
            job.abort(bad_input=isinstance(exc, SpecError))
            raise
        finally:
            launcher.close()
            sizing = pool.backend.records
            job_log.sized([r for r in sizing if r.stage == RELEASE_STAGE])
            if sizing:  # a pool that was sized: this machine never is
                publish_sizing(sizing, key=artifact_key(job.job_id, "pool-sizing"))


def publish_plan(
    job: Job,
    check: ForecastCheck | None,
    wall_seconds: float | None = None,
    flight: InFlight | None = None,
) -> None:
    """The plan artifact, again under the same key as stages end and as the job re-plans
    (Prefect keeps each version)."""
    replans = "" if flight is None else flight.to_markdown()
    create_markdown_artifact(
        key=artifact_key(job.job_id, "plan"),
        markdown=describe(job, check, wall_seconds) + (f"\n\n{replans}" if replans else ""),
        description=f"plan of {job.job_id}",
    )


def describe(
    job: Job, check: ForecastCheck | None = None, wall_seconds: float | None = None
) -> str:
    """The plan artifact: the mode, and the staged DAG or the rung ladder of an
    asynchronous scheduler; for a planned job, its forecast next to what the run has
    measured so far."""
    title = f"# Plan of {job.job_id}\n\n`{job.execution.mode}`\n\n"
    plan, workers = job.execution.plan, job.spec.compute.workers
    if plan is None:
        scheduler = job.spec.scheduler
        ladder = getattr(scheduler, "max_resource", None)
        return (
            f"{title}Asynchronous `{scheduler.name}`: no stages; a new segment starts whenever "
            f"one of {workers} workers is free"
            + (f", up to resource {ladder:g}." if ladder else ".")
        )
    totals = f"{plan.trials} trials, {plan.segments} segments, {workers} workers."
    text = f"{title}{plan.to_markdown()}\n\n{totals}"
    if check is not None:
        text += "\n\n## Forecast and measurement\n\n" + check.to_markdown(wall_seconds)
    return text


def recover(job: Job) -> list[Segment]:
    """The segments a dead driver left in flight that still have to run: those that
    finished meanwhile are recorded from the report they kept in MLflow. One its deadline
    cut short runs again, from where it stopped, whether the cut was recorded or not: this
    driver's deadline counts anew."""
    pending = job.loop.in_flight()
    for segment in list(pending):
        saved = job.runs.saved_report(segment)
        report = None if saved is None else SegmentReport.from_dict(saved)
        if report is not None and not report.cut:
            pending.remove(segment)
            job.record(segment, report)
    return pending


def run_segments(
    job: Job,
    launcher: Launcher,
    sizer: PoolSizer,
    pending: list[Segment],
    progress: JobProgress,
    job_log: JobLog,
    check: ForecastCheck | None = None,
    flight: InFlight | None = None,
) -> None:
    """Start what the admission policy lets start, record what finishes; until nothing
    runs and the scheduler hands out nothing more, or nothing runs past the deadline. A
    planned job's ``check`` forecast notes each stage's end, and the plan artifact shows it."""
    while True:
        if job.past_deadline():
            job_log.deadline_passed()  # told once
            starting = []
        else:
            starting = admit(job, pending, launcher.running)
        job_log.sized(sizer.size(starting))
        job_log.starting(starting)
        for segment in starting:
            start(job, launcher, segment)
        if flight is not None:
            flight.started(starting)
        job.flush()  # the last result's writes, now that the workers it freed are busy
        if not launcher.running:
            return
        segment, report = launcher.next_report()
        if report.cut and report.error is None:  # stopped short: nothing more to learn
            job.cut(segment, report)
            job_log.cut(segment, report.result.resource)
            continue
        decisions = job.record(segment, report)
        job_log.decided(decisions)
        # Past the deadline nothing starts again: there is nothing left to re-plan.
        if flight is not None and not job.past_deadline():
            replan = flight.finished(segment, report, job_log)
            if replan is not None:
                publish_plan(job, check, flight=flight)
                if replan.changed:  # the pool follows the new plan
                    sizer.replanned(job.execution)
        progress.update(stage_label(segment), job.best_metric())
        if job.stage_done(segment, decisions):
            stage_done(job, segment, job_log, sizer, check, flight)


def stage_label(segment: Segment) -> str:
    """How the progress line and the leaderboard name a segment's stage."""
    return f"stage b{segment.bracket}-r{segment.rung}"


def stage_done(
    job: Job,
    segment: Segment,
    job_log: JobLog,
    sizer: PoolSizer,
    check: ForecastCheck | None,
    flight: InFlight | None,
) -> None:
    """``segment``'s stage ended: told, the pool sized down, a planned job's forecast and
    the leaderboard published."""
    job_log.stage_done(segment)
    sizer.stage_done(segment)
    if check is not None:
        check.stage_done(segment.bracket, segment.rung, time.monotonic() - job.began)
        publish_plan(job, check, flight=flight)
    publish_leaderboard(job, stage_label(segment))


def publish_leaderboard(job: Job, after: str) -> None:
    """The leaderboard artifact, again under the same key (Prefect keeps each version)."""
    create_table_artifact(
        key=artifact_key(job.job_id, "leaderboard"),
        table=leaderboard(job),
        description=f"leaderboard after {after} of {job.job_id}",
    )


def admit(job: Job, pending: list[Segment], running: list[Segment]) -> list[Segment]:
    """The segments to start now: waiting ones first, then new ones from the scheduler
    while there is room. A segment of a stage already at its concurrency waits in
    ``pending``, and drawing stops, except in a planned job: there each stage has its own
    slots and Hyperband's brackets run side by side, as the plan priced them, so drawing
    goes on to reach the other brackets' stages."""
    admission = job.execution.admission
    starting: list[Segment] = []
    for segment in list(pending):
        if admission.may_start(segment, running + starting):
            pending.remove(segment)
            starting.append(segment)
    # Re-read each time: a segment that must wait (appended to pending) stops the drawing.
    while (admission.stages_side_by_side or not pending) and admission.may_start_any(
        running + starting
    ):
        segment = job.loop.next_segment()
        if segment is None:
            break
        if admission.may_start(segment, running + starting):
            starting.append(segment)
        else:
            pending.append(segment)
    return starting


def start(job: Job, launcher: Launcher, segment: Segment) -> None:
    """Submit an admitted segment in its trial's MLflow run, at the width admitted."""
    run_id = job.trial_run(segment)
    stage = job.execution.stage(segment)
    launcher.submit(
        replace(segment, gpus=job.execution.admission.width(segment)),
        job.loop.configs[segment.trial],
        run_id,
        None if stage is None else stage.instance_type,
    )
