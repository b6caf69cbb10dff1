"""The tune flows: run a tuning job, or resume one whose driver died.

``tune`` takes a job file (what deployments and the nightly flow pass); ``tune_prepared``
takes a job prepared already (what ``elastune run`` and ``elastune.run(...)`` pass, having
checked it before anything started: :mod:`elastune.flows.prepare`). Both hand it to
:func:`run_job`: open its pool (on a warm pool, segments are handed out ahead), create its
study and parent run, and drive it (:mod:`elastune.flows.drive`).

Each flow run is named after its job id, which the UI lists it by: from the start when the
caller made the id (the CLI, ``resume``), else (a deployment's run) once the flow has made it.

Every segment is journaled in the Optuna study when it is handed out, and every result as
it arrives, so ``resume`` rebuilds a job whose driver died and carries on, re-running no
finished segment: one that finished after its driver died is recorded from its saved report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner

from elastune.flows.drive import drive
from elastune.flows.job import Job, new_job_id
from elastune.flows.pools import PoolSizer, PoolTarget
from elastune.flows.prepare import PreparedJob, prepare
from elastune.flows.stored_job import stored_job
from elastune.infra.sizing import InfraError
from elastune.planners.spec import MAX_WORKERS, SpecError, load_job

# The driver's segments in flight, a thread each; Prefect runs a copy per flow run.
DRIVER_RUNNER = ThreadPoolTaskRunner(max_workers=MAX_WORKERS)


def job_run_name() -> str:
    """A tune flow run's name: the job id when its caller made it (the CLI does); else the
    name Prefect gave it, until :func:`name_run` renames it."""
    return flow_run.parameters.get("job_id") or flow_run.name


@flow(name="tune", flow_run_name=job_run_name, task_runner=DRIVER_RUNNER)
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
        prepared = prepare(load_job(job_file, overrides or ()))
        outcome.value = run_job(prepared, job_id, warm_start)
    return outcome.value


# Its parameter is shown, not validated: a prepared job holds its trainable and its pool.
@flow(name="tune", flow_run_name=job_run_name, task_runner=DRIVER_RUNNER, validate_parameters=False)
def tune_prepared(
    job: PreparedJob, job_id: str | None = None, warm_start: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Run the prepared tuning ``job`` and return its summary (see :func:`tune`)."""
    with bad_input_fails_the_run() as outcome:
        outcome.value = run_job(job, job_id, warm_start)
    return outcome.value


def run_job(
    prepared: PreparedJob, job_id: str | None = None, warm_start: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Open the pool, create and drive a new job; bad input is found before anything is
    created."""
    job_id = job_id or new_job_id(prepared.spec.name)
    name_run(job_id)
    prepared, pool = open_pool_for(prepared)
    job = Job.create(prepared, job_id, warm_start or [])
    return drive(job, pool)


def name_run(job_id: str) -> None:
    """Name the flow run this is called in after ``job_id``."""
    if flow_run.name != job_id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(UUID(flow_run.id), name=job_id)


@flow(name="resume", flow_run_name="{job_id}", task_runner=DRIVER_RUNNER)
def resume(job_id: str, storage: str = "sqlite:///.elastune/optuna.db") -> dict[str, Any]:
    """Continue a job whose driver died, losing nothing finished; a job that finished is
    left as it is and its stored summary returned, marked ``already_finished``."""
    with bad_input_fails_the_run() as outcome:
        stored = stored_job(job_id, storage)
        outcome.value = stored.already_finished()
        if outcome.value is not None:
            return outcome.value
        prepared, pool = open_pool_for(prepare(stored.spec))
        outcome.value = drive(Job.resume(prepared, stored), pool)
    return outcome.value


def open_pool_for(prepared: PreparedJob) -> tuple[PreparedJob, PoolTarget]:
    """The pool the job's segments run on, opened (a work pool's mistakes found here), and
    the job as it runs there: on a pool whose nodes queue segments, the plan hands segments
    out ahead."""
    pool = prepared.pool.open()
    if pool.queues:
        execution = prepared.execution.queued_on_nodes()
        prepared = prepared.model_copy(update={"execution": execution})
    # A stage the cluster cannot hold is bad input, found here.
    PoolSizer(pool.backend, prepared.execution, prepared.spec.scheduler.name).check()
    return prepared, pool


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
