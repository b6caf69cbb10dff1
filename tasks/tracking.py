"""MLflow in one place: run naming, tags, batched metrics and checkpoints.

One parent run per job, one nested child run per trial (docs/architecture.md §5 names). Every
call takes explicit run ids through ``MlflowClient``, so tasks running in threads,
subprocesses or on remote workers never depend on MLflow's thread-local "active run".
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import mlflow
import sqlalchemy
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.artifact_repo import ArtifactRepository
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.utils.uri import (
    add_databricks_profile_info_to_artifact_uri,
    extract_db_type_from_uri,
)

from elastune.planners.spec import SpecError
from elastune.planners.spec.cache import copy_of_empty
from elastune.tasks.checkpoint_spool import checkpoint_name, checkpoint_resource
from elastune.tasks.stores import check_database, first_use, local_uri, sqlite_path

CHECKPOINTS = "checkpoints"

# (tracking URI, run id) -> the run's artifact location and store, shared by this process's
# trackers (a job's driver has its own besides the one its segments share): a run's
# artifact location never changes. The oldest are dropped past this many, as in MLflow's
# own cache.
_REPOSITORIES_KEPT = 1024
_repositories: OrderedDict[tuple[str, str], tuple[str, ArtifactRepository]] = OrderedDict()
_repositories_lock = threading.Lock()


def check_tracking_uri(uri: str, field: str) -> None:
    """Bad input unless ``uri`` names an MLflow tracking server or database (MLflow refuses
    plain folders, its file store being in maintenance mode)."""
    if uri.startswith(("http://", "https://", "databricks")):
        return
    try:
        extract_db_type_from_uri(uri)
        sqlalchemy.engine.make_url(uri).get_dialect()
    except (MlflowException, sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError):
        raise SpecError(
            f"{field}: {uri!r} is neither a tracking server (http://...) nor a database URI "
            "(e.g. sqlite:///.elastune/mlflow.db)"
        ) from None
    check_database(uri, field)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``, the shape MLflow params want."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return out


def new_store(database: Path) -> None:
    """Start the SQLite store ``database``, unless it exists, as a copy of an empty one
    MLflow made on this machine, once per MLflow version, in the cache: MLflow makes a new
    database by running every schema migration since its first, about 1 s, which each new
    job folder (and each of ``elastune profile``'s calibration jobs) would pay. The copy
    holds MLflow's schema and nothing else; MLflow adds its ``Default`` experiment itself,
    at this store's artifact location. Where the cache cannot be written, MLflow makes the
    store as it would."""

    def make(tmp: Path) -> None:
        from mlflow.store.db.utils import _initialize_tables  # what MLflow runs on a new one

        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()  # the file closed before it is renamed

    copy_of_empty(database, f"mlflow-{mlflow.__version__}-empty.db", make)


@functools.cache
def shared_tracker(uri: str, experiment: str) -> Tracker:
    """One :class:`Tracker` per store and experiment in this process, for the segments that
    train in it: each would otherwise build its own client (tens of ms)."""
    return Tracker(uri, experiment)


class Tracker:
    """MLflow access for one experiment.

    Args:
        uri: Tracking URI; a relative SQLite path is made absolute.
        experiment: Created on first use, with its artifacts beside a SQLite database
            (MLflow would otherwise write them under the current directory).
    """

    def __init__(self, uri: str, experiment: str):
        self.uri = local_uri(uri)
        database = sqlite_path(self.uri)
        # The database and artifacts folder this tracker makes: removed again if the job
        # turns out to be bad input.
        made = [] if database is None else [database, database.parent / "artifacts"]
        self._made = [path for path in made if not path.exists()]
        with first_use(self.uri):  # the client builds (and caches) its store right away
            if database is not None:
                new_store(database)
            self.client = MlflowClient(self.uri)
        self.experiment = experiment
        self._experiment_id: str | None = None
        self.created_experiment = False
        self._tags: dict[str, dict[str, str]] = {}  # run id -> tags set by keep_tags
        self._held: dict[str, dict[str, str]] = {}  # run id -> tags keep_tags has yet to set

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                self._experiment_id = found.experiment_id
            else:
                db = sqlite_path(self.uri)
                location = None if db is None else (db.parent / "artifacts").as_uri()
                try:
                    self._experiment_id = self.client.create_experiment(
                        self.experiment, artifact_location=location
                    )
                    self.created_experiment = True
                except MlflowException as exc:  # another job created it a moment ago
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
                    self._experiment_id = self.client.get_experiment_by_name(
                        self.experiment
                    ).experiment_id
        return self._experiment_id

    # --- runs ----------------------------------------------------------------------------

    def start_job(self, job_id: str, params: dict[str, str], tags: dict[str, str]) -> str:
        run = self.client.create_run(
            self.experiment_id, run_name=job_id, tags={"elastune.job_id": job_id, **tags}
        )
        self.know_artifacts(run.info.run_id, run.info.artifact_uri)
        self._log_params(run.info.run_id, params)
        return run.info.run_id

    def trial_runs(self, parent_run_id: str) -> dict[int, str]:
        """Trial id -> run id of the trial runs under a job's parent run, found by their
        tags: what a driver killed before storing a run's id elsewhere left behind."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
            max_results=50_000,
        )
        return {int(r.data.tags["elastune.trial"]): r.info.run_id for r in runs}

    def start_trial(
        self, job_id: str, parent_run_id: str, trial: int, config: dict[str, Any]
    ) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{trial}",
            tags={
                "mlflow.parentRunId": parent_run_id,
                "elastune.job_id": job_id,
                "elastune.trial": str(trial),
            },
        )
        self.know_artifacts(run.info.run_id, run.info.artifact_uri)
        self._log_params(run.info.run_id, {"trial": str(trial), **flatten(config)})
        return run.info.run_id

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        self.log_history(run_id, [(step, metrics)])

    def log_history(self, run_id: str, reports: list[tuple[int, dict[str, float]]]) -> None:
        """Log ``(step, metrics)`` pairs in as few transactions as MLflow allows, with the
        tags :meth:`keep_tags` holds for the run."""
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for step, m in reports for k, v in m.items()]
        held = self._held.get(run_id, {})
        tags = [RunTag(k, v) for k, v in held.items()]
        batches = [items[i : i + 1000] for i in range(0, len(items), 1000)]  # MLflow's cap
        for i, batch in enumerate(batches or ([[]] if tags else [])):
            self.client.log_batch(run_id, metrics=batch, tags=tags if i == 0 else [])
        if held:
            self._set(run_id, held)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def keep_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        """Set ``tags`` with this process's next metrics for the run (or at
        :meth:`flush_tags`), unless it has set these very values on the run already: for
        tags only this process writes, e.g. each segment's width, which then cost no
        request of their own."""
        written = self._tags.get(run_id, {})
        new = {k: str(v) for k, v in tags.items() if written.get(k) != str(v)}
        if new:
            self._held.setdefault(run_id, {}).update(new)

    def flush_tags(self, run_id: str) -> None:
        """Set the tags :meth:`keep_tags` still holds for the run (none: no request)."""
        held = self._held.get(run_id)
        if held:
            self.set_tags(run_id, held)
            self._set(run_id, held)

    def _set(self, run_id: str, held: dict[str, str]) -> None:
        """``held`` is on the run now."""
        self._tags.setdefault(run_id, {}).update(held)
        self._held.pop(run_id, None)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(
            run_id, status=RunStatus.to_string(RunStatus.from_string(status))
        )

    def status(self, run_id: str) -> str:
        """The run's status: ``RUNNING``, ``FINISHED``, ``FAILED``, ..."""
        return self.client.get_run(run_id).info.status

    def metric_history(self, run_id: str, metric: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(run_id, metric)]

    # --- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, run_id: str, payload: bytes, resource: float) -> None:
        """Store a checkpoint as ``checkpoints/resource-<r>.pt``.

        One file per resource level, never overwritten: a crash while writing leaves the
        previous level intact, and :meth:`load_checkpoint` skips a file it cannot read.
        """
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / checkpoint_name(resource)
            path.write_bytes(payload)
            self.upload_checkpoint(run_id, path)

    def upload_checkpoint(self, run_id: str, path: Path) -> None:
        """Store the checkpoint file ``path`` (named by :func:`checkpoint_name`)."""
        self._artifacts(run_id).log_artifact(str(path), CHECKPOINTS)

    def artifact_location(self, run_id: str) -> str:
        """The run's artifact location, as MLflow gives it (e.g. ``mlflow-artifacts:/...``)."""
        return self._artifact_store(run_id)[0]

    def _artifacts(self, run_id: str) -> ArtifactRepository:
        return self._artifact_store(run_id)[1]

    def _artifact_store(self, run_id: str) -> tuple[str, ArtifactRepository]:
        """The run's artifact location and store, looked up once: MLflow's client reads the
        run from the store (a request to a tracking server) on every list and download."""
        with _repositories_lock:
            found = _repositories.get((self.uri, run_id))
            if found is not None:
                _repositories.move_to_end((self.uri, run_id))
                return found
        return self._keep(run_id, self.client.get_run(run_id).info.artifact_uri)

    def know_artifacts(self, run_id: str, location: str) -> None:
        """Take ``location`` as the run's artifact location (:meth:`artifact_location` of
        the tracker that created the run), so that this process never asks for it."""
        self._keep(run_id, location)

    def _keep(self, run_id: str, location: str) -> tuple[str, ArtifactRepository]:
        uri = add_databricks_profile_info_to_artifact_uri(location, self.uri)
        kept = location, get_artifact_repository(uri, tracking_uri=self.uri)
        with _repositories_lock:
            _repositories[(self.uri, run_id)] = kept
            if len(_repositories) > _REPOSITORIES_KEPT:
                _repositories.popitem(last=False)
        return kept

    def _download(self, run_id: str, artifact: str, folder: str) -> Path:
        """The file ``artifact`` of the run, copied into ``folder``. The repository's own
        file download: its ``download_artifacts`` first lists ``artifact`` (a request more)
        to learn whether it is a folder."""
        path = Path(folder) / Path(artifact).name
        self._artifacts(run_id)._download_file(artifact, str(path))
        return path

    def checkpoints(self, run_id: str) -> list[tuple[float, str]]:
        """(resource, artifact path) of every checkpoint, highest resource first."""
        found = []
        for item in self._artifacts(run_id).list_artifacts(CHECKPOINTS):
            resource = checkpoint_resource(Path(item.path).name)
            if resource is not None:
                found.append((resource, item.path))
        return sorted(found, reverse=True)

    def load_checkpoint(self, run_id: str, loader: Any) -> tuple[float, Any] | None:
        """The newest checkpoint ``loader(bytes)`` can read, with its resource; else None."""
        for resource, artifact in self.checkpoints(run_id):
            with tempfile.TemporaryDirectory() as tmp:
                data = self._download(run_id, artifact, tmp).read_bytes()
            # A torn or corrupt file falls back to the previous resource level.
            with contextlib.suppress(Exception):
                return resource, loader(io.BytesIO(data))
        return None

    def copy_checkpoint(self, source_run_id: str, target_run_id: str) -> float | None:
        """Give ``target`` the newest checkpoint of ``source`` (PBT exploit)."""
        found = self.checkpoints(source_run_id)
        if not found:
            return None
        resource, artifact = found[0]
        with tempfile.TemporaryDirectory() as tmp:
            path = self._download(source_run_id, artifact, tmp)
            self._artifacts(target_run_id).log_artifact(str(path), CHECKPOINTS)
        return resource

    # --- the model registry --------------------------------------------------------------

    def registered(self, name: str) -> tuple[str, float] | None:
        """(version, metric) of the newest version of registered model ``name``."""
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(f"name = '{name}'")
        except MlflowException:
            return None
        tagged = [v for v in versions if "elastune.metric" in v.tags]
        if not tagged:
            return None
        newest = max(tagged, key=lambda v: int(v.version))
        return str(newest.version), float(newest.tags["elastune.metric"])

    def register(self, run_id: str, model: Any, name: str, tags: dict[str, Any]) -> str:
        """Log ``model`` (a torch module) in ``run_id`` and register it as a new version."""
        import mlflow
        import torch

        mlflow.set_tracking_uri(self.uri)
        # Pickle is chosen on purpose (pt2 needs an input example and loads back as a
        # GraphModule, docs/stack.md §4), so MLflow's warning about it is noise here.
        noisy = logging.getLogger("mlflow.pytorch")
        level = noisy.level
        noisy.setLevel(logging.ERROR)
        try:
            with mlflow.start_run(run_id=run_id):
                info = mlflow.pytorch.log_model(
                    model,
                    name="model",
                    serialization_format="pickle",
                    registered_model_name=name,
                    pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                )
        finally:
            noisy.setLevel(level)
        version = str(info.registered_model_version)
        for key, value in tags.items():
            self.client.set_model_version_tag(name, version, key, str(value))
        return version

    # --- segment reports (how a remote worker's result reaches the tune flow) ------------

    def save_report(self, run_id: str, name: str, report: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps(report))
            self._artifacts(run_id).log_artifact(str(path), "segments")

    def load_report(self, run_id: str, name: str) -> dict[str, Any] | None:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = self._download(run_id, f"segments/{name}.json", tmp)
            except Exception:  # MLflow raises its own errors for a missing artifact
                return None
            return json.loads(path.read_text())

    # --- rollback of a job that turned out to be bad input --------------------------------

    def purge(self, run_ids: list[str]) -> None:
        """Delete these runs (and the experiment, if this job created it). On a database
        store they are deleted for good; a tracking server only marks them deleted."""
        from mlflow.cli import gc

        for run_id in run_ids:
            self.client.delete_run(run_id)
        if self.created_experiment:
            self.client.delete_experiment(self.experiment_id)
        if self.uri.startswith(("http://", "https://", "databricks")):
            return
        args = ["--backend-store-uri", self.uri, "--tracking-uri", self.uri]
        args += ["--run-ids", ",".join(run_ids)]
        if self.created_experiment:
            args += ["--experiment-ids", self.experiment_id]
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            gc.main(args, standalone_mode=False)
        self._remove_if_empty()

    def _remove_if_empty(self) -> None:
        """Remove the database (and artifacts folder) this tracker made when it holds
        nothing but MLflow's own empty ``Default`` experiment: bad input leaves no store."""
        if not self._made or self._made[0] != sqlite_path(self.uri):
            return
        with first_use(self.uri):  # another job may be opening the same new store
            experiments = self.client.search_experiments(view_type=ViewType.ALL)
            if [e.name for e in experiments] != ["Default"] or self.client.search_runs(
                [experiments[0].experiment_id], run_view_type=ViewType.ALL, max_results=1
            ):
                return
            self._made[0].unlink()
            for folder in self._made[1:]:
                shutil.rmtree(folder, ignore_errors=True)
