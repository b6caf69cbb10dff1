"""``elastune profile``: measure the trainable's seconds per resource unit on this machine.

The trainable runs a few resource units for a few sampled configurations, in this process,
against a throwaway MLflow store; the time between consecutive reports is one unit's time.
The first unit of each run is left out (data loading, warm-up), and what the segment spent
outside its units is the per-segment overhead (building, restoring, checkpointing).
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import torch

from planners.cost import Profile
from planners.space import distributions, make_sampler
from planners.spec import JobSpec, SpecError
from tasks.context import TrialContext
from tasks.tracking import Tracker
from tasks.train import load_trainable


class _TimedContext(TrialContext):
    """A context that notes when the first report of each resource level arrives."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.stamps: dict[float, float] = {}

    def report(self, resource: float | None = None, **metrics: float) -> None:
        self.stamps.setdefault(self.resource if resource is None else resource, time.perf_counter())
        super().report(resource, **metrics)


def measure(spec: JobSpec, units: int = 3, configs: int = 2) -> dict[str, Any]:
    """Seconds per resource unit on one device of this machine, with their spread."""
    if units < 2:
        raise SpecError(f"--units must be >= 2 (the first one is warm-up), got {units}")
    trainable = load_trainable(spec.trainable)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    study = optuna.create_study(sampler=make_sampler(spec))
    per_unit: list[float] = []
    overheads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tracker = Tracker(f"sqlite:///{Path(tmp)}/profile.db", "profile")
        for trial in range(configs):
            config = study.ask(distributions(spec)).params
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
            per_unit += gaps
            overheads.append(max(0.0, seconds - (stamps[-1] - stamps[0]) - statistics.fmean(gaps)))
    profile = Profile.from_measurements({1.0: per_unit}, overhead_s=statistics.fmean(overheads))
    return {"device": device, "units": units, "configs": configs, "profile": profile.to_dict()}
