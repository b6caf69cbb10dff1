"""planners/sim/lcbench_data.py: the shipped surrogate, the table made from it, its cache and the
lookup order. The session's cache is a temporary folder (tests/conftest.py), so task 3945 is
made once per session and the other tests read it."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from elastune import planners
from elastune.planners.sim import lcbench_data
from elastune.planners.sim.lcbench_data import FOLDER, TABLE, data_dir, task_table
from elastune.planners.spec import SpecError, cache
from elastune.planners.spec.cache import cache_dir

# Task 3945 of the 1000-configuration table as first made (onnxruntime 1.31, x86):
# (config, epoch) -> value, and each array's mean over the whole task.
KNOWN = {
    "time_raw": ([13.099798, 143.71985, 278.12732, 266.39285], 139.05330627),
    "val_accuracy": ([44.71104, 93.900375, 94.509857, 81.73719], 84.49482803),
    "val_cross_entropy": ([0.63261324, 0.53483194, 0.25968766, 0.46541828], 0.73121906),
    "test_balanced_accuracy": ([0.50084352, 0.57348657, 0.66412771, 0.70525795], 0.61669456),
}
CELLS = [(0, 0), (0, 51), (500, 25), (999, 51)]
FIRST_CONFIG = [249.0, 0.0039887661, 0.70643318, 0.036318943, 4.0, 137.0, 0.2042194]
LAST_CONFIG = [200.0, 0.0065783649, 0.84396034, 0.07317546, 2.0, 525.0, 0.32417372]
# float32 inference on another CPU may round differently; a wrong seed, order or column
# is off by far more.
REL = 1e-4


def test_the_surrogate_ships_inside_the_package():
    shipped = data_dir()
    assert shipped == (Path(planners.__file__).parent / "data" / FOLDER).resolve()
    names = {path.name for path in shipped.iterdir()}
    assert {"model.onnx", "encoding.json", "config_space.json", "README.md"} <= names
    assert not (shipped / TABLE).exists()


def test_the_made_table_has_the_known_values():
    table = task_table(data_dir(), "3945")
    assert table["configs"].shape == (1000, 7)
    assert table["configs"][0].tolist() == pytest.approx(FIRST_CONFIG, rel=1e-6)
    assert table["configs"][-1].tolist() == pytest.approx(LAST_CONFIG, rel=1e-6)
    for key, (values, mean) in KNOWN.items():
        assert table[key].shape == (1000, 52)
        assert [float(table[key][c, e]) for c, e in CELLS] == pytest.approx(values, rel=REL)
        assert float(table[key].astype(np.float64).mean()) == pytest.approx(mean, rel=REL)


def test_a_made_table_is_read_back_from_the_cache(monkeypatch):
    first = task_table(data_dir(), "3945")
    made = list((cache_dir() / FOLDER).glob("*/3945.npz"))
    assert len(made) == 1
    monkeypatch.setattr(lcbench_data, "_make_table", pytest.fail)
    again = task_table(data_dir(), "3945")
    assert all(np.array_equal(first[key], again[key]) for key in first)


def fake_table(path: Path, task: str) -> dict[str, np.ndarray]:
    return {"configs": np.zeros((2, 7), np.float32), "val_accuracy": np.full((2, 52), 50.0)}


def test_a_killed_write_leaves_nothing_and_the_next_call_makes_the_table(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(lcbench_data, "_make_table", fake_table)
    real_savez = np.savez

    def killed(file, **arrays):
        file.write(b"PK\x03\x04 half a table")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        task_table(data_dir(), "3945")
    folder = next((tmp_path / FOLDER).iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["3945.npz.lock"]
    monkeypatch.setattr(np, "savez", real_savez)
    assert task_table(data_dir(), "3945")["val_accuracy"][1, 51] == 50.0
    assert sorted(p.name for p in folder.iterdir()) == ["3945.npz", "3945.npz.lock"]


def test_two_callers_at_once_make_the_table_once(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTUNE_CACHE", str(tmp_path))
    made = []
    second_at_lock = threading.Event()
    locks = []

    class CountedLock(FileLock):
        """The cache's lock, telling when the second caller reaches it."""

        def __enter__(self) -> FileLock:
            locks.append(self)
            if len(locks) == 2:
                second_at_lock.set()
            return super().__enter__()

    def slow(path: Path, task: str) -> dict[str, np.ndarray]:
        made.append(task)
        assert second_at_lock.wait(60)  # the other caller waits on the lock meanwhile
        return fake_table(path, task)

    monkeypatch.setattr(cache, "FileLock", CountedLock)
    monkeypatch.setattr(lcbench_data, "_make_table", slow)
    callers = [threading.Thread(target=task_table, args=(data_dir(), "3945")) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert made == ["3945"]


def test_a_folder_with_the_whole_table_is_read_instead(monkeypatch, tmp_path):
    folder = tmp_path / FOLDER
    folder.mkdir()
    for name in ("model.onnx", "encoding.json", "config_space.json"):
        (folder / name).symlink_to(data_dir() / name)
    curves = np.arange(2 * 3 * 52, dtype=np.float32).reshape(2, 3, 52)
    np.savez(
        folder / TABLE,
        task_ids=np.array(["7593", "3945"]),
        configs=np.ones((3, 7), np.float32),
        **dict.fromkeys(("time_raw", *lcbench_data.TABLE_METRICS), curves),
    )
    monkeypatch.setattr(lcbench_data, "_make_table", pytest.fail)
    table = task_table(data_dir(tmp_path), "3945")
    assert np.array_equal(table["val_accuracy"], curves[1])
    assert table["configs"].shape == (3, 7)


def test_the_lookup_order_is_argument_then_environment_then_shipped(monkeypatch, tmp_path):
    shipped = data_dir()
    other = tmp_path / "elsewhere" / FOLDER
    other.mkdir(parents=True)
    (other / "encoding.json").write_text("{}")
    monkeypatch.setenv("ELASTUNE_BENCHMARKS", str(other.parent))
    assert data_dir() == other.resolve()
    assert data_dir(shipped) == shipped
    monkeypatch.setenv("ELASTUNE_BENCHMARKS", str(tmp_path))
    with pytest.raises(SpecError, match="ELASTUNE_BENCHMARKS"):
        data_dir()
    monkeypatch.delenv("ELASTUNE_BENCHMARKS")
    assert data_dir() == shipped
