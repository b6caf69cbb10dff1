"""What a job spends outside its training units, measured by running it: ``elastune
profile``'s second half (the first, :func:`tasks.profile.measure`, times the units).

Two small jobs run through the real machinery (Prefect, MLflow, Optuna, the job's pool):
the job cut down to one SHA rung at its first resource level ``r``, ``n x compute.workers``
trials of the random sampler, not planned, its stores in a throwaway folder. With ``W(n)``
the wall seconds of the job of ``n`` waves (:data:`WAVES`), one wave of segments takes
``S = (W(b) - W(a)) / (b - a)``, the job's own overhead is ``W(a) - a * S`` (its runs and
study created, its best model registered: the profile's ``job_overhead_s``) and a
segment's is ``S - r * t`` with ``t`` the measured seconds per unit (``overhead_s``:
dispatch, MLflow, building the model, checkpoint I/O, warm-up).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from flows.tune import tune_spec
from planners.spec import JobSpec

WAVES = (1, 4)  # waves of compute.workers segments in the two calibration jobs


def calibration_job(spec: JobSpec, waves: int, folder: Path) -> JobSpec:
    """``spec`` cut down to ``waves`` waves of one-rung segments, stored under ``folder``."""
    resource = getattr(spec.scheduler, "min_resource", 1.0)
    data = spec.model_dump()
    data.update(
        name=f"{spec.name}-calibration",
        sampler={"name": "random", "seed": 0},
        scheduler={
            "name": "sha",
            "min_resource": resource,
            "max_resource": resource,
            "max_trials": waves * spec.compute.workers,
        },
        budget={},
        profile=None,
        tracking={
            "mlflow_uri": f"sqlite:///{folder}/mlflow.db",
            "optuna_storage": f"sqlite:///{folder}/optuna.db",
        },
    )
    data["compute"] |= {"instance_types": [], "packing": "off"}
    return JobSpec.model_validate(data)


def calibrate(spec: JobSpec, seconds_per_unit: float) -> dict[str, Any]:
    """The profile's ``overhead_s`` and ``job_overhead_s`` for ``spec`` on this machine,
    with the calibration jobs' wall seconds."""
    walls = []
    for waves in WAVES:
        with tempfile.TemporaryDirectory() as folder:
            summary = tune_spec(calibration_job(spec, waves, Path(folder)))
        walls.append(float(summary["wall_seconds"]))
    (a, b), (w_a, w_b) = WAVES, walls
    wave = (w_b - w_a) / (b - a)
    resource = getattr(spec.scheduler, "min_resource", 1.0)
    return {
        "overhead_s": round(max(0.0, wave - resource * seconds_per_unit), 4),
        "job_overhead_s": round(max(0.0, w_a - a * wave), 4),
        "calibration_wall_s": dict(zip(WAVES, walls, strict=True)),
    }
