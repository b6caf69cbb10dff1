"""elastune from Python: the functions behind ``elastune run``, ``resume``, ``plan`` and
``simulate``, each returning what the command's ``--json`` prints.

Bad input raises :class:`~elastune.planners.spec.SpecError`, whose message names the field
(the command's exit-2 line), before anything is created; no call exits the interpreter.
Heavy imports (Prefect, MLflow, torch) happen inside the calls, after the job's Prefect
server has started, as in the command: ``import elastune`` stays cheap.

Example:
    >>> import elastune
    >>> job = {"name": "x", "trainable": "m:f", "metric": "acc", "budget": {"deadline": "1h"},
    ...        "scheduler": {"name": "sha", "max_resource": 9},
    ...        "space": {"lr": {"type": "float", "low": 0.01, "high": 1}}}
    >>> elastune.plan(job)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    elastune.planners.spec.model.SpecError: profile: the job has no profile; add a profile: ...
    >>> report = elastune.plan(job, ["profile.seconds_per_unit={1: 2.0}"])
    >>> report["feasible"], report["planner"]
    (True, 'rubberband')
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastune.flows.gc_freeze import start_uncollected
from elastune.planners.spec import JobSpec, SpecError, load_job, parse_job

if TYPE_CHECKING:
    from elastune.planners.cost import Catalog, PlanReport

JobFile = str | os.PathLike[str] | Mapping[str, Any] | JobSpec
DEFAULT_STORAGE = "sqlite:///.elastune/optuna.db"
PLANNERS = ("rubberband", "seer")


def job_spec(job: JobFile, overrides: Sequence[str] = ()) -> JobSpec:
    """The validated job: from a YAML file's path, a dict shaped like one, or a
    :class:`JobSpec` as it is; ``overrides`` are ``--set``'s ``KEY=VALUE`` strings."""
    if isinstance(job, JobSpec):
        return load_job_data(job.model_dump(mode="json", by_alias=True), overrides)
    if isinstance(job, Mapping):
        return load_job_data(dict(job), overrides)
    return load_job(Path(job), list(overrides))


def load_job_data(data: dict[str, Any], overrides: Sequence[str]) -> JobSpec:
    """A job given as data, with ``overrides`` applied as a file's are."""
    from elastune.planners.spec import apply_override

    for assignment in overrides:
        apply_override(data, assignment)
    return parse_job(data)


def quiet_defaults() -> None:
    """The environment a job runs in, each value the user's if set: quiet Prefect and
    MLflow logs, and the working directory first on ``sys.path``, where trainables are
    found. Prefect reads its settings at import, so this comes first."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    # The flow run's logger still tells the job's story to the run's Logs tab (INFO); the
    # terminal shows only what PREFECT_LOGGING_LEVEL lets through.
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")
    os.environ.setdefault(
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", os.environ["PREFECT_LOGGING_LEVEL"]
    )
    # The local server migrates a fresh database first: 20 s is too little on a busy laptop.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # torch asks NVML whether there is a GPU, not CUDA itself: the process stays fit to
    # fork its workers' server even when a trainable asks at import (tasks/worker_processes.py).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    # Checkpoint downloads would each draw a progress bar over ours.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # Ending a run on a tracking server would read it back (a request per trial) to print
    # its URL, a line per trial on the terminal.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # Trainables are referenced as module:function relative to where the user runs. Every
    # module of elastune's is elastune.*, so none of the user's shadows one, nor the reverse.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def run(job: JobFile, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Run a tuning job to its end and return its summary: ``job_id``, ``best`` (trial,
    metric, config), ``trials``, ``segments``, ``wall_seconds``, ``mlflow_run_id``,
    ``optuna_storage``, and ``error`` when every trial failed."""
    return run_spec(job_spec(job, overrides))


def run_spec(
    spec: JobSpec, announce: Callable[[str], None] = lambda job_id: None
) -> dict[str, Any]:
    """Run the validated ``spec``; ``announce`` gets the job id once the job is prepared
    (its input checked) and before it starts."""
    quiet_defaults()
    from elastune.flows.ephemeral import early_server

    # The server starts while the rest is imported and checked.
    with start_uncollected() as started, early_server() as server_ready:
        from elastune.flows.prepare import prepare

        prepared = prepare(spec)  # bad input fails here, before anything is created
        from elastune.flows.job import new_job_id
        from elastune.flows.tune import tune_prepared

        job_id = new_job_id(spec.name)
        announce(job_id)
        server_ready()
        started()
        prepared.pool.fork_here()
        quiet_optuna()
        return tune_prepared(prepared, job_id)


def resume(job_id: str, storage: str = DEFAULT_STORAGE) -> dict[str, Any]:
    """Continue job ``job_id`` whose driver died, from its Optuna ``storage``, re-running
    no finished segment; returns its summary. A job that had finished is left as it is:
    its stored summary, marked ``already_finished`` with its ``finished_at`` time."""
    return resume_job(job_id, storage)


def resume_job(
    job_id: str,
    storage: str,
    field: str = "storage",
    announce: Callable[[str], None] = lambda job_id: None,
) -> dict[str, Any]:
    """:func:`resume`, a malformed ``storage`` named as ``field`` (the command's flag), and
    ``announce`` given the job id before it resumes."""
    quiet_defaults()
    from elastune.flows.stored_job import stored_job

    # The study answers before Prefect starts: an unknown job id or a finished job at once.
    stored = stored_job(job_id, storage, field)
    done = stored.already_finished()
    if done is not None:
        return done
    from elastune.flows.ephemeral import early_server

    with start_uncollected() as started, early_server() as server_ready:
        from elastune.flows.pools import pool_of
        from elastune.flows.tune import resume as resume_flow
        from elastune.tasks.trainable import load_trainable

        load_trainable(stored.spec.trainable)  # the workers fork with it imported
        announce(job_id)
        server_ready()
        started()
        pool_of(stored.spec).fork_here()
        quiet_optuna()
        return resume_flow(job_id, storage)


def plan(
    job: JobFile,
    overrides: Sequence[str] = (),
    *,
    planner: str = "rubberband",
    catalog: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The staged plan of a job and its predicted time and cost, as ``elastune plan --json``
    prints it. A deadline or budget no plan meets raises SpecError naming the field and
    the smallest value that works."""
    from elastune.planners.cost import read_catalog

    prices = None if catalog is None else read_catalog(catalog)
    report = plan_report(job_spec(job, overrides), planner, prices)
    report.check()
    return report.to_dict()


def plan_report(
    spec: JobSpec, planner: str = "rubberband", catalog: Catalog | None = None
) -> PlanReport:
    """The :class:`~elastune.planners.cost.PlanReport` of ``spec`` on this machine's slots
    (its CUDA devices, else ``compute.workers``), re-planned in flight as ``run`` does;
    ``catalog`` None: the instance catalog elastune ships."""
    from elastune.flows.pools import pool_of
    from elastune.planners.cost import plan_job

    if planner not in PLANNERS:
        raise SpecError(f"planner: {planner!r} is not one of {', '.join(PLANNERS)}")
    devices = pool_of(spec).devices
    return plan_job(spec, planner=planner, catalog=catalog, devices=devices, replanned=True)


def simulate(
    job: JobFile,
    benchmark: str,
    overrides: Sequence[str] = (),
    *,
    workers: int | None = None,
    seeds: int = 1,
    preemptions_per_hour: float = 0.0,
) -> dict[str, Any]:
    """The job in simulated time on ``benchmark`` (``lcbench:TASK_ID`` or
    ``lcbench-table:TASK_ID``), once per seed, as ``elastune simulate --json`` prints it."""
    from elastune.planners.sim import Preemption, simulate_job

    spec = job_spec(job, overrides)
    if not preemptions_per_hour >= 0:  # NaN too
        raise SpecError(f"--preemptions-per-hour must be >= 0, got {preemptions_per_hour}")
    quiet_optuna()
    preemption = Preemption(preemptions_per_hour) if preemptions_per_hour else None
    workers = spec.compute.workers if workers is None else workers
    return simulate_job(spec, benchmark, workers, seeds, preemption=preemption)
