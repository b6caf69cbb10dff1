"""The search: which configurations train, how far, and in what order.

``schedulers`` decide which segment runs next and what happens to a trial after each
result (one algorithm per module, built by name in ``schedulers.factory``); ``loop`` couples
a scheduler with the Optuna study that proposes configurations, for the Prefect flow and
the simulator alike; ``journal`` keeps its events so a killed driver resumes; ``explore``
draws and perturbs values for PBT and the simulator's fast path.

Example (a two-rung SHA job, trained by hand):
    >>> import optuna
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "sampler": {"name": "random", "seed": 0},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 3}})
    >>> loop = TuningLoop(spec, optuna.create_study(direction="maximize"))
    >>> segments = 0
    >>> while (segment := loop.next_segment()) is not None:
    ...     segments += 1
    ...     _ = loop.record(Result(segment.trial, segment.stop, -loop.configs[segment.trial]["x"]))
    >>> segments, loop.best().resource
    (4, 3)
"""

from elastune.planners.search.journal import Journal, StudyJournal
from elastune.planners.search.loop import Best, TuningLoop
from elastune.planners.search.schedulers import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    brackets,
    make_scheduler,
)

__all__ = [
    "Action",
    "Best",
    "Decision",
    "Journal",
    "Result",
    "Scheduler",
    "Segment",
    "StudyJournal",
    "TuningLoop",
    "brackets",
    "make_scheduler",
]
