import math

import pytest

from elastune.planners.spec.geometry import floor_log, hyperband_brackets, rung_levels, sha_bracket

# docs/algorithms.md §2.3: R = 81, r = 1, eta = 3.
TABLE = {
    0: [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    1: [(34, 3), (11, 9), (3, 27), (1, 81)],
    2: [(15, 9), (5, 27), (1, 81)],
    3: [(8, 27), (2, 81)],
    4: [(5, 81)],
}


def test_hyperband_r81_eta3_matches_the_worked_example() -> None:
    brackets = hyperband_brackets(1, 81, 3)
    assert {b.s: [(r.trials, r.resource) for r in b.rungs] for b in brackets} == TABLE
    assert sum(b.trials for b in brackets) == 143
    assert [b.work(resumed=False) for b in brackets] == [405, 363, 351, 378, 405]
    assert [b.work(resumed=True) for b in brackets] == [297, 276, 279, 324, 405]
    assert sum(b.work(resumed=False) for b in brackets) == 1902
    assert sum(b.work(resumed=True) for b in brackets) == 1581


@pytest.mark.parametrize(
    ("x", "base", "expected"),
    [(243, 3, 5), (81, 3, 4), (80.9, 3, 3), (1, 2, 0), (1000, 10, 3), (0.3 / 0.1, 3, 1)],
)
def test_floor_log_is_integer_safe(x: float, base: float, expected: int) -> None:
    assert int(math.log(243) / math.log(3)) == 4  # the trap floor_log avoids
    assert floor_log(x, base) == expected


def test_rungs_end_at_max_resource_and_are_integers_for_epochs() -> None:
    assert rung_levels(1, 27, 4) == [2, 7, 27]
    assert rung_levels(1, 9, 3, s=1) == [3, 9]
    assert rung_levels(0.5, 4.5, 3) == [0.5, 1.5, 4.5]


def test_sha_bracket_needs_enough_trials_for_the_top_rung() -> None:
    assert [(r.trials, r.resource) for r in sha_bracket(10, 1, 9, 3).rungs] == [
        (10, 1),
        (3, 3),
        (1, 9),
    ]
    with pytest.raises(ValueError, match="max_trials must be at least eta\\*\\*2 = 9"):
        sha_bracket(8, 1, 9, 3)
