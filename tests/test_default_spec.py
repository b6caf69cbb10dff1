"""A job file that names no scheduler and no sampler gets bloom + mf-tpe, in real runs and
in simulation; the other schedulers and samplers are untouched."""

from __future__ import annotations

import pytest

from elastune.planners.samplers import MultiFidelityTpeSampler
from elastune.planners.search import make_scheduler
from elastune.planners.search.schedulers import Bloom
from elastune.planners.sim import simulate
from elastune.planners.sim.configs import RowDraw, TableSampler, study_for, table_sampler
from elastune.planners.spec import SpecError, make_sampler, parse_job

BASE = {
    "name": "d",
    "trainable": "m:f",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
}


def test_the_default_is_bloom_with_mf_tpe() -> None:
    spec = parse_job(BASE)
    assert (spec.scheduler.name, spec.sampler.name) == ("bloom", "mf-tpe")
    assert (spec.scheduler.promotions, spec.scheduler.max_trials) == (2, 81)
    scheduler = make_scheduler(spec, seed=0)
    assert isinstance(scheduler, Bloom) and scheduler.brackets[0].levels == [3, 9, 27]
    assert isinstance(make_sampler(spec), MultiFidelityTpeSampler)


def test_a_scheduler_section_without_a_name_sets_the_defaults_options() -> None:
    spec = parse_job({**BASE, "scheduler": {"max_resource": 52, "max_trials": None}})
    assert spec.scheduler.name == "bloom" and spec.scheduler.max_resource == 52
    named = parse_job({**BASE, "scheduler": {"name": "asha", "max_resource": 52}})
    assert named.scheduler.name == "asha"


@pytest.mark.parametrize(
    ("scheduler", "sampler", "message"),
    [
        ({"brackets": 4}, {}, "scheduler.brackets: 4 brackets but a trial can be cut at most 2"),
        ({"promotions": -1}, {}, "scheduler.promotions: Input should be greater than or equal"),
        ({"slope_weight": "fast"}, {}, "scheduler.slope_weight"),
        ({}, {"name": "mf-tpe", "gama": 0.2}, "sampler.gama: not an option of"),
    ],
)
def test_bad_options_name_their_field(scheduler, sampler, message) -> None:
    with pytest.raises(SpecError, match=message):
        parse_job({**BASE, "scheduler": scheduler, "sampler": sampler})


def test_mf_tpe_options_reach_the_sampler() -> None:
    spec = parse_job({**BASE, "sampler": {"name": "mf-tpe", "gamma": 0.25, "seed": 3}})
    sampler = make_sampler(spec)
    assert sampler.gamma == 0.25 and sampler.seed == 3


TABLE = tuple({"x": i / 20} for i in range(20))


def test_on_a_table_mf_tpe_chooses_rows_and_named_samplers_keep_the_permutation() -> None:
    default = parse_job(BASE)
    chosen = table_sampler(default, TABLE, RowDraw(20, 0), seed=0)
    assert isinstance(chosen, MultiFidelityTpeSampler) and chosen.candidates == list(TABLE)
    named = parse_job({**BASE, "sampler": {"name": "random"}})
    assert isinstance(table_sampler(named, TABLE, RowDraw(20, 0), seed=0), TableSampler)
    # With replacement there is nothing to choose among: rows are drawn as before.
    assert isinstance(table_sampler(default, TABLE, RowDraw(20, 0, True), seed=0), TableSampler)
    assert isinstance(
        study_for(default, Toy(), 0, True, False, None).sampler, MultiFidelityTpeSampler
    )


class Toy:
    """Twenty rows; accuracy grows with x and with epochs, 1 s per epoch."""

    name, max_resource, table = "toy-table", 9, TABLE

    def curve(self, config):
        from elastune.planners.sim import Curve

        return Curve([config["x"] * e / 9 for e in range(1, 10)], [float(e) for e in range(1, 10)])


def test_the_default_runs_in_simulation_on_a_table_without_repeating_a_row() -> None:
    spec = parse_job({**BASE, "scheduler": {"max_resource": 9, "max_trials": None}})
    run = simulate(spec, Toy(), workers=3, seed=1)
    assert run.trials_started == 20  # capped at the table, every row once
    assert run.best_trial["config"] == {"x": 0.95} and run.best_trial["resource"] == 9
    assert simulate(spec, Toy(), workers=3, seed=1).to_dict() == run.to_dict()
