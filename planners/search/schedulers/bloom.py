"""Bloom: asynchronous successive halving that keeps the late bloomers (elastune's default).

Early ranks are a poor guide on real learning curves: on LCBench the rank correlation
between epoch 1 and epoch 52 is -0.6..0.5, and the configurations that end up best are
often middling after an epoch or two. Bloom is promotion-type ASHA (docs/algorithms.md §3)
with three changes aimed at them:

1. **A late first cut.** A trial can be cut at most ``promotions`` times, so the first rung
   sits at ``max_resource / eta**promotions`` (default 2: rungs at R/9, R/3, R) instead of
   at ``min_resource``; ``brackets > 1`` adds less aggressive brackets as asynchronous
   Hyperband does (§3.4), each new trial drawing its bracket with Optuna's weights.
2. **Promotion by the shape of the curve, not one point.** A trial enters its rung with the
   score ``loss + slope_weight * slope * ln(R / r)``, where ``slope`` is its own loss change
   per unit of ``ln(resource)`` over the second half of the resource it has trained
   (``[r/2, r]``): a trial still improving fast ranks above one that has flattened at the
   same value. ``slope_weight = 0`` is plain ASHA ranking.
3. **Revival when the pool runs dry.** Once no new trial may start (``max_trials``) and no
   paused trial is promotable, a worker that would idle while regular work still runs
   promotes the best paused trial of the highest rung anyway (growing that rung's top
   set), instead of waiting for the job's tail. Revived trials never delay regular work,
   and the job still ends when no regular work is left.

The scheduler decides when to train; *which* configurations to try is the sampler's job:
the default sampler, :class:`elastune.planners.samplers.mftpe.MultiFidelityTpeSampler`, learns from
every rung, and a late first cut gives it reliable results sooner.

Example (rungs at 2, 6 and 18; the slope lifts a late bloomer):
    >>> bloom = Bloom(1, 18, eta=3, max_trials=3, promotions=2)
    >>> [(j.trial, j.start, j.stop) for j in (bloom.next_segment() for _ in range(3))]
    [(0, 0, 2), (1, 0, 2), (2, 0, 2)]
    >>> _ = bloom.on_result(Result(0, 2, 0.30, history=((1, 0.31),)))   # flat
    >>> _ = bloom.on_result(Result(1, 2, 0.50, history=((1, 0.52),)))
    >>> _ = bloom.on_result(Result(2, 2, 0.33, history=((1, 0.60),)))   # still rising fast
    >>> bloom.next_segment()                               # the riser ranks first on its score
    Segment(trial=2, start=2, stop=6, rung=1, bracket=0, gpus=1.0, config=None, clone_from=None)
"""

from __future__ import annotations

import math
import random

from elastune.planners.search.schedulers.asha import AsyncBracket, draw_bracket
from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
    check_max_trials,
)
from elastune.planners.spec.geometry import hyperband_trials, ladder_depth, rung_levels


class Bloom(Scheduler):
    """Promotion-type ASHA with a late first cut, curve-aware ranking and revival.

    Args:
        min_resource: Least resource a rung may sit at.
        max_resource: Resource of the top rung; a trial that reaches it is complete.
        eta: Reduction factor, at least 2: each rung promotes its top ``1/eta``.
        max_trials: How many configurations to start; None starts new ones until the
            executor's deadline or budget ends the job.
        promotions: How many times the most aggressive bracket may cut a trial (>= 0);
            its first rung is ``max_resource / eta**promotions``, but not below
            ``min_resource``.
        brackets: How many brackets, from the most aggressive one down to less aggressive
            ones (each with one cut fewer); at most ``promotions + 1``.
        slope_weight: Weight of the curve's recent slope in the rung score (>= 0).
        revive: Let workers that would idle promote the best paused trial (see above).
        seed: Seed of the bracket draw.
    """

    def __init__(
        self,
        min_resource: float,
        max_resource: float,
        eta: int = 3,
        max_trials: int | None = None,
        promotions: int = 2,
        brackets: int = 1,
        slope_weight: float = 0.25,
        revive: bool = True,
        seed: int = 0,
    ):
        s_max = ladder_depth(min_resource, max_resource, eta)
        check_max_trials(max_trials)
        if promotions < 0:
            raise ValueError(f"promotions must be >= 0, got {promotions}")
        most = min(promotions, s_max)  # a rung may not sit below min_resource
        if not 1 <= brackets <= most + 1:
            raise ValueError(
                f"brackets must lie in 1..{most + 1} (one per possible number of cuts), "
                f"got {brackets}"
            )
        if not (slope_weight >= 0 and math.isfinite(slope_weight)):
            raise ValueError(f"slope_weight must be a finite number >= 0, got {slope_weight}")
        self.max_resource = max_resource
        self.max_trials = max_trials
        self.slope_weight = slope_weight
        self.revive = revive
        # Bracket with early-stopping rate s makes s_max - s cuts: the most aggressive one
        # allowed makes `most`, the next one cut fewer.
        rates = [s_max - most + i for i in range(brackets)]
        self.brackets = [
            AsyncBracket(s, rung_levels(min_resource, max_resource, eta, s), eta, 0) for s in rates
        ]
        self._weights = [hyperband_trials(s, s_max, eta) for s in rates]
        self._rng = random.Random(seed)
        self._counter = TrialCounter()
        self._where: dict[int, tuple[AsyncBracket, int]] = {}  # trial -> (bracket, rung trained to)
        self._paused: set[int] = set()
        self._curves: dict[int, dict[float, float]] = {}  # trial -> resource -> loss
        self._regular: set[int] = set()  # trials whose running segment is not a revival

    @property
    def started(self) -> int:
        return self._counter.next_id

    def next_segment(self) -> Segment | None:
        found = self._promotion()
        if found is not None:
            return self._promote(*found, regular=True)
        if self.max_trials is None or self.started < self.max_trials:
            bracket = self._draw_bracket()
            trial = self._counter.new()
            self._where[trial] = (bracket, 0)
            self._regular.add(trial)
            return Segment(trial, 0, bracket.levels[0], 0, bracket.s)
        if self.revive and self._regular:
            found = self._revival()
            if found is not None:
                return self._promote(*found, regular=False)
        return None

    def _promotion(self) -> tuple[int, int, AsyncBracket] | None:
        """The regular ASHA promotion to the highest resource, across brackets."""
        best: tuple[float, int, int, AsyncBracket] | None = None
        for bracket in self.brackets:
            found = bracket.promotion()
            if found is not None:
                trial, k = found
                if best is None or bracket.levels[k + 1] > best[0]:
                    best = (bracket.levels[k + 1], trial, k, bracket)
        return None if best is None else best[1:]

    def _revival(self) -> tuple[int, int, AsyncBracket] | None:
        """The best paused trial of the highest rung, in or out of its top set."""
        best: tuple[float, tuple[bool, float, int], int, int, AsyncBracket] | None = None
        for trial in self._paused:
            bracket, k = self._where[trial]
            key = bracket.rungs[k].keys[trial]
            candidate = (-bracket.levels[k], key, trial, k, bracket)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else best[2:]

    def _promote(self, trial: int, k: int, bracket: AsyncBracket, regular: bool) -> Segment:
        bracket.rungs[k].promoted.add(trial)
        self._paused.discard(trial)
        self._where[trial] = (bracket, k + 1)
        if regular:
            self._regular.add(trial)
        return Segment(trial, bracket.levels[k], bracket.levels[k + 1], k + 1, bracket.s)

    def _draw_bracket(self) -> AsyncBracket:
        return draw_bracket(self.brackets, self._weights, self._rng)

    def on_result(self, result: Result) -> list[Decision]:
        trial = result.trial
        bracket, k = self._where[trial]
        self._regular.discard(trial)
        if result.failed:
            self._curves.pop(trial, None)
            return [Decision(trial, Action.FAIL, k)]
        if k == len(bracket.levels) - 1:
            self._curves.pop(trial, None)
            return [Decision(trial, Action.COMPLETE, k)]
        bracket.rungs[k].add(trial, self._score(result))
        self._paused.add(trial)
        return [Decision(trial, Action.PAUSE, k)]

    def _score(self, result: Result) -> float:
        """The loss at the rung, corrected by the curve's recent slope (see the module)."""
        curve = self._curves.setdefault(result.trial, {})
        curve.update(result.history)
        curve[result.resource] = result.loss
        r = result.resource
        if self.slope_weight == 0 or not math.isfinite(result.loss):
            return result.loss
        earlier = [s for s in curve if s <= r / 2 and math.isfinite(curve[s])]
        if not earlier:  # nothing reported in the first half: no slope to read
            return result.loss
        half = max(earlier)
        slope = (result.loss - curve[half]) / math.log(r / half)
        return result.loss + self.slope_weight * slope * math.log(self.max_resource / r)

    def finish(self) -> list[Decision]:
        """Trials still waiting at a rung are stopped for good."""
        decisions = [
            Decision(trial, Action.STOP, self._where[trial][1]) for trial in sorted(self._paused)
        ]
        self._paused.clear()
        return decisions
