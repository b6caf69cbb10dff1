"""Planning in flight: the profile a job learns from its own segments (``estimate``),
whether to keep or change the plan of the work left (``replanner``), and a first stage
chosen for the re-planning to come (``recourse``).

Example:
    >>> from elastune.planners.cost.inflight.replanner import Reason
    >>> sorted(reason.value for reason in Reason)[:2]
    ['cheaper', 'deadline_at_risk']
"""

from elastune.planners.cost.inflight.estimate import ProfileEstimate
from elastune.planners.cost.inflight.recourse import recourse_start
from elastune.planners.cost.inflight.replanner import Replanner

__all__ = ["ProfileEstimate", "Replanner", "recourse_start"]
