"""Which widths (GPUs per segment) a job can run, checked before anything runs and again by
the training task for each segment.

One GPU always can: it is what a segment falls back to. A wider segment needs a trainable
that trains data-parallel, a profile that covers its width, and enough GPUs in the pool and
on the worker; a share of one GPU needs only the profile to cover it.

Example:
    >>> width_problem(2, trainable="m:f", distributed=True, covered=(1, 2, 4)) is None
    True
    >>> width_problem(3, trainable="m:f", distributed=True, covered=(1, 2, 4))
    '3 GPUs per trial is a width the profile does not cover (profile GPU counts: 1, 2, 4)'
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from elastune.planners.spec import JobSpec, SpecError
from elastune.planners.staging.plan import Plan
from elastune.planners.staging.profile import Profile

FALLBACK_HINT = "; set compute.elastic_fallback: true to run such segments on 1 GPU instead"


def profile_widths(spec: JobSpec) -> tuple[float, ...] | None:
    """The GPU counts the job's profile covers; None when the job has no profile."""
    return None if spec.profile is None else Profile.from_spec(spec.profile).gpu_counts


def width_problem(
    gpus: float,
    *,
    trainable: str,
    distributed: bool,
    covered: Sequence[float] | None = None,
    max_gpus: int | None = None,
    devices: int | None = None,
) -> str | None:
    """Why a segment cannot run on ``gpus`` GPUs, or None if it can.

    ``covered`` are the profile's GPU counts, ``max_gpus`` the pool's (``compute.max_gpus``),
    ``devices`` the CUDA devices of the worker (None on CPU, where ranks are processes).
    """
    if not gpus > 0:
        return f"a segment needs a positive number of GPUs, got {gpus:g}"
    if gpus == 1:
        return None
    if covered is not None and not any(math.isclose(gpus, c) for c in covered):
        counts = ", ".join(f"{c:g}" for c in covered)
        return (
            f"{gpus:g} GPUs per trial is a width the profile does not cover "
            f"(profile GPU counts: {counts})"
        )
    if gpus < 1:
        return None  # a share of one device: any trainable can run so
    if gpus != int(gpus):
        return f"{gpus:g} GPUs per trial: a width above 1 must be a whole number of GPUs"
    if max_gpus is not None and gpus > max_gpus:
        return f"{gpus:g} GPUs per trial is more than the pool has (compute.max_gpus: {max_gpus})"
    if not distributed:
        return (
            f"trainable: {trainable} does not support distributed training, asked to run on "
            f"{gpus:g} GPUs (mark it with `{trainable.partition(':')[2]}.distributed = True` "
            "once it uses ctx.wrap and ctx.batches)"
        )
    if devices is not None and gpus > devices:
        return f"{gpus:g} GPUs per trial is more than this worker has ({devices} CUDA devices)"
    return None


def check_widths(spec: JobSpec, plan: Plan, *, distributed: bool, devices: int | None) -> None:
    """Before anything runs: every stage's width can run, or the job falls back to 1 GPU.
    Raises SpecError naming the stage and the field."""
    if spec.compute.elastic_fallback:
        return
    covered = profile_widths(spec)
    for stage in plan.stages:
        problem = width_problem(
            stage.gpus_per_trial,
            trainable=spec.trainable,
            distributed=distributed,
            covered=covered,
            max_gpus=spec.compute.max_gpus,
            devices=devices,
        )
        if problem is not None:
            raise SpecError(f"plan stage {stage.name}: {problem}{FALLBACK_HINT}")
