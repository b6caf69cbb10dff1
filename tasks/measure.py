"""``elastune profile``: measure the trainable's seconds per resource unit on this machine.

The trainable runs a few resource units for a few sampled configurations, in worker
processes as a local job's segments do (tasks/worker_processes.py), against a throwaway MLflow
store; the time between consecutive reports is one unit's time. The first unit of each run
is left out (data loading, warm-up), and what the segment spent outside its units is the
per-segment overhead (building, restoring, checkpointing).
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import optuna
import torch

from elastune.planners.spec import JobSpec, SpecError, distributions, make_sampler
from elastune.planners.staging import Profile
from elastune.tasks.context import TrialContext
from elastune.tasks.tracking import Tracker, shared_tracker
from elastune.tasks.trainable import load_trainable
from elastune.tasks.worker_processes import WorkerProcesses


class _TimedContext(TrialContext):
    """A context that notes when the first report of each resource level arrives."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.stamps: dict[float, float] = {}

    def report(self, resource: float | None = None, **metrics: float) -> None:
        self.stamps.setdefault(self.resource if resource is None else resource, time.perf_counter())
        super().report(resource, **metrics)


def measure(
    spec: JobSpec, units: int = 3, configs: int = 2, shares: tuple[float, ...] = (1.0,)
) -> dict[str, Any]:
    """Seconds per resource unit on one device of this machine, with their spread, at each
    of ``shares``: 1 is a whole device; ``1/k`` is one of ``k`` copies of a configuration
    training on it at once (worker processes, as the local pool runs segments)."""
    if units < 2:
        raise SpecError(f"--units must be >= 2 (the first one is warm-up), got {units}")
    print(f"timing {configs} configurations x {units} units here", file=sys.stderr)
    copies = {share: _copies(share) for share in shares}
    load_trainable(spec.trainable)  # bad input before any worker starts
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    study = optuna.create_study(sampler=make_sampler(spec))
    per_unit: dict[float, list[float]] = {}
    overheads: list[float] = []
    trials = itertools.count()
    with tempfile.TemporaryDirectory() as tmp, WorkerProcesses(torch.get_num_threads()) as workers:
        uri = f"sqlite:///{Path(tmp)}/profile.db"
        Tracker(uri, "profile")  # the store, made once before the workers share it
        for _ in range(configs):
            # The same configuration at every share, so that shares compare like with like.
            config = study.ask(distributions(spec)).params
            for share, k in copies.items():
                jobs = [(next(trials), config) for _ in range(k)]

                def timed_in_worker(job: tuple[int, dict[str, Any]]) -> tuple[list[float], float]:
                    with workers.worker() as worker:
                        return worker.call(_timed, spec, uri, *job, units, device)

                with ThreadPoolExecutor(k) as pool:
                    timed = list(pool.map(timed_in_worker, jobs))
                per_unit.setdefault(share, []).extend(g for gaps, _ in timed for g in gaps)
                if k == 1:
                    overheads += [overhead for _, overhead in timed]
    profile = Profile.from_measurements(per_unit, overhead_s=statistics.fmean(overheads or [0.0]))
    return {
        "device": device,
        "units": units,
        "configs": configs,
        "shares": list(copies),
        "profile": profile.to_dict(),
    }


def _copies(share: float) -> int:
    """Trials per device at ``share``: 1, or k for a share of 1/k."""
    k = round(1 / share) if share > 0 else 0
    if not 0 < share <= 1 or not math.isclose(k * share, 1.0):
        raise SpecError(f"--shares: {share:g} is not 1 or 1/k for a whole k (0.5, 0.25, ...)")
    return k


def _timed(
    spec: JobSpec, uri: str, trial: int, config: dict[str, Any], units: int, device: str
) -> tuple[list[float], float]:
    """Train ``units`` units of ``config`` in this worker, tracked in the MLflow store at
    ``uri``: the seconds of each unit after the first, and the segment's time outside its
    units (building, restoring, checkpointing)."""
    trainable = load_trainable(spec.trainable)
    tracker = shared_tracker(uri, "profile")
    run_id = tracker.start_trial("profile", "", trial, config)
    ctx = _TimedContext(
        trial=trial,
        start=0,
        stop=units,
        max_resource=spec.scheduler.max_resource,
        run_id=run_id,
        tracker=tracker,
        device=device,
    )
    began = time.perf_counter()
    trainable(config, ctx)
    seconds = time.perf_counter() - began
    stamps = [ctx.stamps[r] for r in sorted(ctx.stamps)]
    if len(stamps) < 2:
        raise SpecError(
            f"trainable: {spec.trainable} reported {len(stamps)} time(s) in {units} "
            "units; profile needs one report per unit"
        )
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return gaps, max(0.0, seconds - (stamps[-1] - stamps[0]) - statistics.fmean(gaps))
