"""What a job's Optuna study holds for ``resume``: the validated job, its parent MLflow
run and, once it finished, its summary. Without MLflow, Prefect or torch, so the command
line answers an unknown or finished job id in a moment.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optuna

from elastune.planners.spec import JobSpec, SpecError, parse_job
from elastune.tasks.stores import OPTUNA_TABLE, check_storage, local_uri, sqlite_path, sqlite_tables
from elastune.tasks.study_storage import driver_storage

# Where a job keeps what resume needs: the spec and parent run on the study, each trial's
# MLflow run on its Optuna trial; and, once it finished, when and its summary.
SPEC_ATTR, RUN_ATTR, FINISHED_ATTR = "elastune.spec", "mlflow_run_id", "elastune.finished"


class StoredJob(NamedTuple):
    """What a job's study holds: the study, the spec, the parent run's id, and for a job
    that finished, ``{"at": ISO time, "summary": its summary}``."""

    study: optuna.Study
    spec: JobSpec
    parent: str
    finished: dict[str, Any] | None = None

    def already_finished(self) -> dict[str, Any] | None:
        """The summary of a finished job, marked ``already_finished`` and with its
        ``finished_at`` time; None if it has not finished."""
        if self.finished is None:
            return None
        at = self.finished["at"]
        return {**self.finished["summary"], "already_finished": True, "finished_at": at}


def stored_job(job_id: str, storage: str, field: str = "storage") -> StoredJob:
    """Job ``job_id`` as its study in ``storage`` holds it; a job that is not there is bad
    input naming the job id, a malformed ``storage`` bad input naming ``field``."""
    check_storage(storage, field)
    check_optuna_file(job_id, storage)
    try:
        study = optuna.load_study(study_name=job_id, storage=driver_storage(local_uri(storage)))
    except KeyError:
        raise SpecError(f"job id: no job {job_id!r} in {storage}") from None
    attrs = study.user_attrs  # one read of the storage
    if SPEC_ATTR not in attrs:
        raise SpecError(f"job id: study {job_id!r} was not made by elastune")
    spec = parse_job(attrs[SPEC_ATTR], f"job {job_id}")
    return StoredJob(study, spec, attrs[RUN_ATTR], attrs.get(FINISHED_ATTR))


def check_optuna_file(job_id: str, storage: str) -> None:
    """Bad input naming the job id when a SQLite ``storage`` holds no Optuna study: read
    before Optuna opens it, which would create the file and its folder, or write its
    schema into an empty file."""
    database = sqlite_path(storage)
    if database is None:
        return
    if not database.exists():
        raise SpecError(f"job id: no job {job_id!r} in {storage} (no such database)")
    tables = sqlite_tables(database)
    if tables is not None and OPTUNA_TABLE not in tables:
        raise SpecError(f"job id: no job {job_id!r} in {storage} (no Optuna study there)")
