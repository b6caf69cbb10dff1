"""LCBench learning curves (YAHPO Gym surrogate) as benchmarks for the simulator.

Its data come from :mod:`elastune.planners.sim.lcbench_data`. Two benchmarks per OpenML task:

- ``lcbench:TASK_ID``: the ONNX surrogate, for *any* configuration the job's sampler proposes
  (parameters the job's space leaves out take the LCBench defaults);
- ``lcbench-table:TASK_ID``: the derived table of 1000 fixed configurations x 52 epochs;
  the simulator then draws configurations from the table, without replacement, instead of
  asking the sampler.

Both give the per-epoch value of the job's metric and the cumulative training time, made
monotone (the surrogate's prediction dips in 0.5% of steps), so an epoch costs the
difference of consecutive times. Data location: the ``root`` argument, else the
``ELASTUNE_BENCHMARKS`` environment variable, else the surrogate shipped in the package
(see :func:`elastune.planners.sim.lcbench_data.data_dir`).

Example:
    >>> table = LCBenchTable("3945")
    >>> len(table.table), table.max_resource
    (1000, 52)
    >>> curve = table.curve(table.table[0])
    >>> len(curve.metric), curve.seconds[-1] >= curve.seconds[0] > 0
    (52, True)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from elastune.planners.sim.benchmark import Curve
from elastune.planners.sim.lcbench_data import (
    EPOCHS,
    PARAMS,
    SURROGATE_METRICS,
    TABLE_METRICS,
    data_dir,
    session,
    task_table,
)
from elastune.planners.spec import JobSpec, SpecError

INTEGER_PARAMS = ("batch_size", "num_layers", "max_units")


@functools.cache
def _tasks(path: Path) -> tuple[str, ...]:
    space = json.loads((path / "config_space.json").read_text())
    task = next(p for p in space["hyperparameters"] if p["name"] == "OpenML_task_id")
    return tuple(task["choices"])


def tasks(root: str | Path | None = None) -> tuple[str, ...]:
    """The OpenML task ids LCBench covers (34)."""
    return _tasks(data_dir(root))


def _check_task(task: str, path: Path, family: str) -> str:
    if task not in _tasks(path):
        raise SpecError(
            f"--benchmark {family}:{task}: unknown LCBench task id {task!r} "
            f"(known: {', '.join(_tasks(path))})"
        )
    return task


def _check_metric(metric: str, known: tuple[str, ...] | dict[str, int], name: str) -> None:
    if metric not in known:
        raise SpecError(f"metric: {name} has no metric {metric!r} (known: {', '.join(known)})")


def _check_space(spec: JobSpec, name: str, required: bool) -> None:
    for param in spec.space:
        if param not in PARAMS:
            raise SpecError(
                f"space.{param}: not an LCBench hyperparameter (known: {', '.join(PARAMS)})"
            )
    missing = [p for p in PARAMS if p not in spec.space]
    if required and missing:
        raise SpecError(
            f"space: {name} draws whole rows of its table, so the space must name every "
            f"LCBench hyperparameter (missing: {', '.join(missing)})"
        )


def _check_resource(spec: JobSpec, name: str) -> None:
    top = spec.scheduler.max_resource
    if top > EPOCHS:
        raise SpecError(f"scheduler.max_resource: {top:g} exceeds the {EPOCHS} epochs of {name}")


class LCBenchTable:
    """The 1000-configuration table of one task (see the module docstring).

    Args:
        task: OpenML task id, e.g. ``"3945"``.
        metric: One of ``val_accuracy``, ``val_cross_entropy``, ``test_balanced_accuracy``.
        root: Where the data lies (see :func:`data_dir`).
    """

    max_resource = EPOCHS

    def __init__(self, task: str, metric: str = "val_accuracy", root: str | Path | None = None):
        path = data_dir(root)
        self.task = _check_task(task, path, "lcbench-table")
        self.name = f"lcbench-table:{task}"
        _check_metric(metric, TABLE_METRICS, self.name)
        data = task_table(path, task)
        self.values: np.ndarray = data[metric]  # [config, epoch]
        self.seconds: np.ndarray = np.maximum.accumulate(data["time_raw"], axis=1)
        self.table: list[dict[str, Any]] = [
            {
                n: int(v) if n in INTEGER_PARAMS else float(v)
                for n, v in zip(PARAMS, row, strict=True)
            }
            for row in data["configs"]
        ]
        self._rows = {self._key(config): i for i, config in enumerate(self.table)}
        self._curves: dict[int, Curve] = {}

    @staticmethod
    def _key(config: Mapping[str, Any]) -> tuple[float, ...]:
        return tuple(float(config[name]) for name in PARAMS)

    def row(self, config: Mapping[str, Any]) -> int:
        try:
            return self._rows[self._key(config)]
        except KeyError:
            raise ValueError(
                f"{self.name} has no row for {dict(config)}; a scheduler that changes "
                "configurations (PBT) needs the surrogate, lcbench:TASK_ID"
            ) from None

    def curve(self, config: Mapping[str, Any]) -> Curve:
        row = self.row(config)
        if row not in self._curves:
            self._curves[row] = Curve(self.values[row].tolist(), self.seconds[row].tolist())
        return self._curves[row]

    def check(self, spec: JobSpec) -> None:
        """Reject a job this benchmark cannot simulate, naming the field."""
        _check_metric(spec.metric, TABLE_METRICS, self.name)
        _check_space(spec, self.name, required=True)
        _check_resource(spec, self.name)


class LCBenchSurrogate:
    """The YAHPO Gym ONNX surrogate of one task, for any configuration.

    Args:
        task: OpenML task id, e.g. ``"3945"``.
        metric: A surrogate output: ``val_accuracy``, ``val_cross_entropy``,
            ``val_balanced_accuracy``, ``test_cross_entropy`` or ``test_balanced_accuracy``.
        root: Where the data lies (see :func:`data_dir`).
    """

    max_resource = EPOCHS
    table = None

    def __init__(self, task: str, metric: str = "val_accuracy", root: str | Path | None = None):
        path = data_dir(root)
        self.task = _check_task(task, path, "lcbench")
        self.name = f"lcbench:{task}"
        _check_metric(metric, SURROGATE_METRICS, self.name)
        self._column = SURROGATE_METRICS[metric]
        code = json.loads((path / "encoding.json").read_text())["OpenML_task_id"][task]
        self._session = session(path)
        self._x_cat = np.full((EPOCHS, 1), code, np.int32)
        self._x_cont = np.zeros((EPOCHS, 1 + len(PARAMS)), np.float32)
        self._x_cont[:, 0] = np.arange(1, EPOCHS + 1)

    def curve(self, config: Mapping[str, Any]) -> Curve:
        self._x_cont[:, 1:] = [config.get(name, default) for name, default in PARAMS.items()]
        out = self._session.run(None, {"x_cat": self._x_cat, "x_cont": self._x_cont})[0]
        seconds = np.maximum.accumulate(np.maximum(out[:, 0], 0.0))
        return Curve(out[:, self._column].tolist(), seconds.tolist())

    def check(self, spec: JobSpec) -> None:
        """Reject a job this benchmark cannot simulate, naming the field."""
        _check_metric(spec.metric, SURROGATE_METRICS, self.name)
        _check_space(spec, self.name, required=False)
        _check_resource(spec, self.name)
