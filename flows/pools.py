"""Work-pool mode: each segment runs as a flow run of the pool's ``train-segment`` deployment."""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, WorkPoolFilter
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from flows.segment import FLOW_NAME, flow_parameters, train_segment_flow
from planners.schedulers.base import Result, Segment
from planners.spec import SpecError
from tasks.tracking import Tracker
from tasks.train import JobRef, SegmentReport, report_name

ROOT = Path(__file__).resolve().parent.parent


class WorkerLost(RuntimeError):
    """The segment's flow run ended without a report: the worker or its instance died."""


def segment_deployment(pool: str) -> tuple[UUID, set[str]]:
    """The pool's ``train-segment`` deployment and the job variables the pool accepts.

    A process pool on this machine gets one registered from the project's source; any
    other pool must have one deployed (``prefect deploy --all``, see prefect.yaml).
    """
    with get_client(sync_client=True) as client:
        try:
            work_pool = client.read_work_pool(pool)
        except ObjectNotFound:
            raise SpecError(f"compute.pool: work pool {pool!r} not found") from None
        variables = set(work_pool.base_job_template.get("variables", {}).get("properties", {}))
        found = client.read_deployments(
            flow_filter=FlowFilter(name={"any_": [FLOW_NAME]}),
            work_pool_filter=WorkPoolFilter(name={"any_": [pool]}),
        )
    if found:
        return found[0].id, variables
    if work_pool.type != "process":
        raise SpecError(
            f"compute.pool: no {FLOW_NAME} deployment on {work_pool.type} pool {pool!r}; "
            "deploy one with `prefect deploy --all` (see prefect.yaml)"
        )
    source = train_segment_flow.from_source(str(ROOT), "flows/segment.py:train_segment_flow")
    # deploy() prints a table on stdout, which belongs to --json alone.
    with contextlib.redirect_stdout(sys.stderr):
        deployment = source.deploy(
            name=pool, work_pool_name=pool, print_next_steps=False, ignore_warnings=True
        )
    return deployment, variables


@task(
    name="launch-segment",
    task_run_name="trial-{segment.trial} {segment.start:g}→{segment.stop:g}",
    cache_policy=NO_CACHE,
    retries=2,  # a lost worker is retried; the new run resumes from the last checkpoint
    retry_delay_seconds=1,
)
def launch_segment(
    deployment: UUID,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    job_variables: dict[str, Any],
) -> SegmentReport:
    run = run_deployment(
        deployment,
        parameters=flow_parameters(job, segment, config, run_id),
        job_variables=job_variables,
        poll_interval=1,
    )
    report = Tracker(job.mlflow_uri, job.experiment).load_report(run_id, report_name(segment))
    if report is None:
        raise WorkerLost(f"flow run {run.name} ended {run.state_name} without a report")
    return SegmentReport.from_dict(report)


def lost(segment: Segment, error: BaseException) -> SegmentReport:
    """A segment whose every attempt lost its worker: the trial fails, the job goes on."""
    result = Result(segment.trial, segment.start, math.inf, failed=True)
    return SegmentReport(result, (), f"worker lost: {error}")
