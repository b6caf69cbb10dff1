"""The speed profile: seconds per resource unit of one trial on ``g`` GPUs, with its spread.

One class serves the cost planner (timings, spread, GPU models), the Fluid packer
(``elastune.planners.staging.fluid``) and the tuning simulator (``elastune.planners.sim``), which
both see speeds relative to one whole GPU. Speedup is ``S(g) = t(1) / t(g)``.

A segment of ``r`` resource units on ``g`` GPUs takes ``overhead + r * t(g)`` seconds on
average; ``overhead`` is what a segment spends outside its units (dispatch, building the
model, restoring and saving a checkpoint); a trial's first segment adds
``trial_overhead_s`` (the sampler proposing its configuration, its MLflow run created),
which a resumed segment does not pay. A job spends ``job_overhead_s`` outside its
segments (its runs and study created, its best model registered), give or take
``job_overhead_sd`` from one run to the next, ``job_tail_s`` of it after its last segment.
A segment's spread has three parts: unit-to-unit noise, independent between units, so by
the central limit theorem its sd grows as ``sqrt(r) * sd(g)`` (docs/algorithms.md §5.3); a
per-segment straggler factor ``segment_cv`` (a slow node stays slow for the whole segment),
whose sd grows as ``r * t(g) * segment_cv``; and a per-run factor ``run_cv`` shared by
every segment of a run (a machine slower or faster for a whole run), which the many
segments of a job do not average away. A calibrated profile also knows how far its own
numbers may be off: ``calibration_cov``, the covariance of the errors in
``job_overhead_s``, ``overhead_s``, ``trial_overhead_s`` and ``seconds_per_unit``
(relative), in that order, which a run meets once, in all its segments alike (``elastune
profile`` estimates them from a few short runs: flows/calibrate.py).

A profile comes from the job file's ``profile:`` section (:meth:`Profile.from_spec`), from
numbers measured by ``elastune profile`` (:meth:`Profile.from_measurements`), from a
scaling model (:meth:`Profile.from_scaling`), or from speeds alone, in the packer's terms
(:meth:`Profile.from_speeds`, :meth:`Profile.linear`).

The packer's view: ``speedup`` holds ``S(g)`` for whole GPU counts, ``sharing`` holds
``sigma(c) = t(1) / t(1/c)``, the speed of each of ``c`` trials sharing one GPU, and
``overhead_s`` is also what restarting a running segment costs (checkpoint and restore).
It needs a timing on one GPU, which the speeds are relative to (:attr:`Profile.packable`).

Example:
    >>> profile = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2})
    >>> profile.gpu_counts, profile.timing(4).mean
    ((1.0, 2.0, 4.0), 225.0)
    >>> measured = Profile.from_measurements({1: [700, 740], 2: [400, 400]})
    >>> measured.timing(1), measured.to_dict()["seconds_per_unit"]
    (Timing(mean=720.0, sd=28.284271247461902), {1: 720.0, 2: 400.0})
    >>> shared = Profile({0.5: 1.25, 1: 1.0, 2: 0.625})  # two trials per GPU: 0.8 each
    >>> shared.speedup, shared.sharing, Profile({0.5: 0.5, 1: 1.0}).sharing
    ({1: 1.0, 2: 1.6}, {2: 0.8}, {})
    >>> Profile.from_speeds({2: 1.8}, sharing={2: 0.85}).sharing
    {2: 0.85}
    >>> profile.timing(8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    elastune.planners.staging.profile.ProfileError: profile.seconds_per_unit: no timing for 8 ...
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, Protocol

from elastune.planners.spec import SpecError
from elastune.planners.spec.covariance import SIZE, covariance_problem
from elastune.planners.spec.model import ProfileSpec


class ProfileError(SpecError):
    """The profile lacks what a plan needs; the message names the profile field."""


class GpuNode(Protocol):
    """What the profile reads of an instance type (the catalog's ``InstanceType``): its
    name, GPUs per node and GPU model."""

    @property
    def name(self) -> str: ...

    @property
    def gpus(self) -> int: ...

    @property
    def gpu(self) -> str: ...


@dataclass(frozen=True)
class Timing:
    """Seconds per resource unit: ``mean`` and ``sd`` (unit-to-unit, independent)."""

    mean: float
    sd: float = 0.0


def _counts(values: Iterable[float]) -> str:
    return ", ".join(f"{g:g}" for g in sorted(values))


@dataclass(frozen=True)
class Profile:
    """Timings of one trial per GPU count (see the module docstring).

    Args:
        timings: ``g -> Timing`` (or a plain mean in seconds) per GPU count.
        segment_cv: Per-segment straggler spread, relative to the segment's mean.
        overhead_s: Seconds added to every segment (dispatch, checkpoint restore and save);
            the packer's rescale cost, paid when it restarts a running segment.
        trial_overhead_s: Seconds a trial's first segment adds to ``overhead_s`` (the
            sampler's proposal, the trial's MLflow run).
        job_overhead_s: Seconds a job spends outside its segments (the cost simulator
            counts them before the first, except ``job_tail_s``).
        job_overhead_sd: Their spread from one run of the job to the next.
        job_tail_s: Of ``job_overhead_s``, the seconds after the last segment (the last
            decisions written, the best model registered), which the cost simulator counts
            after the last stage: a stage's forecast end is not late by them.
        run_cv: The segments' speed from one run of the job to the next, relative: one
            factor for every segment of a run.
        calibration_cov: The covariance of the errors in ``job_overhead_s``,
            ``overhead_s``, ``trial_overhead_s`` and ``seconds_per_unit`` (relative), as
            estimated; ``None``: taken as exact.
        calibration_dof: The degrees of freedom the run-to-run spreads (``job_overhead_sd``,
            ``run_cv``, and so ``calibration_cov``) were estimated with: a run's draws are
            then Student-t; ``None``: the spreads taken as exact.
        segment_cv_dof: The degrees of freedom ``segment_cv`` was read with: each
            simulated run then draws a straggler spread of its own around it (a few
            segments may have read it narrow); ``None``: taken as exact.
        gpu: GPU model the timings were measured on; ``None`` means any model.
        gpu_speed: Throughput of other GPU models relative to ``gpu`` (2.0: twice as
            fast): the job file's ``speed``.
    """

    timings: Mapping[float, Timing]
    segment_cv: float = 0.0
    overhead_s: float = 0.0
    trial_overhead_s: float = 0.0
    job_overhead_s: float = 0.0
    job_overhead_sd: float = 0.0
    job_tail_s: float = 0.0
    run_cv: float = 0.0
    calibration_cov: tuple[tuple[float, ...], ...] | None = None
    calibration_dof: float | None = None
    segment_cv_dof: float | None = None
    gpu: str | None = None
    gpu_speed: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.timings:
            raise ProfileError("profile.seconds_per_unit: the profile has no GPU counts")
        timings: dict[float, Timing] = {}
        for g, timing in sorted(self.timings.items()):
            if not isinstance(timing, Timing):
                timing = Timing(float(timing))
            if g <= 0:
                raise ProfileError(f"profile.seconds_per_unit: GPU count must be > 0, got {g:g}")
            if not timing.mean > 0:
                raise ProfileError(
                    f"profile.seconds_per_unit.{g:g}: seconds must be > 0, got {timing.mean}"
                )
            if not timing.sd >= 0:
                raise ProfileError(f"profile.sd_per_unit.{g:g}: must be >= 0, got {timing.sd}")
            timings[float(g)] = timing
        object.__setattr__(self, "timings", timings)
        for name, value in (
            ("segment_cv", self.segment_cv),
            ("overhead_s", self.overhead_s),
            ("trial_overhead_s", self.trial_overhead_s),
            ("job_overhead_s", self.job_overhead_s),
            ("job_overhead_sd", self.job_overhead_sd),
            ("job_tail_s", self.job_tail_s),
            ("run_cv", self.run_cv),
        ):
            if not value >= 0:
                raise ProfileError(f"profile.{name}: must be >= 0, got {value}")
        if self.job_tail_s > self.job_overhead_s:
            raise ProfileError(
                f"profile.job_tail_s: {self.job_tail_s:g} is part of job_overhead_s "
                f"({self.job_overhead_s:g}), so at most that"
            )
        if self.calibration_cov is not None:
            cov = tuple(tuple(float(v) for v in row) for row in self.calibration_cov)
            object.__setattr__(self, "calibration_cov", cov)
            problem = covariance_problem(cov)
            if problem is not None or len(cov) != SIZE:
                raise ProfileError(
                    f"profile.calibration_cov: {problem or f'must be {SIZE} x {SIZE}'}"
                )
        for name, dof in (
            ("calibration_dof", self.calibration_dof),
            ("segment_cv_dof", self.segment_cv_dof),
        ):
            if dof is not None and not dof > 0:
                raise ProfileError(f"profile.{name}: must be > 0, got {dof}")
        for model, factor in self.gpu_speed.items():
            if not factor > 0:
                raise ProfileError(f"profile.speed.{model}: must be > 0, got {factor}")

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_measurements(cls, samples: Mapping[float, Sequence[float]], **options: Any) -> Profile:
        """From measured seconds per resource unit, several samples per GPU count."""
        timings = {}
        for g, values in samples.items():
            if not values:
                raise ProfileError(f"profile.seconds_per_unit.{g:g}: no measurements")
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            timings[g] = Timing(statistics.fmean(values), sd)
        return cls(timings, **options)

    @classmethod
    def from_scaling(
        cls,
        seconds_1gpu: float,
        *,
        speedup: Mapping[float, float] | None = None,
        serial_fraction: float | None = None,
        gpus: Sequence[float] = (1, 2, 4, 8),
        unit_cv: float = 0.0,
        **options: Any,
    ) -> Profile:
        """From the time on one GPU and a speedup table, or Amdahl's law over ``gpus``."""
        if speedup is not None:
            table = {1.0: 1.0, **{float(g): s for g, s in speedup.items()}}
        elif serial_fraction is not None:
            table = {float(g): 1 / (serial_fraction + (1 - serial_fraction) / g) for g in gpus}
        else:
            table = {float(g): float(g) for g in gpus}  # linear scaling
        for g, s in table.items():
            if not s > 0:
                raise ProfileError(f"profile.speedup.{g:g}: must be > 0, got {s}")
        mean = {g: seconds_1gpu / s for g, s in table.items()}
        return cls({g: Timing(m, unit_cv * m) for g, m in mean.items()}, **options)

    @classmethod
    def from_spec(cls, spec: ProfileSpec) -> Profile:
        """From the job file's validated ``profile:`` section."""
        options: dict[str, Any] = {
            "segment_cv": spec.segment_cv,
            "overhead_s": spec.overhead_s,
            "trial_overhead_s": spec.trial_overhead_s,
            "job_overhead_s": spec.job_overhead_s,
            "job_overhead_sd": spec.job_overhead_sd,
            "job_tail_s": spec.job_tail_s,
            "run_cv": spec.run_cv,
            "calibration_cov": spec.calibration_cov,
            "calibration_dof": spec.calibration_dof,
            "segment_cv_dof": spec.segment_cv_dof,
            "gpu": spec.gpu,
            "gpu_speed": dict(spec.speed),
        }
        if spec.speedup is not None or spec.serial_fraction is not None:
            return cls.from_scaling(
                spec.seconds_per_unit[1.0],
                speedup=spec.speedup,
                serial_fraction=spec.serial_fraction,
                gpus=spec.gpus,
                unit_cv=spec.unit_cv,
                **options,
            )
        timings = {
            g: Timing(mean, spec.sd_per_unit.get(g, spec.unit_cv * mean))
            for g, mean in spec.seconds_per_unit.items()
        }
        return cls(timings, **options)

    @classmethod
    def from_speeds(
        cls,
        speedup: Mapping[int, float] | None = None,
        sharing: Mapping[int, float] | None = None,
        *,
        overhead_s: float = 0.0,
    ) -> Profile:
        """From speeds relative to one whole GPU, in the packer's terms: ``S(g)`` for whole
        widths ``g >= 1`` (``S(1) = 1`` is implied) and ``sigma(c)`` for ``c >= 2`` trials
        sharing one GPU. A unit takes one second on one GPU."""
        speedup = {1: 1.0, **(speedup or {})}
        for g, s in speedup.items():
            if not isinstance(g, int) or g < 1:
                raise ValueError(f"speedup width must be an integer >= 1, got {g!r}")
            if not s > 0:
                raise ValueError(f"speedup S({g}) must be > 0, got {s}")
        if speedup[1] != 1.0:
            raise ValueError(
                f"speedup S(1) must be 1 (speeds are relative to 1 GPU), got {speedup[1]}"
            )
        sharing = dict(sorted((sharing or {}).items()))
        previous = 1.0
        for c, sigma in sharing.items():
            if not isinstance(c, int) or c < 2:
                raise ValueError(f"sharing count must be an integer >= 2, got {c!r}")
            # The packer's view drops such timings from a measured profile; given as speeds
            # they are a mistake.
            if not 0 < sigma <= previous:
                raise ValueError(
                    f"sharing sigma({c}) must lie in (0, {previous:g}]: a trial cannot run "
                    f"faster when more share its GPU, got {sigma}"
                )
            previous = sigma
        timings = {float(g): 1 / s for g, s in speedup.items()}
        timings |= {1 / c: 1 / sigma for c, sigma in sharing.items()}
        return cls(timings, overhead_s=overhead_s)

    @classmethod
    def linear(cls, max_width: int, overhead_s: float = 0.0) -> Profile:
        """``S(g) = g`` for powers of two up to ``max_width``: the released Fluid code's model."""
        widths = [2**k for k in range(max_width.bit_length()) if 2**k <= max_width]
        return cls.from_speeds({g: float(g) for g in widths}, overhead_s=overhead_s)

    def to_dict(self) -> dict[str, Any]:
        """The job file's ``profile:`` section for this profile (round-trips via from_spec)."""

        def key(g: float) -> float | int:
            return int(g) if g.is_integer() else g

        out: dict[str, Any] = {
            "seconds_per_unit": {key(g): t.mean for g, t in self.timings.items()},
        }
        if any(t.sd for t in self.timings.values()):
            out["sd_per_unit"] = {key(g): t.sd for g, t in self.timings.items()}
        if self.segment_cv:
            out["segment_cv"] = self.segment_cv
        if self.overhead_s:
            out["overhead_s"] = self.overhead_s
        if self.trial_overhead_s:
            out["trial_overhead_s"] = self.trial_overhead_s
        if self.job_overhead_s:
            out["job_overhead_s"] = self.job_overhead_s
        if self.job_overhead_sd:
            out["job_overhead_sd"] = self.job_overhead_sd
        if self.job_tail_s:
            out["job_tail_s"] = self.job_tail_s
        if self.run_cv:
            out["run_cv"] = self.run_cv
        if self.calibration_cov is not None:
            out["calibration_cov"] = [list(row) for row in self.calibration_cov]
        if self.calibration_dof is not None:
            out["calibration_dof"] = self.calibration_dof
        if self.segment_cv_dof is not None:
            out["segment_cv_dof"] = self.segment_cv_dof
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.gpu_speed:
            out["speed"] = dict(self.gpu_speed)
        return out

    # --- queries ------------------------------------------------------------------------

    @property
    def gpu_counts(self) -> tuple[float, ...]:
        return tuple(self.timings)

    def covers(self, instance: GpuNode) -> bool:
        """Whether the profile has timings for this instance type's GPU model."""
        return self.gpu is None or instance.gpu == self.gpu or instance.gpu in self.gpu_speed

    def check(self, instance: GpuNode) -> None:
        """Raise :class:`ProfileError`, naming the field, if no trial can be timed on
        ``instance``: its GPU model is not covered or no GPU count fits one node."""
        self.timing(self.gpu_counts[0], instance)
        if not self.counts_for(instance):
            raise ProfileError(
                f"profile.seconds_per_unit: no GPU count fits one {instance.name} node "
                f"({instance.gpus} GPUs; the profile has {_counts(self.timings)})"
            )

    def counts_for(self, instance: GpuNode) -> tuple[float, ...]:
        """GPU counts a trial may use on one node of ``instance`` (workers are co-located)."""
        return tuple(g for g in self.timings if g <= instance.gpus)

    def timing(self, g: float, instance: GpuNode | None = None) -> Timing:
        """Seconds per resource unit on ``g`` GPUs of ``instance``'s model."""
        timing = self.timings.get(float(g))
        if timing is None:  # a share the packer computes (1/3) against the key as written
            timing = next((t for k, t in self.timings.items() if math.isclose(k, g)), None)
        if timing is None:
            raise ProfileError(
                f"profile.seconds_per_unit: no timing for {g:g} GPUs per trial, which the plan "
                f"needs (the profile has {_counts(self.timings)})"
            )
        if instance is None or self.gpu is None or instance.gpu == self.gpu:
            return timing
        factor = self.gpu_speed.get(instance.gpu)
        if factor is None:
            raise ProfileError(
                f"profile.speed.{instance.gpu}: no timing for {instance.gpu} GPUs "
                f"(instance type {instance.name}); the profile was measured on {self.gpu}: "
                f"add its relative speed or measure it"
            )
        return Timing(timing.mean / factor, timing.sd / factor)

    def segment(
        self, g: float, resource: float, instance: GpuNode | None = None, first: bool = False
    ) -> tuple[float, float]:
        """Mean and sd in seconds of one segment training ``resource`` units on ``g`` GPUs;
        ``first``: the trial's first segment."""
        timing = self.timing(g, instance)
        work = resource * timing.mean
        sd = math.sqrt(resource * timing.sd**2 + (work * self.segment_cv) ** 2)
        return self.segment_overhead(first) + work, sd

    def segment_overhead(self, first: bool = False) -> float:
        """Seconds a segment spends outside its units, at any width; ``first``: the
        trial's first segment."""
        return self.overhead_s + (self.trial_overhead_s if first else 0.0)

    def units_per_hour(self, g: float, instance: GpuNode | None = None) -> float:
        """Resource one trial trains per hour on ``g`` GPUs: SEER's ``S(g)``."""
        return 3600.0 / self.timing(g, instance).mean

    # --- the packer's view ----------------------------------------------------------------

    @property
    def packable(self) -> bool:
        """Whether the packer can use the profile: it times one whole GPU, which the speeds
        of the other widths are relative to."""
        return 1.0 in self.timings

    def check_packable(self) -> None:
        """Raise :class:`ProfileError` unless the profile is :attr:`packable`."""
        if not self.packable:
            raise ProfileError(
                "profile.seconds_per_unit: packing needs the time on 1 GPU, which the other "
                f"widths' speedups are relative to (the profile has {self.gpu_counts})"
            )

    @cached_property
    def speedup(self) -> dict[int, float]:
        """``S(g) = t(1)/t(g)`` for every whole GPU count ``g`` the profile times."""
        self.check_packable()
        one = self.timings[1.0].mean
        return {int(g): one / t.mean for g, t in self.timings.items() if g.is_integer()}

    @cached_property
    def sharing(self) -> dict[int, float]:
        """``sigma(c) = t(1)/t(1/c)`` for ``c`` trials sharing one GPU. Sharing timings that
        claim a trial runs faster when more share its GPU are left out, all of them: the
        packer cannot trust them."""
        self.check_packable()
        one = self.timings[1.0].mean
        sharing: dict[int, float] = {}
        previous = 1.0
        for g, t in sorted(self.timings.items(), reverse=True):  # 1/2, 1/3, ...: c ascending
            c = round(1 / g)
            if g < 1 and c >= 2 and math.isclose(g * c, 1.0):
                sigma = one / t.mean
                if not 0 < sigma <= previous:
                    return {}
                sharing[c] = previous = sigma
        return sharing

    def speed(self, width: Fraction) -> float:
        """Training speed at the packer's ``width`` (a whole count or ``1/c``), relative to
        one whole GPU."""
        if width >= 1:
            return self.speedup[int(width)]
        return self.sharing[width.denominator]
