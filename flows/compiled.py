"""A job compiled for this driver, once: its spec, its trainable and its execution plan.

The trainable is imported here (``elastune.tasks.trainable`` caches it for the rest of the process)
and what it can do, with the CUDA devices of a local job, decides the execution plan
(:func:`elastune.planners.execution.execution_plan`): the staged plan, the admission policy and the
mode. The tune and resume flows compile a job once, before they create anything;
``elastune plan`` compiles the job it priced to say which mode ``run`` would give it.

Example (a SHA job without a profile: its plan's three stages, ``compute.workers`` at once):
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "tests.trainables:quadratic",
    ...     "metric": "val_accuracy", "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9}})
    >>> compiled = compile_job(spec)
    >>> len(compiled.execution.plan.stages), compiled.execution.admission
    (3, WorkerCap(workers=2, ahead=0))
"""

from __future__ import annotations

from dataclasses import dataclass

from elastune.planners.cost import Catalog, PlanReport
from elastune.planners.execution import ExecutionPlan, execution_plan
from elastune.planners.spec import JobSpec
from elastune.tasks.train import cuda_devices
from elastune.tasks.trainable import Trainable, load_trainable, supports_distributed


@dataclass(frozen=True)
class CompiledJob:
    """A validated job with its trainable, the local CUDA devices its segments share out
    (None on a work pool or on CPU) and its execution plan."""

    spec: JobSpec
    trainable: Trainable
    devices: int | None
    execution: ExecutionPlan


def local_devices(spec: JobSpec) -> int | None:
    """The CUDA devices a local job's segments share out; None on a work pool or on CPU."""
    return cuda_devices() if spec.compute.pool == "local" else None


def compile_job(
    spec: JobSpec, *, catalog: Catalog | None = None, report: PlanReport | None = None
) -> CompiledJob:
    """Compile ``spec``; bad input (the trainable, the plan, the packing) raises SpecError
    naming the field. ``catalog`` and ``report`` as :func:`execution_plan` takes them."""
    trainable = load_trainable(spec.trainable)
    devices = local_devices(spec)
    execution = execution_plan(
        spec,
        distributed=supports_distributed(trainable),
        devices=devices,
        catalog=catalog,
        report=report,
    )
    return CompiledJob(spec, trainable, devices, execution)
