"""The execution plan: a job file compiled once, for the tune flow, ``elastune plan`` and the
mode line, from the staged plan (``staging``) and, when the job is planned, the cost planner
(``cost``). The top layer of ``planners``: it may use every package below it.

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9}})
    >>> print(resolve_execution(spec, distributed=False).mode)
    mode: not planned, not packed, workers = segments
"""

from elastune.planners.execution.resolve import Execution, ExecutionMode, resolve_execution

__all__ = ["Execution", "ExecutionMode", "resolve_execution"]
