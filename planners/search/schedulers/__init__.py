"""Schedulers: each module holds one algorithm behind the event-driven interface of ``base``
(a scheduler hands out segments and decides after each result); ``factory`` builds the one
a job file names.

Example (synchronous successive halving of three trials: at the rung's barrier the best
one is promoted, the others stopped):
    >>> from elastune.planners.spec.geometry import sha_bracket
    >>> sha = SuccessiveHalving(sha_bracket(3, 1, 3, eta=3))
    >>> first = [sha.next_segment() for _ in range(3)]
    >>> decisions = [d for s, loss in zip(first, [0.3, 0.1, 0.2])
    ...              for d in sha.on_result(Result(s.trial, s.stop, loss))]
    >>> [(d.trial, d.action.value) for d in decisions[3:]]
    [(1, 'promote'), (2, 'stop'), (0, 'stop')]
    >>> sha.next_segment()
    Segment(trial=1, start=1, stop=3, rung=1, bracket=0, gpus=1.0, config=None, clone_from=None)
"""

from elastune.planners.search.schedulers.asha import Asha
from elastune.planners.search.schedulers.base import Action, Decision, Result, Scheduler, Segment
from elastune.planners.search.schedulers.bloom import Bloom
from elastune.planners.search.schedulers.factory import brackets, make_scheduler
from elastune.planners.search.schedulers.fifo import Fifo
from elastune.planners.search.schedulers.hyperband import Hyperband
from elastune.planners.search.schedulers.median import MedianStopping
from elastune.planners.search.schedulers.pbt import Pbt
from elastune.planners.search.schedulers.sha import SuccessiveHalving

__all__ = [
    "Action",
    "Asha",
    "Bloom",
    "Decision",
    "Fifo",
    "Hyperband",
    "MedianStopping",
    "Pbt",
    "Result",
    "Scheduler",
    "Segment",
    "SuccessiveHalving",
    "brackets",
    "make_scheduler",
]
