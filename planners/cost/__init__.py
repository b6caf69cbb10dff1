"""Cost planning (docs/algorithms.md §4-§5): catalog, billing, simulator, planners.

``plan_job(spec, planner, catalog)`` is the entry point; ``draw_gantt`` (in
``elastune.planners.cost.gantt``, which imports matplotlib) draws its report.

The modules, from the inputs up: ``catalog`` and ``billing`` (instance types and their
prices; the speed profile they are timed with is :class:`elastune.planners.staging.Profile`),
``allocation`` (plans: GPUs per trial, instance type and nodes per stage), ``simulate``
(``PlanSimulator``: JCT and cost by Monte Carlo, with ``draws``, ``layout``, ``pool``,
``interruptions`` (spot), ``held`` (the nodes and trials in flight), ``outcome`` and
``trace``), the planners ``rubberband`` (with ``sizing``) and ``seer``, the ``baselines``,
``estimate``, ``replan`` and ``recourse`` (the profile learnt in flight, re-planning, and a
first stage chosen for it), and ``job`` and ``report`` (a job file in, a report out).

Example (a small SHA job on the built-in catalog: one GPU per trial on one node is the
cheapest plan that meets the two-hour deadline):
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "small", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
    ...     "budget": {"deadline": "2h"},
    ...     "compute": {"instance_types": ["g5.xlarge", "g5.12xlarge"]},
    ...     "profile": {"seconds_per_unit": {1: 300}, "speedup": {2: 1.8, 4: 3.2}}})
    >>> report = plan_job(spec, catalog=read_catalog())
    >>> report.feasible, report.to_dict()["jct_s"]["p95"] <= 2 * 3600
    (True, True)
    >>> for row in report.rows:
    ...     a = row.allocation
    ...     print(row.name, a.trials, "x", a.gpus_per_trial, "GPU on", a.instances, a.instance_type)
    b0-r0 9 x 1.0 GPU on 1 g5.xlarge
    b0-r1 3 x 1.0 GPU on 1 g5.xlarge
    b0-r2 1 x 1.0 GPU on 1 g5.xlarge
"""

from elastune.planners.cost.catalog import Catalog, parse_catalog, read_catalog
from elastune.planners.cost.job import plan_job
from elastune.planners.cost.report import InfeasibleError, PlanReport, StageAllocation

__all__ = [
    "Catalog",
    "InfeasibleError",
    "PlanReport",
    "StageAllocation",
    "parse_catalog",
    "plan_job",
    "read_catalog",
]
