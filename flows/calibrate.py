"""What one slot of this machine does in a real run, measured by running the job: the
second half of ``elastune profile`` (the first, :func:`elastune.tasks.measure.measure`, times units
in-process, one trial alone, and gives their spread and the device shares).

Small jobs run through the real machinery (Prefect, MLflow, Optuna, the job's pool), each as
``elastune run`` in a fresh process, so that each pays the cold start a real run pays (imports, the
first model and data, the first dispatch): the job cut down to one SHA rung of ``r`` resource units,
``n x slots`` trials of the random sampler (``n`` waves of segments, every slot busy, torch's
threads shared as in a run), not planned, its stores in a throwaway folder. The slots are the plan's
(:func:`elastune.planners.cost.pricing.this_machine.local_slots`): the CUDA devices of a local job's
machine, else ``compute.workers``; one segment per slot, so that ``t`` is a whole slot's, the
profile's share 1. (With ``compute.workers`` segments on one GPU, ``t`` would be a quarter share's
time taken for a whole GPU's: on an H100 the plan then counted the sharing twice and forecast twice
the measured JCT, docs/gpu.md.)

Their wall seconds follow ``W(n, r) = F + n * (o + c + r * t)``, where ``F`` is what the job
spends outside its segments (runs and study created, best model registered: the profile's
``job_overhead_s``), ``o`` what a segment spends outside its units (dispatch, MLflow, the
model built, checkpoint I/O, warm-up: ``overhead_s``), ``c`` what a trial's first segment
adds to it (the sampler's proposal, the trial's MLflow run: ``trial_overhead_s``) and ``t``
a slot's seconds per unit (``seconds_per_unit: {1: t}``). A fourth job adds a second rung
(SHA at eta 2): ``m`` waves of resumed segments of ``r`` more units,
``W = W(n, r) + m * (o + r * t)``, which tells ``o`` from ``c``. Where ``F`` lies, the walls
cannot tell: each run's summary times what follows its last segment (``tail_seconds``), and
their median, at most ``F``, is the profile's ``job_tail_s``, which the plan forecasts after
the last stage instead of before the first.

:func:`runs` picks the four jobs (:class:`Run`), with ``r = k`` first resource levels: 1 and
``n`` waves of one level, 4 waves of ``k`` levels, ``k`` large enough that the longer units
add :data:`UNITS_S` seconds per segment over the short ones (on this machine's timing
noise, a difference of a fraction of a second measures nothing), up to :data:`MAX_LEVELS`,
and ``n`` waves of one level with ``n / 2`` waves resumed. ``n`` (even, 4 to 14) makes
the extra waves last :data:`WAVES_S` seconds: a job of short segments runs tens of
waves, and a wave's cost taken from only 3 more would carry the calibration's noise into
the forecast tenfold. Each runs :data:`REPEATS` times (``--repeats``): :func:`solve`
recovers ``F``, ``o``, ``c`` and ``t`` from the medians (one run the machine slowed moves
nothing: two runs of one job differed by up to 28%), and the walls' spread around their
own job's mean is the run-to-run spread of a job (:func:`spread`): a part the same for
every job (``job_overhead_sd``: the server's start, imports and dispatch jitter) and a part
in proportion to its segments' seconds (``run_cv``: the machine faster or slower for a
whole run, which a long job's many segments do not average away). Both put the forecast's
p95 above its p50 even for a trainable whose units never vary.

Example (walls of F = 3, o = 0.4, c = 0.1, t = 0.2 at a first level of 1 unit):
    >>> walls = {Run(1, 1): [3.7], Run(4, 1): [5.8], Run(4, 3): [7.4], Run(4, 1, True): [7.0]}
    >>> solve(walls, 1.0, 0.3)  # doctest: +NORMALIZE_WHITESPACE
    {'seconds_per_unit': 0.2, 'overhead_s': 0.4, 'trial_overhead_s': 0.1,
     'job_overhead_s': 3.0, 'job_overhead_sd': 0.0, 'run_cv': 0.0}
    >>> runs(1.0, 0.05)[2].label  # 1.25 s more per segment takes 26 levels of 0.05 s
    '4 waves x 26 levels'
    >>> runs(1.0, 0.05)[3].label  # waves of about 0.3 s: 12 of them
    '12 waves x 1 levels + 6 resumed'
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from subprocess import PIPE
from typing import Any, NamedTuple

import numpy as np
import yaml

from elastune.flows.ephemeral import watchdog
from elastune.flows.pools import pool_of
from elastune.planners.cost.pricing.this_machine import local_slots
from elastune.planners.spec import JobSpec, SpecError

REPEATS = 3  # runs of each calibration job: a median, and a job's run-to-run spread
UNITS_S = 1.25  # seconds the longer units add to a segment, by the in-process timing
MAX_LEVELS = 50  # units of a millisecond need no more: their time is lost in the overhead
WAVES_S = 3.0  # seconds the extra waves of one level add over the one-wave job
SEGMENT_S = 0.25  # a segment's seconds outside its units, before calibration measures them


def first_level(spec: JobSpec) -> float:
    """The resource of the job's shortest segment."""
    return float(getattr(spec.scheduler, "min_resource", 1.0))


class Run(NamedTuple):
    """A calibration job: ``waves`` waves of new trials training ``levels`` first levels;
    with ``resumes``, half of them (SHA at eta 2) then train as many more."""

    waves: int
    levels: int
    resumes: bool = False

    @property
    def resumed(self) -> int:
        """Waves of resumed segments: half the trials, as many slots."""
        return self.waves // 2 if self.resumes else 0

    @property
    def label(self) -> str:
        label = f"{self.waves} waves x {self.levels} levels"
        return label + (f" + {self.resumed} resumed" if self.resumed else "")


def calibration_job(
    spec: JobSpec, run: Run, level: float, folder: Path, devices: int | None = None
) -> JobSpec:
    """``spec`` cut down to calibration job ``run`` at a first level of ``level`` units,
    stored under ``folder``, one segment per slot of a machine of ``devices`` CUDA devices
    (None: the CPU's ``compute.workers`` slots)."""
    resource = run.levels * level
    slots = local_slots(spec, devices)
    data = spec.model_dump()
    data.update(
        name=f"{spec.name}-calibration",
        sampler={"name": "random", "seed": 0},
        scheduler={
            "name": "sha",
            "eta": 2,
            "min_resource": resource,
            "max_resource": resource * (2 if run.resumes else 1),
            "max_trials": run.waves * slots,
        },
        budget={},
        profile=None,
        tracking={
            "mlflow_uri": f"sqlite:///{folder}/mlflow.db",
            "optuna_storage": f"sqlite:///{folder}/optuna.db",
        },
    )
    data["compute"] |= {"workers": slots, "instance_types": [], "packing": "off"}
    return JobSpec.model_validate(data)


def run_elsewhere(job: JobSpec, folder: Path) -> tuple[float, float]:
    """``elastune run`` of ``job`` in a fresh process (from the current directory, where its
    trainable is imported from); its wall seconds, and those after its last segment."""
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job.model_dump(mode="json")))
    command = [sys.executable, "-m", "elastune.flows.cli", "run", str(path), "--json"]
    with subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True) as run:
        # A profile killed, even by SIGKILL, leaves no run of its own running, nor its folder.
        stand_down = watchdog(run.pid, leftovers=[folder])
        try:
            out, err = run.communicate()
        except BaseException:  # Ctrl-C: as subprocess.run does
            run.kill()
            raise
        finally:
            stand_down()
    if run.returncode != 0:
        tail = err.strip().splitlines()[-1:] or ["no output"]
        raise SpecError(f"calibration: a small run of the job failed: {tail[0]}")
    summary = json.loads(out)
    return float(summary["wall_seconds"]), float(summary["tail_seconds"])


def say(line: str) -> None:
    """A progress line on stderr (stdout is the profile, or its JSON)."""
    print(line, file=sys.stderr, flush=True)


def runs(level: float, alone: float) -> tuple[Run, ...]:
    """The four calibration jobs, given the first level's units and a unit's seconds timed
    in-process (``alone``)."""
    longer = min(max(3, 1 + math.ceil(UNITS_S / (level * alone))), MAX_LEVELS)
    waves = max(4, 1 + math.ceil(WAVES_S / (level * alone + SEGMENT_S)))
    waves += waves % 2  # even: half its trials resumed fill whole waves
    return (Run(1, 1), Run(waves, 1), Run(4, longer), Run(waves, 1, resumes=True))


def estimate(
    jobs: tuple[Run, ...], medians: np.ndarray, level: float, t: float | None = None
) -> np.ndarray:
    """``F``, ``o``, ``c`` and ``t`` (``t`` given: that one) from the four jobs' walls,
    unclamped: linear in the walls (see the module docstring)."""
    (one, four, long, resumed), (first, second, third, fourth) = jobs, medians
    wave = (second - first) / (four.waves - one.waves)  # o + c + k1 * level * t
    job = first - one.waves * wave
    if t is None:
        longer = (third - job) / long.waves  # o + c + k3 * level * t
        t = (longer - wave) / ((long.levels - one.levels) * level)
    # o + k4 * level * t, from the resumed waves that follow the new ones
    new = wave + (resumed.levels - one.levels) * level * t  # its new trials' waves
    again = (fourth - job - resumed.waves * new) / resumed.resumed
    overhead = again - resumed.levels * level * t
    return np.array([job, overhead, wave - one.levels * level * t - overhead, t])


def solve(walls: dict[Run, list[float]], level: float, fallback_t: float) -> dict[str, Any]:
    """``t``, ``o``, ``c``, ``F``, the run-to-run spread and the estimates' covariance from
    the calibration jobs' wall seconds, keyed as :func:`runs` gives them, from their
    medians (see the module docstring). Where noise makes ``t`` come out non-positive,
    ``fallback_t``, the in-process timing, is used."""
    jobs, medians = tuple(walls), _medians(walls)
    job, overhead, trial, t = estimate(jobs, medians, level).tolist()
    if t <= 0:
        job, overhead, trial, t = estimate(jobs, medians, level, fallback_t).tolist()
    fixed, relative = spread(walls, max(0.0, job))
    # A new segment's overhead, o + c, comes from the waves of new trials alone; the split
    # between o and c from the resumed job's few waves is noisier. Where noise puts either
    # below 0, the split moves and their sum stays.
    first = max(0.0, overhead + trial)  # what a trial's first segment spends outside units
    overhead = min(max(0.0, overhead), first)
    solved: dict[str, Any] = {
        "seconds_per_unit": round(t, 6),
        "overhead_s": round(overhead, 4),
        "trial_overhead_s": round(first - overhead, 4),
        "job_overhead_s": round(max(0.0, job), 4),
        "job_overhead_sd": round(fixed, 4),
        "run_cv": round(relative, 4),
    }
    cov = covariance(walls, level, (fixed, relative), max(0.0, job), t)
    if cov is not None:
        solved["calibration_cov"] = cov
        # each job's repeats give their count less one, the spread's two parts take two
        solved["calibration_dof"] = sum(len(values) - 1 for values in walls.values()) - 2
    return solved


def covariance(
    walls: dict[Run, list[float]], level: float, spreads: tuple[float, float], job: float, t: float
) -> list[list[float]] | None:
    """The covariance of the errors in ``F``, ``o``, ``c`` and ``t`` (relative to ``t``) that
    the medians' own noise puts in :func:`estimate`: each job's median is off by its spread
    (:func:`spread`) over its repeats (a median of ``n`` varies ``pi / 2n`` times one run's
    variance: its large-``n`` value, a little above the exact 0.449 at 3), and the estimate
    is linear in them. ``None`` where the repeats gave no spread."""
    fixed, relative = spreads
    jobs, medians = tuple(walls), _medians(walls)
    variances = np.array(
        [
            (fixed**2 + (relative * max(0.0, statistics.fmean(values) - job)) ** 2)
            * min(1.0, math.pi / (2 * len(values)))
            for values in walls.values()
        ]
    )
    if not variances.any():
        return None
    base = estimate(jobs, medians, level)
    jacobian = np.column_stack([estimate(jobs, medians + e, level) - base for e in np.eye(4)])
    scale = np.diag([1.0, 1.0, 1.0, 1.0 / t])  # t's error relative: it scales every width
    cov = scale @ jacobian @ np.diag(variances) @ jacobian.T @ scale
    return [[float(f"{value:.4g}") for value in row] for row in cov]


def _medians(walls: dict[Run, list[float]]) -> np.ndarray:
    """Each calibration job's median wall seconds, in :func:`runs` order."""
    return np.array([statistics.median(values) for values in walls.values()])


def spread(walls: dict[Run, list[float]], job: float) -> tuple[float, float]:
    """The run-to-run spread of a job's wall, ``a`` seconds whatever its length (the
    start) and ``c`` times its segments' seconds (the machine's speed during the run):
    each job's variance over its repeats is ``a**2 + (c * s)**2``, ``s`` its mean wall less
    ``job``; fitted by least squares, neither part negative. No repeats: no spread."""
    rows = [
        (statistics.variance(ws), (statistics.fmean(ws) - job) ** 2)
        for ws in walls.values()
        if len(ws) > 1
    ]
    if not rows:
        return 0.0, 0.0
    variances, squares = np.array(rows).T
    design = np.column_stack([np.ones_like(squares), squares])
    a2, c2 = np.linalg.lstsq(design, variances, rcond=None)[0]
    if a2 < 0:  # the longer jobs spread more than the fit allows: the relative part alone
        a2, c2 = 0.0, max(0.0, float(variances @ squares / max(squares @ squares, 1e-12)))
    elif c2 < 0:  # the longer jobs spread less: the fixed part alone
        a2, c2 = float(variances.mean()), 0.0
    return math.sqrt(a2), math.sqrt(c2)


def calibrate(
    spec: JobSpec, profile: dict[str, Any], repeats: int | None = None
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """``profile`` (a ``profile:`` section measured in-process) anchored to this machine's
    slots: every timing and spread scaled so that one slot takes the calibrated seconds
    per unit (the in-process relative speeds and spread kept), with the calibrated
    ``overhead_s``, ``job_overhead_s`` (``job_tail_s`` of it after the last segment) and
    ``job_overhead_sd``; and the calibration jobs' wall seconds. Each job runs ``repeats``
    times (None: :data:`REPEATS`)."""
    repeats = REPEATS if repeats is None else repeats
    level = first_level(spec)
    alone = profile["seconds_per_unit"][1]
    devices = pool_of(spec).devices
    jobs = runs(level, alone)
    walls: dict[Run, list[float]] = {}
    tails: list[float] = []
    # Each run is a new process, seconds to half a minute: the user sees them go by.
    say(f"calibrating: {len(jobs)} small jobs, {repeats} runs each, each run a new process")
    for repeat in range(repeats):  # interleaved, so a slow minute of the machine hits every job
        for index, run in enumerate(jobs, 1 + repeat * len(jobs)):
            began = time.monotonic()
            with tempfile.TemporaryDirectory() as folder:
                job = calibration_job(spec, run, level, Path(folder), devices)
                wall, tail = run_elsewhere(job, Path(folder))
            walls.setdefault(run, []).append(wall)
            tails.append(tail)
            done = time.monotonic() - began
            say(
                f"calibration {index}/{len(jobs) * repeats} ({run.label}): "
                f"job {wall:.1f} s, process {done:.1f} s"
            )
    solved = solve(walls, level, alone)
    # Where the job's overhead lies does not change the walls, so it is timed, not solved.
    solved["job_tail_s"] = round(min(statistics.median(tails), solved["job_overhead_s"]), 4)
    scale = solved.pop("seconds_per_unit") / alone
    out = {**profile, **solved}
    for key in ("seconds_per_unit", "sd_per_unit"):
        if key in profile:
            out[key] = {g: value * scale for g, value in profile[key].items()}
    return out, {run.label: w for run, w in walls.items()}
