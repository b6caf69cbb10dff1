"""The price model: instance types and their billing, this machine as one, and the
allocation plans the cost planners choose and the simulator prices.

The modules: ``catalog`` (instance types, prices, spot terms and provisioning delays, from
``planners/data/catalog.yaml`` or a file of yours), ``billing`` (how an instance's seconds
are charged), ``this_machine`` (a job on the local pool planned on its own slots),
``allocation`` (an :class:`AllocationPlan`: GPUs per trial, instance type and nodes per
stage) and ``stage_shapes`` (trials per node, waves, nodes per stage).

Example:
    >>> catalog = read_catalog()
    >>> g5 = catalog.get("g5.12xlarge")
    >>> g5.gpus, g5.price("on-demand") > g5.price("spot")
    (4, True)
"""

from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.catalog import (
    Catalog,
    InstanceType,
    parse_catalog,
    read_catalog,
)

__all__ = [
    "AllocationPlan",
    "Catalog",
    "InstanceType",
    "StagePlan",
    "parse_catalog",
    "read_catalog",
]
