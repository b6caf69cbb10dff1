"""This machine as an instance type: what a job on the local pool is planned on.

A job is planned on ``local`` when its ``compute.instance_types`` is ``[local]``, or when it
names none, runs on the local pool without ECS and no catalog is given (``elastune plan
--catalog`` prices the job on that catalog's types) (:func:`plans_local`). The machine has
``slots`` (:func:`local_slots`): its CUDA devices, or ``compute.workers`` CPU slots without
CUDA, at most ``compute.max_gpus``. It is modelled as up to ``slots`` one-slot nodes of the
type ``local``, ready at once (no queueing, no start-up of their own) and billed by the
second with no minimum, so RubberBand chooses how many slots each stage uses as it sizes a
cloud pool, and the profile's one-GPU timing is one slot's. A slot costs
``compute.price_per_hour / slots`` while a stage holds it: a positive price makes the plan
the cheapest in slot-seconds that meets the deadline; at the default price 0 every plan is
free, RubberBand keeps its fastest start, and the plan is the one with the least p95 JCT on
this machine. There is no spot market here. Trials are one slot wide at most (a trial's
workers must share a node): a data-parallel trial over several CUDA devices is planned on a
catalog type instead.

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "compute": {"workers": 3, "price_per_hour": 0.3}})
    >>> plans_local(spec), plans_local(spec, catalog_given=True), local_slots(spec, devices=2)
    (True, False, 2)
    >>> catalog = local_catalog(spec)
    >>> node = catalog.get("local")
    >>> node.gpus, round(node.price_per_hour, 4), node.startup.mean_s, node.billing.min_charge_s
    (1, 0.1, 0.0, 0.0)
"""

from __future__ import annotations

from pydantic import Field

from elastune.planners.cost.pricing.billing import BillingRule
from elastune.planners.cost.pricing.catalog import Catalog, InstanceType
from elastune.planners.spec import JobSpec, SpecError

LOCAL = "local"


class LocalType(InstanceType):
    """An instance type that may be free (a catalog's types may not)."""

    price_per_hour: float = Field(default=0.0, ge=0)


def plans_local(spec: JobSpec, catalog_given: bool = False) -> bool:
    """Whether ``spec`` is planned on this machine rather than on catalog types."""
    types = spec.compute.instance_types
    if types:
        return types == [LOCAL]
    return spec.compute.pool == "local" and spec.compute.ecs is None and not catalog_given


def check_brackets(spec: JobSpec, brackets: int, devices: int | None = None) -> None:
    """Brackets run side by side, each on its own slots: a SpecError naming the field when
    the machine has fewer slots than the job has brackets, and the ways out."""
    slots = local_slots(spec, devices)
    if brackets <= slots:
        return
    if (devices or spec.compute.workers) >= brackets:  # compute.max_gpus caps them
        field, more = "compute.max_gpus", f"give at least {brackets}, or "
    elif not devices:
        field, more = "compute.workers", f"give at least {brackets}, or "
    else:  # the machine's CUDA devices: no field gives more
        field, more = "scheduler.name", ""
    what = "CUDA devices" if devices else "slots"
    raise SpecError(
        f"{field}: {slots} {what} of this machine are too few for {brackets} brackets "
        f"side by side (each needs a slot); {more}plan one bracket (scheduler.name: sha)"
    )


def local_slots(spec: JobSpec, devices: int | None = None) -> int:
    """The machine's slots: its CUDA ``devices`` or ``compute.workers``, capped by
    ``compute.max_gpus``."""
    slots = devices if devices else spec.compute.workers
    cap = spec.compute.max_gpus
    return slots if cap is None else min(slots, cap)


def local_catalog(spec: JobSpec, gpu: str | None = None, devices: int | None = None) -> Catalog:
    """A catalog of one type, ``local``: this machine's slots at the job file's price, its
    device model the one the profile was measured on (``gpu``; the profile was measured
    here)."""
    slots = local_slots(spec, devices)
    node = LocalType(
        name=LOCAL,
        gpus=1,
        gpu=gpu or LOCAL,
        price_per_hour=spec.compute.price_per_hour / slots,
        billing=BillingRule(quantum_s=1, min_charge_s=0, starts="request"),
    )
    return Catalog(
        region="this machine",
        prices_read="from the job file",
        source="compute.price_per_hour",
        instance_types={LOCAL: node},
    )
