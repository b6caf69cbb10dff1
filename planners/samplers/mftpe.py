"""Multi-fidelity TPE: a BOHB-like Optuna sampler that learns from every rung, not only
from trials trained to the end.

Optuna's ``TPESampler`` models finished trials; under early stopping most trials never
finish, so for a long while it has little to learn from. This sampler reads the
intermediate values every trial reported (the tuning loop reports each one with the
resource as its step) and ranks trials along the *rung ladder*: a trial that reached a
higher rung ranks above every trial stopped below it, and trials that reached the same
rung rank by their value there. Only rungs that hold at least ``min_points`` results
count, so one early arrival at a high rung is not over-read. The top ``gamma`` of that
ranking is the "good" set, the rest the "bad" set; each gets a Parzen density (product
kernels: Gaussian over numbers in the unit cube, log scale where the space says so, no
narrower than TPE's "magic clip" on a whole space; Aitchison-Aitken over choices; a uniform
prior component), and the sampler proposes the configuration that maximises
``l(x) / g(x)``, TPE's acquisition (Bergstra et al. 2011; the ladder ranking is how Optuna's
TPE already orders pruned trials, and BOHB's rule of fitting the highest fidelity with
enough points is its special case with one rung). A share ``random_fraction`` of proposals
is drawn at random, so the model never stops seeing unexplored regions (BOHB keeps a
third).

Where candidates come from:

- ``candidates=None`` (any real job): ``n_candidates`` draws from ``l(x)``, each a good
  configuration perturbed by its kernel, or a fresh draw from the prior;
- ``candidates=[...]``, a finite list of configurations (e.g. the 1000 rows of a benchmark
  table): the sampler scores every candidate not yet tried and returns the best. Random
  proposals then take the first untried row of a permutation seeded by ``seed``, the
  same one :class:`elastune.planners.sim.configs.RowDraw` draws, so with ``random_fraction=1`` the
  sampler reduces exactly to drawing rows at random.

The sampler keeps no state between proposals (it reads the study each time), so the tuning
loop may build a fresh one for every trial.

Example (one parameter, a minimised value that reveals ``x = 0.8`` as best):
    >>> import optuna
    >>> from optuna.distributions import FloatDistribution
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> sampler = MultiFidelityTpeSampler(seed=0, random_fraction=0.0, min_points=5)
    >>> study = optuna.create_study(sampler=sampler)
    >>> space = {"x": FloatDistribution(0, 1)}
    >>> for _ in range(30):
    ...     trial = study.ask(space)
    ...     trial.report((trial.params["x"] - 0.8) ** 2, step=1)
    ...     _ = study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    >>> abs(study.ask(space).params["x"] - 0.8) < 0.1
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

# Bandwidths in the unit cube are kept in this range: narrower kernels overfit a handful
# of points, wider ones flatten the density into the prior.
MIN_BANDWIDTH, MAX_BANDWIDTH = 0.03, 0.5


def magic_clip(n: int) -> float:
    """TPE's "magic clip" (Bergstra et al. 2011, Optuna's ``consider_magic_clip``): the
    narrowest kernel of a density of ``n`` points, ``1 / (n + 2)`` of each range, but not
    below :data:`MIN_BANDWIDTH`. Two near-identical good configurations then still reach a
    quarter of each range around them."""
    return max(MIN_BANDWIDTH, 1.0 / min(100.0, n + 2.0))


def to_unit(distribution: BaseDistribution, value: Any) -> float:
    """A parameter value as a coordinate in [0, 1] (log scale where the space has one)."""
    if isinstance(distribution, CategoricalDistribution):
        return float(distribution.to_internal_repr(value))
    low, high, x = float(distribution.low), float(distribution.high), float(value)
    if distribution.log:
        low, high, x = math.log(low), math.log(high), math.log(x)
    return 0.5 if high == low else (x - low) / (high - low)


def from_unit(distribution: BaseDistribution, u: float) -> Any:
    """The parameter value at coordinate ``u``, on the distribution's grid."""
    if isinstance(distribution, CategoricalDistribution):
        return distribution.to_external_repr(int(u))
    low, high = float(distribution.low), float(distribution.high)
    u = min(max(u, 0.0), 1.0)
    x = (
        math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
        if distribution.log
        else low + u * (high - low)
    )
    step = getattr(distribution, "step", None)
    if isinstance(distribution, IntDistribution):
        step = step or 1
    if step is not None and not distribution.log:
        x = low + round((x - low) / step) * step
    if isinstance(distribution, IntDistribution):
        return int(min(max(round(x), distribution.low), distribution.high))
    return float(min(max(x, low), high))


class _Parzen:
    """A Parzen density over the unit cube plus categorical dimensions, with a uniform
    prior component of weight one (as in TPE), evaluated in batches; ``clip``: the
    narrowest kernel follows :func:`magic_clip`, else :data:`MIN_BANDWIDTH`."""

    def __init__(
        self, points: np.ndarray, categorical: list[int | None], bandwidth: float, clip: bool
    ):
        n, d = points.shape
        self.points, self.n = points, n
        self.numeric = [i for i, k in enumerate(categorical) if k is None]
        self.choices = {i: k for i, k in enumerate(categorical) if k is not None}
        shrink = n ** (-1.0 / (d + 4))  # Scott's rule
        spread = points[:, self.numeric].std(axis=0) if n > 1 else np.full(len(self.numeric), 0.3)
        floor = magic_clip(n) if clip else MIN_BANDWIDTH
        self.h = np.clip(bandwidth * spread * shrink, floor, MAX_BANDWIDTH)
        # Aitchison-Aitken: weight on the observed choice, the rest spread evenly; the
        # smoothing shrinks as points accumulate, at the same rate as the bandwidths.
        self.keep = {i: 1.0 - (k - 1) / k * min(1.0, shrink) for i, k in self.choices.items()}

    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        """Log density at each row of ``x`` (numbers in [0, 1], choices as indices)."""
        # Squared scaled distances by one matrix product: |a|^2 + |b|^2 - 2 a.b.
        a = x[:, self.numeric] / self.h
        b = self.points[:, self.numeric] / self.h
        square = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        log_k = -0.5 * np.maximum(square, 0.0) - np.log(self.h).sum()
        log_k -= 0.5 * len(self.numeric) * math.log(2 * math.pi)
        for i, k in self.choices.items():
            same = x[:, i][:, None] == self.points[:, i][None, :]
            keep = self.keep[i]
            log_k += np.where(same, math.log(keep), math.log(max(1e-12, (1 - keep) / (k - 1))))
        # The prior: uniform, density 1 over the numbers and 1/k per choice.
        log_prior = -sum(math.log(k) for k in self.choices.values())
        every = np.concatenate([log_k, np.full((len(x), 1), log_prior)], axis=1)
        top = every.max(axis=1, keepdims=True)
        return top[:, 0] + np.log(np.exp(every - top).sum(axis=1)) - math.log(self.n + 1)

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` points from the density: a kernel around a random point, or the prior."""
        d = len(self.numeric) + len(self.choices)
        out = np.empty((count, d))
        for j in range(count):
            pick = int(rng.integers(self.n + 1))
            if pick == self.n:  # the prior component
                for i in self.numeric:
                    out[j, i] = rng.random()
                for i, k in self.choices.items():
                    out[j, i] = int(rng.integers(k))
                continue
            centre = self.points[pick]
            for slot, i in enumerate(self.numeric):
                out[j, i] = _reflect(centre[i] + self.h[slot] * rng.standard_normal())
            for i, k in self.choices.items():
                keep = rng.random() < self.keep[i]
                out[j, i] = centre[i] if keep or k == 1 else _other(rng, int(centre[i]), k)
        return out


def _reflect(u: float) -> float:
    """Fold a coordinate back into [0, 1] (a kernel's tail past a bound)."""
    u = abs(u) % 2.0
    return 2.0 - u if u > 1.0 else u


def _other(rng: np.random.Generator, choice: int, k: int) -> int:
    other = int(rng.integers(k - 1))
    return other + 1 if other >= choice else other


class MultiFidelityTpeSampler(optuna.samplers.BaseSampler):
    """TPE over the rung ladder (see the module docstring).

    Args:
        seed: Seeds the random proposals and the candidate draws.
        gamma: Share of the ranked trials that forms the good set, in (0, 1). The default,
            0.07, keeps about the best trials of the top rung (a ninth of the trials reach
            it under bloom): 0.15, BOHB's share, spread the good set over trials that were
            merely promoted (docs/algorithms.md §10.3).
        random_fraction: Share of proposals drawn at random, in [0, 1].
        min_points: Results a rung must hold before it enters the ranking; the model
            starts once the lowest rung has this many.
        n_candidates: Draws from ``l(x)`` scored per proposal when there is no
            ``candidates`` list.
        bandwidth: Factor on Scott's-rule bandwidths (> 0).
        candidates: A finite list of configurations to choose from, each tried at most
            once; None: the whole search space.
    """

    def __init__(
        self,
        seed: int | None = None,
        gamma: float = 0.07,
        random_fraction: float = 0.3,
        min_points: int = 10,
        n_candidates: int = 64,
        bandwidth: float = 1.0,
        candidates: Sequence[Mapping[str, Any]] | None = None,
    ):
        if not 0 < gamma < 1:
            raise ValueError(f"gamma must lie in (0, 1), got {gamma}")
        if not 0 <= random_fraction <= 1:
            raise ValueError(f"random_fraction must lie in [0, 1], got {random_fraction}")
        if min_points < 2:
            raise ValueError(f"min_points must be >= 2, got {min_points}")
        if n_candidates < 1:
            raise ValueError(f"n_candidates must be >= 1, got {n_candidates}")
        if bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
        if candidates is not None and len(candidates) == 0:
            raise ValueError("candidates must hold at least one configuration, got none")
        self.seed = seed
        self.gamma = gamma
        self.random_fraction = random_fraction
        self.min_points = min_points
        self.n_candidates = n_candidates
        self.bandwidth = bandwidth
        self.candidates = list(candidates) if candidates is not None else None
        self._rng = np.random.default_rng(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        # The permutation elastune.planners.sim.configs.RowDraw draws for the same seed.
        self._order: list[int] = (
            np.random.default_rng(seed).permutation(len(self.candidates)).tolist()
            if self.candidates is not None
            else []
        )
        self._chosen: dict[int, dict[str, Any] | None] = {}  # trial number -> proposal
        self._units: np.ndarray | None = None  # candidates in unit coordinates
        self._names = tuple(sorted(self.candidates[0])) if self.candidates else ()
        self._rows = {self._key(c): i for i, c in enumerate(self.candidates or ())}
        self._points: dict[int, list[float]] = {}  # trial number -> unit coordinates

    # --- Optuna's sampler interface: one whole configuration per trial ---------------------

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        if trial.number not in self._chosen:
            self._chosen[trial.number] = self._propose(study, trial)
        config = self._chosen[trial.number]
        if config is None or param_name not in config:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        return config[param_name]

    # --- proposals --------------------------------------------------------------------------

    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
        trials = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        space = _space(trials)
        tried = self._tried(trials) if self.candidates is not None else set()
        if self.candidates is not None and len(tried) >= len(self.candidates):
            raise ValueError(f"all {len(self.candidates)} candidates have been tried")
        use_model = self._rng.random() >= self.random_fraction
        split = self._split(study, trials, space) if use_model and space else None
        if split is None:
            return self._random_candidate(tried)
        good, bad = split
        names = tuple(space)
        categorical = [
            len(d.choices) if isinstance(d, CategoricalDistribution) else None
            for d in space.values()
        ]
        # Candidates drawn from l(x) go only as far as its kernels reach: on a whole space
        # the magic clip keeps them from cloning the good set (a real job's proposals had
        # collapsed onto its first good trial). A finite list scores every untried row and
        # keeps the 0.03 floor: the clip, tried there, cost runs at 32 workers
        # (docs/algorithms.md §10.2).
        clip = self.candidates is None
        l_x = _Parzen(good, categorical, self.bandwidth, clip)
        g_x = _Parzen(bad, categorical, self.bandwidth, clip)
        if self.candidates is None:
            x = l_x.draw(self._rng, self.n_candidates)
            best = x[int(np.argmax(l_x.log_pdf(x) - g_x.log_pdf(x)))]
            return {n: from_unit(space[n], u) for n, u in zip(names, best, strict=True)}
        units = self._candidate_units(space)
        free = np.array([i not in tried for i in range(len(self.candidates))])
        index = np.flatnonzero(free)
        x = units[index]
        return dict(self.candidates[int(index[int(np.argmax(l_x.log_pdf(x) - g_x.log_pdf(x)))])])

    def _random_candidate(self, tried: set[int]) -> dict[str, Any] | None:
        if self.candidates is None:
            return None  # Optuna's RandomSampler draws each parameter
        row = next(i for i in self._order if i not in tried)
        return dict(self.candidates[row])

    def _split(
        self, study: optuna.Study, trials: list[FrozenTrial], space: dict[str, BaseDistribution]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Good and bad configurations (unit coordinates) by the rung-ladder ranking."""
        counts: dict[int, int] = {}
        observed = []
        for t in trials:
            if t.state == TrialState.FAIL or not t.intermediate_values:
                continue
            if any(name not in t.params for name in space):
                continue
            observed.append(t)
            for step in t.intermediate_values:
                counts[step] = counts.get(step, 0) + 1
        rungs = {step for step, count in counts.items() if count >= self.min_points}
        if not rungs:
            return None
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
        ranked = []
        for t in observed:
            reached = [s for s in t.intermediate_values if s in rungs]
            value = t.intermediate_values[max(reached)] if reached else math.nan
            if reached and math.isfinite(value):
                ranked.append((-max(reached), sign * value, t.number, t))
        if len(ranked) < self.min_points:
            return None
        ranked.sort(key=lambda r: r[:3])
        n_good = max(2, math.ceil(self.gamma * len(ranked)))
        points = np.array([self._unit_point(r[3], space) for r in ranked])
        return points[:n_good], points[n_good:]

    def _unit_point(self, trial: FrozenTrial, space: dict[str, BaseDistribution]) -> list[float]:
        # Cached: a trial's parameters never change, and a job has one space.
        if trial.number not in self._points:
            self._points[trial.number] = [to_unit(d, trial.params[n]) for n, d in space.items()]
        return self._points[trial.number]

    def _tried(self, trials: list[FrozenTrial]) -> set[int]:
        """Candidate rows already handed to a trial (by this or an earlier sampler)."""
        tried = {self._rows.get(self._key(t.params)) for t in trials}
        tried |= {self._rows.get(self._key(c)) for c in self._chosen.values() if c is not None}
        tried.discard(None)
        return tried  # type: ignore[return-value]

    def _key(self, config: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(config.get(n) for n in self._names)

    def _candidate_units(self, space: dict[str, BaseDistribution]) -> np.ndarray:
        if self._units is None:
            self._units = np.array(
                [[to_unit(d, c[n]) for n, d in space.items()] for c in self.candidates or ()]
            )
        return self._units


def _space(trials: list[FrozenTrial]) -> dict[str, BaseDistribution]:
    """The search space, from the latest trial that sampled one (a job asks every trial
    over the same space)."""
    for t in reversed(trials):
        if t.distributions:
            return dict(t.distributions)
    return {}
