"""Cost planning (docs/algorithms.md §4-§5): a job file in, a priced plan out.

``plan_job(spec, planner, catalog)`` (``price_job``) is the entry point; ``draw_gantt`` (in
``elastune.planners.cost.reports.gantt``, which imports matplotlib) draws its report.

The packages, from the inputs up, each importing only those before it: ``pricing`` (the
instance catalog, billing, this machine as an instance type, and the allocation plans that
are priced: GPUs per trial, instance type and nodes per stage; the speed profile they are
timed with is :class:`elastune.planners.staging.Profile`), ``montecarlo`` (the plan
simulator: JCT and cost by Monte Carlo), ``planning`` (RubberBand, SEER, spot with a
deadline, static baselines), ``inflight`` (the profile learnt from a job's own segments,
re-planning, and a first stage chosen for it) and ``reports`` (the plan report and its
Gantt chart).

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

from elastune.planners.cost.price_job import plan_job
from elastune.planners.cost.pricing.catalog import Catalog, parse_catalog, read_catalog
from elastune.planners.cost.reports.plan_report import InfeasibleError, PlanReport, StageAllocation

__all__ = [
    "Catalog",
    "InfeasibleError",
    "PlanReport",
    "StageAllocation",
    "parse_catalog",
    "plan_job",
    "read_catalog",
]
