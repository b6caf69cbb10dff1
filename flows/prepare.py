"""A job prepared for its driver, once, before anything is created: its trainable imported,
its stores checked, the pool its segments go to, and its execution plan.

What its trainable can do, with the pool's CUDA devices, decides the execution plan
(:func:`elastune.planners.execution.resolve_execution`): the staged plan, the admission policy
and the mode. ``elastune run``, ``elastune.run(...)`` and a deployment's ``tune`` flow run
each prepare the job once and hand the prepared job to the same driver
(:func:`elastune.flows.tune.run_job`); ``elastune plan`` prepares the job it priced to say
which mode ``run`` would give it.

Example (a SHA job without a profile: its plan's three stages, ``compute.workers`` at once):
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "tests.trainables:quadratic",
    ...     "metric": "val_accuracy", "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9}})
    >>> job = prepare(spec)
    >>> len(job.execution.plan.stages), job.execution.admission
    (3, WorkerCap(workers=2, ahead=0))
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, InstanceOf, SkipValidation, model_serializer

from elastune.flows.pools import LocalPool, WorkPool, pool_of
from elastune.planners.cost import Catalog, PlanReport
from elastune.planners.execution import Execution, resolve_execution
from elastune.planners.spec import JobSpec
from elastune.tasks.stores import check_storage
from elastune.tasks.tracking import check_tracking_uri
from elastune.tasks.trainable import Trainable, load_trainable, supports_distributed


class PreparedJob(BaseModel):
    """A validated job with its trainable, the pool its segments go to (not yet opened)
    and its execution plan. As a flow run's parameter it shows as its spec and pool."""

    model_config = ConfigDict(frozen=True)

    spec: JobSpec
    trainable: SkipValidation[Trainable]
    pool: InstanceOf[LocalPool] | InstanceOf[WorkPool]
    execution: InstanceOf[Execution]

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        trainable: Trainable,
        catalog: Catalog | None = None,
        report: PlanReport | None = None,
    ) -> PreparedJob:
        """``spec`` with its imported ``trainable``, planned (``catalog`` and ``report`` as
        :func:`resolve_execution` takes them); bad input raises SpecError naming the field."""
        pool = pool_of(spec)
        execution = resolve_execution(
            spec,
            distributed=supports_distributed(trainable),
            devices=pool.devices,
            catalog=catalog,
            report=report,
        )
        return cls(spec=spec, trainable=trainable, pool=pool, execution=execution)

    @property
    def devices(self) -> int | None:
        """The CUDA devices the driver shares out among segments (None: the pool's nodes
        hold their own, or there are none)."""
        return self.pool.devices

    @model_serializer
    def _shown(self) -> dict[str, Any]:
        return {"spec": self.spec.model_dump(mode="json"), "pool": self.pool.name}


def prepare(spec: JobSpec) -> PreparedJob:
    """Import the trainable, check the stores and plan the job: every mistake is bad input,
    raised before anything is created."""
    trainable = load_trainable(spec.trainable)
    check_stores(spec)
    return PreparedJob.of(spec, trainable)


def check_stores(spec: JobSpec) -> None:
    """Bad input unless the job's MLflow and Optuna stores can be opened (read only)."""
    check_tracking_uri(spec.tracking.mlflow_uri, "tracking.mlflow_uri")
    check_storage(spec.tracking.optuna_storage, "tracking.optuna_storage")
