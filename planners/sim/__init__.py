"""Simulation: whole tuning jobs in simulated time, on learning-curve benchmarks.

The modules, from the bottom up: ``benchmark`` (the :class:`Curve` and the
:class:`Benchmark` protocol), ``lcbench`` (LCBench as a benchmark: its surrogate and its
table), ``configs`` (where a run's configurations come from), ``engine`` (segments on
curves, and the event loops: one worker per segment, a Fluid packer, preemptions),
``simulator`` (:func:`simulate`: one job, one seed) and ``report`` (``elastune simulate``).

Example (random search on a toy benchmark: accuracy is ``x``, one second per epoch):
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "toy", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "random", "max_resource": 2, "max_trials": 8}})
    >>> class Toy:
    ...     name, max_resource, table = "toy", 2, None
    ...     def curve(self, config):
    ...         return Curve([config["x"]] * 2, [1.0, 2.0])
    >>> run = simulate(spec, Toy(), workers=2, seed=0)
    >>> run.trials_started, run.simulated_seconds, run.gpu_seconds
    (8, 8.0, 16.0)
"""

from elastune.planners.sim.benchmark import Benchmark, Curve
from elastune.planners.sim.engine import Packing, Preemption
from elastune.planners.sim.lcbench import LCBenchSurrogate, LCBenchTable
from elastune.planners.sim.simulator import SimulatedRun, simulate
from elastune.planners.sim.summary import format_report, load_benchmark, simulate_job

__all__ = [
    "Benchmark",
    "Curve",
    "LCBenchSurrogate",
    "LCBenchTable",
    "Packing",
    "Preemption",
    "SimulatedRun",
    "format_report",
    "load_benchmark",
    "simulate",
    "simulate_job",
]
