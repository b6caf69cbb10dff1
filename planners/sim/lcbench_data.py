"""LCBench data: where the YAHPO Gym surrogate lies, and its 1000-configuration table.

The surrogate ships inside the package (``planners/data/yahpo_lcbench``, Apache-2.0: see its
README). The table of 1000 fixed configurations x 52 epochs per task is too large to ship
(24 MB for the 34 tasks), so :func:`task_table` makes a task's part from the surrogate the
first time it is asked for (seed 20240601; about half a second a task) and keeps it in the
cache, ``$ELASTUNE_CACHE`` or else ``~/.cache/elastune``. A folder that already holds the
whole table (``lcbench_surrogate_table_1000cfg.npz``, as ``$ELASTUNE_BENCHMARKS`` may name)
is read instead.

Example:
    >>> table = task_table(data_dir(), "3945")  # made once, then read from the cache
    >>> table["configs"].shape, table["val_accuracy"].shape, float(table["configs"][0, 0])
    ((1000, 7), (1000, 52), 249.0)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import track

from elastune.planners.spec import SpecError
from elastune.planners.spec.cache import cache_dir, made_once

ENV = "ELASTUNE_BENCHMARKS"
FOLDER = "yahpo_lcbench"
TABLE = "lcbench_surrogate_table_1000cfg.npz"
EPOCHS = 52
# The surrogate's inputs after the epoch, in ``x_cont`` order, with the defaults of
# config_space.json for parameters a job does not tune.
PARAMS: dict[str, float] = {
    "batch_size": 91,
    "learning_rate": 0.0031622777,
    "momentum": 0.545,
    "weight_decay": 0.050005,
    "num_layers": 3,
    "max_units": 256,
    "max_dropout": 0.5,
}
# Output columns of the surrogate (column 0 is the cumulative time).
SURROGATE_METRICS = {
    "val_accuracy": 1,
    "val_cross_entropy": 2,
    "val_balanced_accuracy": 3,
    "test_cross_entropy": 4,
    "test_balanced_accuracy": 5,
}
TABLE_METRICS = ("val_accuracy", "val_cross_entropy", "test_balanced_accuracy")
SEED = 20240601
CONFIGS = 1000
# Configurations per surrogate call while making a table: one progress step each, and
# single-threaded batches this small are faster than one large call.
CHUNK = 50


def data_dir(root: str | Path | None = None) -> Path:
    """The ``yahpo_lcbench`` folder: ``root``, else ``$ELASTUNE_BENCHMARKS``, else the shipped one.

    ``root`` and the variable may name the folder itself or the folder that holds it.
    """
    if root is None:
        root = os.environ.get(ENV)
        if not root:
            return Path(str(resources.files("elastune.planners") / "data" / FOLDER)).resolve()
    path = Path(root)
    if not (path / "encoding.json").exists() and (path / FOLDER).is_dir():
        path = path / FOLDER
    if not (path / "encoding.json").exists():
        raise SpecError(
            f"{path}: no LCBench data here (expected {FOLDER}/ with encoding.json); "
            f"pass the folder or set {ENV}"
        )
    return path.resolve()


@functools.cache
def session(path: Path) -> Any:
    """The surrogate of the folder ``path``, on one CPU thread."""
    import onnxruntime  # local: only the surrogate needs it

    options = onnxruntime.SessionOptions()
    # Small batches: threads cost more than they save. With one, a made table's values do not
    # depend on the batch size either (several threads split the sums differently).
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(path / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


def task_table(path: Path, task: str) -> dict[str, np.ndarray]:
    """One task of the table: ``configs`` float32 [1000, 7] in :data:`PARAMS` order, and float32
    [1000, 52] arrays ``time_raw`` (cumulative seconds as predicted) and :data:`TABLE_METRICS`.
    """
    if (path / TABLE).exists():
        data = _whole_table(path)
        index = list(data["task_ids"]).index(task)
        return {"configs": data["configs"]} | {
            key: data[key][index] for key in ("time_raw", *TABLE_METRICS)
        }
    return _cached_table(path, task)


@functools.cache
def _whole_table(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / TABLE) as data:
        return {key: data[key] for key in data.files}


def _cached_table(path: Path, task: str) -> dict[str, np.ndarray]:
    def make(tmp: Path) -> None:
        with tmp.open("wb") as file:  # a file, so that numpy adds no suffix to the name
            np.savez(file, **_make_table(path, task))

    target = made_once(cache_dir() / FOLDER / _version(path) / f"{task}.npz", make)
    with np.load(target) as data:
        return {key: data[key] for key in data.files}


@functools.cache
def _version(path: Path) -> str:
    """A name for what a made table depends on, so a changed model is never read stale."""
    digest = hashlib.sha256()
    for name in ("model.onnx", "encoding.json", "config_space.json"):
        digest.update((path / name).read_bytes())
    return f"{digest.hexdigest()[:16]}-seed{SEED}-{CONFIGS}"


def configurations(path: Path) -> np.ndarray:
    """The table's configurations, float32 [1000, 7]: each parameter of :data:`PARAMS` in turn,
    1000 draws uniform (log-uniform where config_space.json says log) over its bounds, integers
    rounded (``num_layers``: uniform over 1..5), from one generator seeded :data:`SEED`.
    """
    space = json.loads((path / "config_space.json").read_text())
    bounds = {p["name"]: p for p in space["hyperparameters"]}
    rng = np.random.default_rng(SEED)
    columns = []
    for name in PARAMS:
        param = bounds[name]
        low, high = param["lower"], param["upper"]
        if param["log"]:
            column = np.exp(rng.uniform(np.log(low), np.log(high), CONFIGS))
        elif param["type"] == "uniform_int":
            column = rng.integers(low, high + 1, CONFIGS)
        else:
            column = rng.uniform(low, high, CONFIGS)
        columns.append(np.round(column) if param["type"] == "uniform_int" else column)
    return np.stack(columns, axis=1).astype(np.float32)


def _make_table(path: Path, task: str) -> dict[str, np.ndarray]:
    configs = configurations(path)
    code = json.loads((path / "encoding.json").read_text())["OpenML_task_id"][task]
    epochs = np.tile(np.arange(1, EPOCHS + 1, dtype=np.float32), CHUNK)[:, None]
    x_cat = np.full((CHUNK * EPOCHS, 1), code, np.int32)
    outputs = []
    console = Console(stderr=True)
    for start in track(
        range(0, CONFIGS, CHUNK),
        description=f"LCBench {task}: making its table (once, then cached)",
        console=console,
        transient=True,
        disable=not console.is_terminal,  # a log would get blank lines, not a bar
    ):
        x_cont = np.hstack([epochs, np.repeat(configs[start : start + CHUNK], EPOCHS, axis=0)])
        outputs.append(session(path).run(None, {"x_cat": x_cat, "x_cont": x_cont})[0])
    out = np.concatenate(outputs).reshape(CONFIGS, EPOCHS, -1)
    columns = {"time_raw": 0} | {metric: SURROGATE_METRICS[metric] for metric in TABLE_METRICS}
    return {"configs": configs} | {key: out[:, :, column] for key, column in columns.items()}
