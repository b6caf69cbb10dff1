"""The simulated-time backend: event order, accounting, deadlines, table draws, the fast
path, determinism, LCBench loading and the CLI entry point's bad input."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastune.planners.search import Action, Decision, Result, Scheduler, Segment
from elastune.planners.search.schedulers import Fifo
from elastune.planners.sim import Curve, LCBenchSurrogate, LCBenchTable, simulate, simulate_job
from elastune.planners.sim.configs import RowDraw, TableSampler
from elastune.planners.spec import SpecError, parse_job

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


def job(scheduler: dict, **extra) -> object:
    return parse_job(
        {"name": "t", "trainable": "m:f", "metric": "acc", "space": SPACE,
         "sampler": {"name": "random", "seed": 0}, "scheduler": scheduler, **extra}
    )  # fmt: skip


class Toy:
    """Accuracy x * e / E after epoch e; an epoch costs 1 + x seconds."""

    name, max_resource, table = "toy", 9, None

    def curve(self, config):
        x = config["x"]
        return Curve([x * e / 9 for e in range(1, 10)], [(1 + x) * e for e in range(1, 10)])


class ToyTable(Toy):
    name = "toy-table"
    table = tuple({"x": i / 50} for i in range(50))


def test_one_worker_runs_segments_back_to_back():
    table = ToyTable()
    xs = [table.table[row]["x"] for row in RowDraw(50, 0)._rows[:3]]
    spec = job({"name": "random", "max_resource": 9, "max_trials": 3})
    run = simulate(spec, table, workers=1, seed=0)
    # Three trials of 9 epochs at (1 + x) s each, one after another.
    assert run.simulated_seconds == pytest.approx(sum(9 * (1 + x) for x in xs))
    assert run.gpu_seconds == pytest.approx(run.simulated_seconds)
    assert run.segments_run == run.results == run.trials_started == 3
    # Every epoch is an observation: the first point is trial 0's first epoch.
    assert run.anytime[0] == pytest.approx((1 + xs[0], xs[0] / 9))
    times = [t for t, _ in run.anytime]
    values = [v for _, v in run.anytime]
    assert times == sorted(times) and values == sorted(values)
    assert run.final_best == pytest.approx(max(xs)) == run.best_trial["metric"]
    assert run.time_to(max(xs)) == pytest.approx(run.anytime[-1][0])
    assert run.time_to(2.0) is None
    # Fully trained results arrive at each trial's end: 9 (1 + x0), then later ones.
    assert run.trained[0] == pytest.approx((9 * (1 + xs[0]), xs[0]))
    best = xs.index(max(xs))
    assert run.time_to(max(xs), trained=True) == pytest.approx(
        sum(9 * (1 + x) for x in xs[: best + 1])
    )


def test_workers_run_in_parallel_and_a_deadline_cuts_them():
    table = ToyTable()
    spec = job({"name": "random", "max_resource": 9, "max_trials": 8})
    run = simulate(spec, table, workers=8, seed=0)
    longest = max((1 + table.table[i]["x"]) * 9 for i in RowDraw(50, 0)._rows[:8])
    assert run.simulated_seconds == pytest.approx(longest)
    cut = simulate(spec, table, workers=8, seed=0, deadline=5.0)
    assert cut.simulated_seconds == 5.0
    assert cut.results == 0 and cut.segments_run == 8
    assert cut.gpu_seconds == pytest.approx(8 * 5.0)
    # Epochs trained before the deadline count although no segment finished.
    assert cut.anytime and all(t <= 5.0 for t, _ in cut.anytime)
    assert cut.best_at(5.0) == cut.final_best == run.best_at(5.0)


def test_table_rows_are_drawn_without_replacement_and_max_trials_capped():
    spec = job({"name": "asha", "min_resource": 1, "max_resource": 9, "max_trials": None})
    run = simulate(spec, ToyTable(), workers=4, seed=3)
    assert run.trials_started == 50  # every row once, then the job ran dry
    assert RowDraw(50, 3)._rows == RowDraw(50, 3)._rows != RowDraw(50, 4)._rows
    assert sorted(RowDraw(50, 3)._rows) == list(range(50))
    with pytest.raises(ValueError, match="only 50 configurations"):
        RowDraw(50, 0)(50)
    assert RowDraw(50, 0, replace=True)(1000) in range(50)


def test_fast_path_equals_the_optuna_path_when_a_table_draws_the_configs():
    spec = job({"name": "asha", "min_resource": 1, "max_resource": 9, "brackets": 2})
    slow = simulate(spec, ToyTable(), workers=5, seed=1, deadline=60)
    fast = simulate(spec, ToyTable(), workers=5, seed=1, deadline=60, fast=True)
    assert fast.to_dict() == slow.to_dict()


def test_a_sampler_can_replace_the_jobs_own():
    spec = job({"name": "random", "max_resource": 9, "max_trials": 6})
    fixed = TableSampler(({"x": 0.25},), RowDraw(1, 0, replace=True))
    run = simulate(spec, Toy(), workers=2, seed=0, sampler=fixed)
    assert run.final_best == pytest.approx(0.25) and run.best_trial["config"] == {"x": 0.25}
    assert simulate(spec, Toy(), workers=2, seed=0).final_best != pytest.approx(0.25)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 12), st.sampled_from(["asha", "median", "random"]))
def test_equal_seeds_give_equal_runs(seed, workers, name):
    scheduler = {"name": name, "max_resource": 9, "max_trials": 20}
    if name == "asha":
        scheduler["brackets"] = 3
    spec = job(scheduler)
    first = simulate(spec, Toy(), workers, seed).to_dict()
    assert simulate(spec, Toy(), workers, seed).to_dict() == first
    json.dumps(first)  # JSON-ready


def test_sha_and_pbt_run_in_simulation():
    sha = simulate(job({"name": "sha", "max_resource": 9}), Toy(), workers=3, seed=0)
    assert sha.trials_started == 9 and sha.best_trial["resource"] == 9
    pbt_spec = job({"name": "pbt", "max_resource": 9, "perturbation_interval": 3,
                    "population_size": 4})  # fmt: skip
    pbt = simulate(pbt_spec, Toy(), workers=2, seed=0)
    assert pbt.trials_started == 4 and pbt.segments_run == 12
    with pytest.raises(SpecError, match="pbt"):
        simulate(pbt_spec, ToyTable(), workers=2, seed=0)


class Failing(Scheduler):
    """Two trials; trial 0's single segment is reported as NaN (a failed trial)."""

    def __init__(self):
        self.jobs = [Segment(0, 0, 3, 0), Segment(1, 0, 3, 0)]

    def next_segment(self):
        return self.jobs.pop(0) if self.jobs else None

    def on_result(self, result: Result) -> list[Decision]:
        return [Decision(result.trial, Action.FAIL if result.failed else Action.COMPLETE, 0)]


class NanToy(Toy):
    """Two configurations; the one with x < 0.5 reports NaN at every epoch."""

    table = ({"x": 0.2}, {"x": 0.8})

    def curve(self, config):
        curve = super().curve(config)
        return Curve([math.nan] * 9, curve.seconds) if config["x"] < 0.5 else curve


def test_a_nan_curve_fails_its_trial_and_the_job_goes_on():
    spec = job({"name": "random", "max_resource": 3, "max_trials": 2})
    run = simulate(spec, NanToy(), workers=1, seed=2, scheduler=Failing())
    assert run.results == 2
    assert run.best_trial["config"] == {"x": 0.8}
    assert all(not math.isnan(v) for _, v in run.anytime)


def test_segments_must_end_on_whole_epochs():
    spec = job({"name": "random", "max_resource": 9, "max_trials": 1})
    with pytest.raises(ValueError, match="whole epoch"):
        simulate(spec, Toy(), workers=1, scheduler=Fifo(4.5, 1))
    with pytest.raises(ValueError, match="workers must be >= 1"):
        simulate(spec, Toy(), workers=0)


# --- LCBench and the CLI entry point ------------------------------------------------------

LCBENCH_SPACE = {
    "batch_size": {"type": "int", "low": 16, "high": 512, "log": True},
    "learning_rate": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
    "momentum": {"type": "float", "low": 0.1, "high": 0.99},
    "weight_decay": {"type": "float", "low": 1e-5, "high": 0.1},
    "num_layers": {"type": "int", "low": 1, "high": 5},
    "max_units": {"type": "int", "low": 64, "high": 1024, "log": True},
    "max_dropout": {"type": "float", "low": 0.0, "high": 1.0},
}


def lcbench_job(**changes) -> object:
    data = {"name": "lc", "trainable": "m:f", "metric": "val_accuracy", "space": LCBENCH_SPACE,
            "sampler": {"name": "random", "seed": 0},
            "scheduler": {"name": "asha", "min_resource": 1, "max_resource": 52,
                          "max_trials": 40}}  # fmt: skip
    data.update(changes)
    return parse_job(data)


def test_table_and_surrogate_agree_and_costs_are_monotone():
    table, surrogate = LCBenchTable("3945"), LCBenchSurrogate("3945")
    for config in table.table[:3]:
        a, b = table.curve(config), surrogate.curve(config)
        assert a.metric == pytest.approx(b.metric, rel=1e-5)
        assert a.seconds == pytest.approx(b.seconds, rel=1e-5)
        assert all(y >= x for x, y in zip(a.seconds, a.seconds[1:], strict=False))
    with pytest.raises(ValueError, match="no row"):
        table.curve({**table.table[0], "momentum": 0.123456})


def test_simulate_job_returns_json_per_seed():
    report = simulate_job(lcbench_job(), "lcbench-table:3945", workers=8, seeds=2)
    assert [run["seed"] for run in report["seeds"]] == [0, 1]
    for run in report["seeds"]:
        assert run["trials_started"] == 40 and run["segments_run"] > 40
        assert 0 < run["gpu_seconds"] <= 8 * run["simulated_seconds"]
        assert run["final_best"] == max(v for _, v in run["anytime"])
    json.dumps(report)
    surrogate = simulate_job(lcbench_job(), "lcbench:3945", workers=8, deadline=100.0)
    assert surrogate["seeds"][0]["simulated_seconds"] <= 100.0


@pytest.mark.parametrize(
    ("name", "changes", "kwargs", "message"),
    [
        ("lcbench:3945", {}, {"workers": 0}, "--workers must be >= 1"),
        ("lcbench:3945", {}, {"seeds": 0}, "--seeds must be >= 1"),
        ("nasbench:1", {}, {}, "--benchmark nasbench:1: unknown benchmark"),
        ("lcbench", {}, {}, "unknown benchmark"),
        ("lcbench:999", {}, {}, "unknown LCBench task id '999'"),
        ("lcbench-table:42", {}, {}, "unknown LCBench task id '42'"),
        ("lcbench:3945", {"metric": "auc"}, {}, "metric: lcbench:3945 has no metric 'auc'"),
        ("lcbench:3945", {"space": {"depth": {"type": "int", "low": 1, "high": 3}}}, {},
         "space.depth: not an LCBench hyperparameter"),
        ("lcbench-table:3945", {"space": {"momentum": LCBENCH_SPACE["momentum"]}}, {},
         "missing: batch_size"),
        ("lcbench:3945", {"scheduler": {"name": "random", "max_resource": 60}}, {},
         "scheduler.max_resource: 60 exceeds the 52 epochs"),
        ("lcbench:3945", {"scheduler": {"name": "asha", "max_resource": 52, "max_trials": None}},
         {}, "scheduler.max_trials"),
    ],
)  # fmt: skip
def test_simulate_job_bad_input_names_the_field(name, changes, kwargs, message):
    with pytest.raises(SpecError, match=message):
        simulate_job(lcbench_job(**changes), name, **{"workers": 4, **kwargs})


def test_preemptions_cost_time_and_gpu_seconds_but_change_no_decision() -> None:
    from elastune.planners.sim import Preemption, simulate

    spec = parse_job(
        {
            "name": "pre",
            "trainable": "m:f",
            "metric": "val_accuracy",
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "sampler": {"name": "random", "seed": 0},
            "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
        }
    )

    class Slow:  # 600 s per epoch: long enough to be interrupted at 3 an hour
        name, max_resource, table = "slow", 9, None

        def curve(self, config):
            return Curve(
                [config["x"] * e / 9 for e in range(1, 10)], [600.0 * e for e in range(1, 10)]
            )

    calm = simulate(spec, Slow(), workers=3, seed=1)
    none = simulate(spec, Slow(), workers=3, seed=1, preemption=Preemption(0.0))
    assert none.to_dict() == calm.to_dict()  # rate 0 changes nothing
    rough = simulate(spec, Slow(), workers=3, seed=1, preemption=Preemption(3.0, 120.0))
    assert rough.preemptions > 0
    assert rough.simulated_seconds > calm.simulated_seconds
    assert rough.gpu_seconds > calm.gpu_seconds  # the lost part-epochs are paid for
    assert rough.best_trial == calm.best_trial  # resumed from checkpoints: same results
    again = simulate(spec, Slow(), workers=3, seed=1, preemption=Preemption(3.0, 120.0))
    assert again.to_dict() == rough.to_dict()  # seeded


def test_a_segment_loses_only_the_epoch_in_progress() -> None:
    import numpy as np

    from elastune.planners.sim import Preemption

    class Once:  # interrupted once, 250 s in, then never again
        def __init__(self):
            self.draws = iter([250.0, 1e12])

        def exponential(self, scale):
            return next(self.draws)

    wall, busy, count = Preemption(1.0, 100.0).run(1000.0, 10, Once())  # 100 s epochs
    # 250 s in, 2 epochs were checkpointed: 800 s of work remain after a 100 s restart.
    assert count == 1 and busy == 250.0 + 800.0 and wall == 250.0 + 100.0 + 800.0
    assert Preemption(0.0).run(1000.0, 10, np.random.default_rng(0)) == (1000.0, 1000.0, 0)
