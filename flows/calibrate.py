"""What one slot of this machine does in a real run, measured by running the job: the
second half of ``elastune profile`` (the first, :func:`tasks.profile.measure`, times units
in-process, one trial alone, and gives their spread and the device shares).

Small jobs run through the real machinery (Prefect, MLflow, Optuna, the job's pool), each
as ``elastune run`` in a fresh process, so that each pays the cold start a real run pays
(imports, the first model and data, the first dispatch): the job cut down to one SHA rung
of ``r`` resource units, ``n x compute.workers`` trials of the random sampler (``n`` waves
of segments, every slot busy, torch's threads shared as in a run), not planned, its stores
in a throwaway folder. Their wall seconds follow ``W(n, r) = F + n * (o + r * t)``, where
``F`` is what the job spends outside its segments (runs and study created, best model
registered: the profile's ``job_overhead_s``), ``o`` what a segment spends outside its
units (dispatch, MLflow, the model built, checkpoint I/O, warm-up: ``overhead_s``) and
``t`` a slot's seconds per unit (``seconds_per_unit: {1: t}``).

:func:`runs` picks three ``(n, k)``, with ``r = k`` first resource levels: 1 and 4 waves of
one level, and 4 waves of ``k`` levels, ``k`` large enough that the longer units add
:data:`UNITS_S` seconds per segment over the short ones (on this machine's timing noise,
a difference of a fraction of a second measures nothing), up to :data:`MAX_LEVELS`. Each
runs :data:`REPEATS` times: :func:`solve` recovers ``F``, ``o`` and ``t`` from the medians
(one run the machine slowed moves nothing: two runs of one job differed by up to 28%), and
the walls' spread around their own job's mean is the run-to-run spread of a job
(``job_overhead_sd``: the server's start, imports and dispatch jitter), which puts the
forecast's p95 above its p50 even for a trainable whose units never vary.

Example (walls of F = 3, o = 0.5, t = 0.2 at a first level of 1 unit):
    >>> solve({(1, 1): [3.7], (4, 1): [5.8], (4, 3): [7.4]}, 1.0, 0.3)
    {'seconds_per_unit': 0.2, 'overhead_s': 0.5, 'job_overhead_s': 3.0, 'job_overhead_sd': 0.0}
    >>> runs(1.0, 0.05)  # 1.25 s more per segment takes 26 levels of 0.05 s
    ((1, 1), (4, 1), (4, 26))
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from planners.spec import JobSpec, SpecError

REPEATS = 3  # runs of each calibration job: a median, and a job's run-to-run spread
UNITS_S = 1.25  # seconds the longer units add to a segment, by the in-process timing
MAX_LEVELS = 50  # units of a millisecond need no more: their time is lost in the overhead


def first_level(spec: JobSpec) -> float:
    """The resource of the job's shortest segment."""
    return float(getattr(spec.scheduler, "min_resource", 1.0))


def calibration_job(spec: JobSpec, waves: int, resource: float, folder: Path) -> JobSpec:
    """``spec`` cut down to ``waves`` waves of segments of ``resource`` units, stored under
    ``folder``."""
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


def run_elsewhere(job: JobSpec, folder: Path) -> float:
    """``elastune run`` of ``job`` in a fresh process (from the current directory, where its
    trainable is imported from); its wall seconds."""
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job.model_dump(mode="json")))
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(path), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SpecError(f"calibration: a small run of the job failed: {tail[0]}")
    return float(json.loads(done.stdout)["wall_seconds"])


def runs(level: float, alone: float) -> tuple[tuple[int, int], ...]:
    """(waves, resource in first levels) of the three calibration jobs, given the first
    level's units and a unit's seconds timed in-process (``alone``)."""
    longer = min(max(3, 1 + math.ceil(UNITS_S / (level * alone))), MAX_LEVELS)
    return ((1, 1), (4, 1), (4, longer))


def solve(
    walls: dict[tuple[int, int], list[float]], level: float, fallback_t: float
) -> dict[str, float]:
    """``t``, ``o``, ``F`` and the run-to-run spread from the calibration jobs' wall seconds,
    keyed as :func:`runs` gives them, from their medians (see the module docstring). Where
    noise makes ``t`` come out non-positive, ``fallback_t``, the in-process timing, is used."""
    ((n1, k1), first), ((n2, _), second), ((n3, k3), third) = (
        (key, statistics.median(values)) for key, values in walls.items()
    )
    wave = (second - first) / (n2 - n1)  # o + k1 * level * t
    job = first - n1 * wave
    longer = (third - job) / n3  # o + k3 * level * t
    t = (longer - wave) / ((k3 - k1) * level)
    t = t if t > 0 else fallback_t
    squares = sum((w - statistics.fmean(ws)) ** 2 for ws in walls.values() for w in ws)
    dof = sum(len(ws) - 1 for ws in walls.values())
    return {
        "seconds_per_unit": round(t, 6),
        "overhead_s": round(max(0.0, wave - k1 * level * t), 4),
        "job_overhead_s": round(max(0.0, job), 4),
        "job_overhead_sd": round(math.sqrt(squares / dof), 4) if dof else 0.0,
    }


def calibrate(
    spec: JobSpec, profile: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """``profile`` (a ``profile:`` section measured in-process) anchored to this machine's
    slots: every timing and spread scaled so that one slot takes the calibrated seconds
    per unit (the in-process relative speeds and spread kept), with the calibrated
    ``overhead_s``, ``job_overhead_s`` and ``job_overhead_sd``; and the calibration jobs'
    wall seconds."""
    level = first_level(spec)
    alone = profile["seconds_per_unit"][1]
    walls: dict[tuple[int, int], list[float]] = {}
    for _ in range(REPEATS):  # interleaved, so a slow minute of the machine hits every job
        for waves, levels in runs(level, alone):
            with tempfile.TemporaryDirectory() as folder:
                job = calibration_job(spec, waves, levels * level, Path(folder))
                walls.setdefault((waves, levels), []).append(run_elsewhere(job, Path(folder)))
    solved = solve(walls, level, alone)
    scale = solved.pop("seconds_per_unit") / alone
    out = {**profile, **solved}
    for key in ("seconds_per_unit", "sd_per_unit"):
        if key in profile:
            out[key] = {g: value * scale for g, value in profile[key].items()}
    return out, {f"{n} waves x {k} levels": w for (n, k), w in walls.items()}
