"""Rung ladders and bracket geometry of successive halving and Hyperband (docs/algorithms.md §2).

Rungs are anchored at the top: rung ``i`` of a bracket with ``K`` promotions sits at
``R / eta**(K - i)``, so every finalist trains to exactly ``max_resource``. When ``R / r`` is
a power of ``eta`` this equals the bottom-anchored ``r * eta**(s + i)`` of the papers.

Example:
    >>> [(r.trials, r.resource) for r in hyperband_brackets(1, 81, 3)[1].rungs]
    [(34, 3), (11, 9), (3, 27), (1, 81)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def floor_log(x: float, base: float) -> int:
    """Largest ``k`` with ``base**k <= x``, counted by multiplying up.

    ``int(math.log(243) / math.log(3))`` is 4, not 5; this returns 5.
    """
    if base <= 1:
        raise ValueError(f"base must be > 1, got {base}")
    if x < 1:
        raise ValueError(f"x must be >= 1, got {x}")
    k, power = 0, base
    # A relative tolerance keeps x = 0.1 * 3**5 / 0.1 from losing a rung to rounding.
    while power <= x * (1 + 1e-12):
        k += 1
        power *= base
    return k


def ladder_depth(min_resource: float, max_resource: float, eta: float) -> int:
    """How many times ``eta`` fits between the ends of a rung ladder (Hyperband's
    ``s_max``), with the arguments checked as a scheduler's constructor does."""
    if eta < 2:
        raise ValueError(f"eta must be >= 2, got {eta}")
    if not 0 < min_resource <= max_resource:
        raise ValueError(
            f"need 0 < min_resource <= max_resource, got {min_resource} and {max_resource}"
        )
    return floor_log(max_resource / min_resource, eta)


def _resource(value: float, integral: bool) -> float:
    return max(1, round(value)) if integral else value


def rung_levels(min_resource: float, max_resource: float, eta: float, s: int = 0) -> list[float]:
    """Resource levels of the rungs of the bracket with early-stopping rate ``s``.

    Levels are integers when both ends are integers (epochs cannot be split).
    """
    s_max = floor_log(max_resource / min_resource, eta)
    if not 0 <= s <= s_max:
        raise ValueError(f"s must lie in 0..{s_max}, got {s}")
    promotions = s_max - s
    integral = float(min_resource).is_integer() and float(max_resource).is_integer()
    return [
        _resource(max_resource / eta ** (promotions - i), integral) for i in range(promotions + 1)
    ]


@dataclass(frozen=True)
class Rung:
    """``trials`` trials are trained up to ``resource`` at this rung."""

    trials: int
    resource: float


@dataclass(frozen=True)
class Bracket:
    """One successive-halving bracket; ``s`` is its ASHA early-stopping rate."""

    s: int
    rungs: tuple[Rung, ...]

    @property
    def trials(self) -> int:
        return self.rungs[0].trials

    def work(self, resumed: bool = True) -> float:
        """Resource trained by the whole bracket, resuming from checkpoints or not."""
        total, previous = 0.0, 0.0
        for rung in self.rungs:
            total += rung.trials * (rung.resource - (previous if resumed else 0.0))
            previous = rung.resource
        return total


def sha_bracket(
    trials: int, min_resource: float, max_resource: float, eta: float, s: int = 0
) -> Bracket:
    """A synchronous successive-halving bracket of ``trials`` configurations (§2.1)."""
    levels = rung_levels(min_resource, max_resource, eta, s)
    promotions = len(levels) - 1
    if trials < eta**promotions:
        raise ValueError(
            f"max_trials must be at least eta**{promotions} = {math.ceil(eta**promotions)} "
            f"so that the top rung is not empty, got {trials}"
        )
    rungs = []
    for i, resource in enumerate(levels):
        # floor(n * eta^-i), in integers where possible so 81 / 3**4 stays exactly 1.
        alive = trials
        for _ in range(i):
            alive = int(alive // eta)
        rungs.append(Rung(alive, resource))
    return Bracket(s, tuple(rungs))


def hyperband_brackets(min_resource: float, max_resource: float, eta: float) -> list[Bracket]:
    """Hyperband's ``s_max + 1`` brackets (§2.2), most aggressive (``s = 0``) first."""
    s_max = floor_log(max_resource / min_resource, eta)
    return [
        sha_bracket(hyperband_trials(s, s_max, eta), min_resource, max_resource, eta, s)
        for s in range(s_max + 1)
    ]


def hyperband_trials(s: int, s_max: int, eta: float) -> int:
    """Trials Hyperband starts in the bracket with early-stopping rate ``s`` (§2.2),
    ``ceil((s_max + 1) * eta**(s_max - s) / (s_max - s + 1))``; asynchronous Hyperband
    draws its brackets with these weights, as Optuna's HyperbandPruner does."""
    promotions = s_max - s  # Hyperband's own index s_HB
    return math.ceil((s_max + 1) * eta**promotions / (promotions + 1) - 1e-9)
