"""The plan simulator: an allocation plan's job completion time and cost, by Monte Carlo.

:class:`PlanSimulator` plays a plan over many samples of the same random draws (``draws``),
each stage laid out on its nodes (``layout``, ``nodes``), with spot interruptions
(``interruptions``) and the trials a re-planned chain still holds (``held``); it returns an
``outcome`` per sample, and plays the plan once with mean times for the Gantt chart
(``trace``).

Example:
    >>> from elastune.planners.cost.montecarlo.outcome import quantile
    >>> quantile([4.0, 1.0, 3.0, 2.0], 0.5)
    2.5
"""

from elastune.planners.cost.montecarlo.outcome import Outcome
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.montecarlo.trace import Trace

__all__ = ["Outcome", "PlanSimulator", "Trace"]
