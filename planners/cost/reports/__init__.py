"""What a priced plan tells its reader: the report ``elastune plan`` prints and ``--json``
emits (``plan_report``), and its Gantt chart (``gantt``, which imports matplotlib when
drawing).

Example:
    >>> format_duration(3725)
    '1h2m5s'
"""

from elastune.planners.cost.reports.plan_report import InfeasibleError, PlanReport, format_duration

__all__ = ["InfeasibleError", "PlanReport", "format_duration"]
