"""Cost planning (ALGORITHMS.md §4-§5): catalog, profile, billing, simulator, planners.

``plan_job(spec, planner, catalog)`` is the entry point; ``draw_gantt`` (in
``planners.cost.gantt``, which imports matplotlib) draws its report.
"""

from planners.cost.catalog import Catalog, parse_catalog, read_catalog
from planners.cost.job import plan_job
from planners.cost.profile import Profile
from planners.cost.report import InfeasibleError, PlanReport, StageAllocation

__all__ = [
    "Catalog",
    "InfeasibleError",
    "PlanReport",
    "Profile",
    "StageAllocation",
    "parse_catalog",
    "plan_job",
    "read_catalog",
]
