"""The cost planners: each chooses an allocation plan and prices it with the simulator.

``rubberband`` (RubberBand: the cheapest plan whose p95 meets the deadline), ``seer`` (SEER:
the most configurations a deadline and a budget can explore), ``spot`` (each stage on spot
capacity while the deadline's slack allows) and ``baselines`` (static pools, priced by the
same simulator, for comparison).

Example (SEER's survivors of 81 first-rung trials over four rungs, eta 3):
    >>> from elastune.planners.cost.planning.seer import survivors
    >>> survivors(81, 4, 3)
    (81, 27, 9, 3)
"""

from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.planning.seer import Seer
from elastune.planners.cost.planning.spot import plan_spot

__all__ = ["RubberBand", "Seer", "plan_spot"]
