"""The job file as a pydantic model (docs/architecture.md §4), validated once.

Every user mistake surfaces as :class:`SpecError`, one line naming the field, so the CLI
can print it and exit with code 2 before anything is created in MLflow or Optuna
(:mod:`elastune.planners.spec.load` reads the file and applies ``--set`` overrides).

Example:
    >>> spec = JobSpec.model_validate({
    ...     "name": "demo", "trainable": "examples.digits:train", "metric": "val_accuracy",
    ...     "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}},
    ... })
    >>> spec.scheduler.name, spec.sampler.name, spec.scheduler.eta, spec.mode
    ('bloom', 'mf-tpe', 3, 'max')
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    ValidationInfo,
    field_validator,
    model_validator,
)

from elastune.planners.spec.covariance import Covariance
from elastune.planners.spec.geometry import floor_log


class SpecError(ValueError):
    """A mistake in the job file or its overrides; the message names the field."""


class StrictModel(BaseModel):
    """A frozen model that refuses unknown fields: the job file's sections and the
    catalog's entries, so that a misspelt key is an error naming it. No number may be
    infinite or NaN (a rung ladder up to ``.inf`` would never end)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --- search space -------------------------------------------------------------------------


class _Range(StrictModel):
    """Cross-field checks of numeric ranges. They are field validators (fields validate in
    declaration order, so ``low`` is known when ``high`` is checked): the error's location
    names the offending field, e.g. ``space.lr.high``."""

    @field_validator("high", check_fields=False)
    @classmethod
    def _high(cls, high: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and low > high:
            raise ValueError(f"high ({high}) must not be below low ({low})")
        if low is not None and low == high:
            raise ValueError(
                f"high equals low ({low}): every trial would get the same value; to fix "
                f"it, use {{type: categorical, choices: [{low}]}}"
            )
        return high

    @field_validator("log", check_fields=False)
    @classmethod
    def _log(cls, log: bool, info: ValidationInfo) -> bool:
        low = info.data.get("low")
        if log and low is not None and low <= 0:
            raise ValueError(f"a log scale needs low > 0, got low = {low}")
        return log

    @field_validator("step", check_fields=False)
    @classmethod
    def _step(cls, step: float | None, info: ValidationInfo) -> float | None:
        if info.data.get("log") and step != cls.model_fields["step"].default:
            raise ValueError("log and step cannot be used together")
        return step


class FloatParam(_Range):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)


class IntParam(_Range):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(default=1, ge=1)


class CategoricalParam(StrictModel):
    type: Literal["categorical"]
    choices: list[str | int | float | bool] = Field(min_length=1)


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


# --- sampler and scheduler ----------------------------------------------------------------

SAMPLERS = ("mf-tpe", "tpe", "random", "cmaes", "gp", "qmc", "grid")


class SamplerSpec(BaseModel):
    """An Optuna sampler by name; any further key is passed to its constructor."""

    model_config = ConfigDict(extra="allow", frozen=True)

    # mf-tpe (planners/samplers/mftpe.py): TPE that learns from every rung, paired with bloom.
    name: Literal[SAMPLERS] = "mf-tpe"  # type: ignore[valid-type]
    seed: int | None = 0

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class _Ladder(StrictModel):
    eta: int = Field(default=3, ge=2)
    min_resource: float = Field(default=1, gt=0)
    # validate_default: min_resource above the default max_resource must be caught too.
    max_resource: float = Field(default=27, gt=0, validate_default=True)

    @field_validator("max_resource")
    @classmethod
    def _ladder(cls, max_resource: float, info: ValidationInfo) -> float:
        low = info.data.get("min_resource")
        if low is not None and low > max_resource:
            raise ValueError(
                f"max_resource ({max_resource}) must not be below min_resource ({low})"
            )
        return max_resource


class ShaSpec(_Ladder):
    """Synchronous successive halving: one bracket of ``max_trials`` configurations."""

    name: Literal["sha"] = "sha"
    max_trials: int | None = Field(default=None, ge=1)

    @field_validator("max_trials")
    @classmethod
    def _top_rung(cls, max_trials: int | None, info: ValidationInfo) -> int | None:
        eta, low, high = (info.data.get(k) for k in ("eta", "min_resource", "max_resource"))
        if max_trials is None or None in (eta, low, high):
            return max_trials
        promotions = floor_log(high / low, eta)
        if max_trials < eta**promotions:
            raise ValueError(
                f"must be at least eta**{promotions} = {eta**promotions} "
                f"so that one trial reaches max_resource, got {max_trials}"
            )
        return max_trials


class HyperbandSpec(_Ladder):
    """Synchronous Hyperband: every bracket of §2.2, run as independent chains."""

    name: Literal["hyperband"]


class AshaSpec(_Ladder):
    """Asynchronous successive halving with promotion (§3); ``brackets > 1`` is asynchronous
    Hyperband over the ``brackets`` most aggressive rates (§3.4). ``max_trials: null`` starts
    new trials until the deadline."""

    name: Literal["asha"]
    max_trials: int | None = Field(default=81, ge=1)
    brackets: int = Field(default=1, ge=1)
    bootstrap_count: int = Field(default=0, ge=0)

    @field_validator("brackets")
    @classmethod
    def _brackets(cls, value: int, info: ValidationInfo) -> int:
        eta, low, high = (info.data.get(k) for k in ("eta", "min_resource", "max_resource"))
        if None in (eta, low, high):
            return value  # the ladder itself is invalid; that error is reported instead
        rungs = floor_log(high / low, eta) + 1
        if value > rungs:
            raise ValueError(
                f"{value} brackets but the ladder {low:g}..{high:g} at eta={eta} has only "
                f"{rungs} rungs (at most one bracket per rung)"
            )
        return value


class FifoSpec(StrictModel):
    """Random search in arrival order: every trial trains straight to ``max_resource``."""

    name: Literal["random", "fifo"]
    max_resource: float = Field(default=27, gt=0)
    max_trials: int | None = Field(default=81, ge=1)


class MedianSpec(StrictModel):
    """Median stopping rule (§7.2): segments of ``interval`` (default ``min_resource``)."""

    name: Literal["median"]
    min_resource: float = Field(default=1, gt=0)
    max_resource: float = Field(default=27, gt=0, validate_default=True)
    interval: float | None = Field(default=None, gt=0)
    grace_period: float | None = Field(default=None, ge=0)
    min_samples_required: int = Field(default=3, ge=1)
    max_trials: int | None = Field(default=81, ge=1)

    @field_validator("max_resource")
    @classmethod
    def _range(cls, max_resource: float, info: ValidationInfo) -> float:
        return _Ladder._ladder(max_resource, info)

    @field_validator("interval")
    @classmethod
    def _interval(cls, interval: float | None, info: ValidationInfo) -> float | None:
        high = info.data.get("max_resource")
        if interval is not None and high is not None and interval > high:
            raise ValueError(f"must not exceed max_resource ({high}), got {interval}")
        return interval


class PbtSpec(StrictModel):
    """Population-based training (§7.3), asynchronous; needs checkpoints to copy."""

    name: Literal["pbt"]
    max_resource: float = Field(default=27, gt=0)
    perturbation_interval: float = Field(default=3, gt=0)
    population_size: int = Field(default=8, ge=2)
    quantile_fraction: float = Field(default=0.25, gt=0, le=0.5)
    resample_probability: float = Field(default=0.25, ge=0, le=1)

    @field_validator("perturbation_interval")
    @classmethod
    def _interval(cls, interval: float, info: ValidationInfo) -> float:
        high = info.data.get("max_resource")
        if high is not None and interval > high:
            raise ValueError(f"must not exceed max_resource ({high}), got {interval}")
        return interval


class BloomSpec(_Ladder):
    """elastune's default: promotion-type ASHA with a late first cut (``promotions`` cuts at
    most: rungs at R/9, R/3, R by default), curve-aware ranking and revival of paused
    trials when the pool runs dry (``planners/search/schedulers/bloom.py``). Paired with the
    ``mf-tpe`` sampler it reached the target more often and ended with better models than
    random search, ASHA, Optuna's SuccessiveHalvingPruner and synchronous SHA on LCBench,
    though ASHA and Optuna's pruner reached 97% slightly sooner (docs/benchmarks.md, the
    default tuner)."""

    name: Literal["bloom"] = "bloom"
    max_trials: int | None = Field(default=81, ge=1)
    promotions: int = Field(default=2, ge=0)
    brackets: int = Field(default=1, ge=1)
    slope_weight: float = Field(default=0.25, ge=0)
    revive: bool = True

    @field_validator("brackets")
    @classmethod
    def _brackets(cls, value: int, info: ValidationInfo) -> int:
        eta, low, high = (info.data.get(k) for k in ("eta", "min_resource", "max_resource"))
        promotions = info.data.get("promotions")
        if None in (eta, low, high, promotions):
            return value  # an invalid field before this one is reported instead
        cuts = min(promotions, floor_log(high / low, eta))
        if value > cuts + 1:
            raise ValueError(
                f"{value} brackets but a trial can be cut at most {cuts} times here "
                f"(promotions={promotions}, ladder {low:g}..{high:g} at eta={eta}), "
                f"so at most {cuts + 1} brackets"
            )
        return value


SchedulerSpec = Annotated[
    ShaSpec | HyperbandSpec | AshaSpec | FifoSpec | MedianSpec | PbtSpec | BloomSpec,
    Field(discriminator="name"),
]


# --- budget, compute, tracking ------------------------------------------------------------

_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"^\s*(?:{_NUMBER}h)?\s*(?:{_NUMBER}m)?\s*(?:{_NUMBER}s)?\s*$")


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``90``, ``"45s"``, ``"30m"``, ``"2h"`` or ``"1h30m"``."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if not match or not any(match.groups()):
            raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 30m, 2h or 1h30m)")
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = 3600 * h + 60 * m + s
    if not 0 < seconds < math.inf:
        raise ValueError(f"duration must be positive and finite, got {value!r}")
    return seconds


class BudgetSpec(StrictModel):
    deadline: float | None = None
    max_cost_usd: float | None = Field(default=None, gt=0)

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)


class EcsSpec(StrictModel):
    """Where an ``ecs`` work pool's EC2 capacity comes from (docs/ecs.md)."""

    cluster: str = Field(min_length=1)
    capacity_providers: list[str] | None = None
    credentials: str | None = None  # a prefect-aws AwsCredentials block; else boto3's chain
    region: str | None = None


POOL_NAME_BANNED = "/%&><"  # characters Prefect refuses in a work pool's name
# The most segments one driver keeps in flight: a thread of its task runner each
# (flows/tune.py, flows/warm_pool.py). More workers would wait for a thread, unseen.
MAX_WORKERS = 512
# compute.pool naming this machine: each segment in a worker process of the driver.
LOCAL_POOL = "local"


class ComputeSpec(StrictModel):
    pool: str = LOCAL_POOL
    workers: int = Field(default=2, ge=1, le=MAX_WORKERS)
    # Catalog types, or ``[local]``: this machine (planners/cost/pricing/this_machine.py), also what
    # a job on the local pool without instance types is planned on.
    instance_types: list[str] = Field(default_factory=list)
    max_gpus: int | None = Field(default=None, ge=1)
    # What an hour of this machine costs (the ``local`` type); 0: it is free.
    price_per_hour: NonNegativeFloat = 0.0
    ecs: EcsSpec | None = None
    # Whether the cost planner may put stages on spot instances (discounted, interruptible).
    spot: bool = Field(default=False, strict=True)
    # A segment running longer is ended and its trial marked failed (hung trainables).
    segment_timeout: float | None = None
    # A segment whose width cannot run (the profile does not cover it, the pool is too
    # small, or the trainable is not data-parallel) runs on 1 GPU instead of failing the job.
    elastic_fallback: bool = False
    # Whether a staged job's stages are packed onto their GPUs by width (Fluid): auto packs
    # where the profile says it pays; on insists (bad input where it cannot); off never.
    packing: Literal["auto", "on", "off"] = "auto"

    @field_validator("pool")
    @classmethod
    def _pool(cls, pool: str) -> str:
        # Prefect's own rule for work pool names: checked here, before any server is asked.
        if not pool.strip() or set(pool) & set(POOL_NAME_BANNED):
            raise ValueError(
                f"{pool!r} is not a work pool name (not blank, none of {POOL_NAME_BANNED})"
            )
        return pool

    @field_validator("instance_types")
    @classmethod
    def _local_alone(cls, types: list[str]) -> list[str]:
        if "local" in types and len(types) > 1:
            raise ValueError(
                "local (this machine) cannot be mixed with catalog instance types: a job "
                "runs either here or on a cloud pool"
            )
        return types

    @field_validator("packing", mode="before")
    @classmethod
    def _packing(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare on/off as a boolean.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("segment_timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)


class TrackingSpec(StrictModel):
    mlflow_uri: str = "sqlite:///.elastune/mlflow.db"
    experiment: str | None = None
    optuna_storage: str = "sqlite:///.elastune/optuna.db"


class ProfileSpec(StrictModel):
    """Seconds per resource unit of one trial on ``g`` GPUs, for the cost planner.

    Either a measured table (``seconds_per_unit: {1: 720, 2: 400, 4: 225}``) or the time
    on one GPU plus a scaling model: an explicit speedup table ``speedup: {2: 1.8, 4: 3.2}``
    (``S(g) = t(1)/t(g)``) or Amdahl's ``serial_fraction`` over ``gpus``. Counts below 1
    are GPU shares (0.5: two trials per GPU).
    """

    seconds_per_unit: dict[PositiveFloat, PositiveFloat] = Field(min_length=1)
    # Spread per resource unit, independent between units (a segment's sd grows as sqrt):
    # absolute per count, or relative to the mean for counts not listed.
    sd_per_unit: dict[PositiveFloat, NonNegativeFloat] = Field(default_factory=dict)
    unit_cv: NonNegativeFloat = 0.0
    # Spread of a whole segment relative to its mean (a slow node stays slow): stragglers.
    segment_cv: NonNegativeFloat = 0.0
    overhead_s: NonNegativeFloat = 0.0  # per segment: dispatch, restore and save a checkpoint
    # More on a trial's first segment: the sampler's proposal, the trial's MLflow run.
    trial_overhead_s: NonNegativeFloat = 0.0
    # Per job, outside its segments: its runs and study created, its best model registered.
    job_overhead_s: NonNegativeFloat = 0.0
    # Of job_overhead_s, what comes after the last segment (its best model registered).
    job_tail_s: NonNegativeFloat = 0.0
    # Run-to-run spread of a job's wall outside its units (start, server, dispatch jitter).
    job_overhead_sd: NonNegativeFloat = 0.0
    # Run-to-run spread of the segments' speed, relative: a run the machine slows as a whole.
    run_cv: NonNegativeFloat = 0.0
    calibration_cov: Covariance | None = None  # how far the calibration may be off
    calibration_dof: PositiveFloat | None = None  # the spreads' degrees of freedom
    segment_cv_dof: PositiveFloat | None = None  # segment_cv's degrees of freedom
    speedup: dict[PositiveFloat, PositiveFloat] | None = None
    serial_fraction: float | None = Field(default=None, ge=0, lt=1)
    gpus: list[PositiveFloat] = Field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0], min_length=1)
    gpu: str | None = None  # GPU model the timings are for; None: any
    speed: dict[str, PositiveFloat] = Field(default_factory=dict)  # other models vs ``gpu``

    @model_validator(mode="after")
    def _consistent(self) -> ProfileSpec:
        for g in self.sd_per_unit:
            if g not in self.seconds_per_unit:
                raise ValueError(f"sd_per_unit: {g:g} GPUs has no entry in seconds_per_unit")
        if self.speedup is not None and self.serial_fraction is not None:
            raise ValueError("give either speedup or serial_fraction, not both")
        if (self.speedup is not None or self.serial_fraction is not None) and set(
            self.seconds_per_unit
        ) != {1.0}:
            raise ValueError(
                "seconds_per_unit: with a scaling model give the time on 1 GPU only, e.g. {1: 720}"
            )
        if self.speed and self.gpu is None:
            raise ValueError("speed: name the GPU model the timings are for in profile.gpu")
        if self.job_tail_s > self.job_overhead_s:
            raise ValueError(
                f"job_tail_s: {self.job_tail_s:g} is part of job_overhead_s "
                f"({self.job_overhead_s:g}), so at most that"
            )
        return self


# --- the job ------------------------------------------------------------------------------


class JobSpec(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    trainable: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    metric: str = Field(min_length=1)
    mode: Literal["min", "max"] = "max"
    space: dict[str, Param] = Field(min_length=1)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    scheduler: SchedulerSpec = Field(default_factory=BloomSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    compute: ComputeSpec = Field(default_factory=ComputeSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    profile: ProfileSpec | None = None

    @field_validator("scheduler", mode="before")
    @classmethod
    def _default_scheduler(cls, value: Any) -> Any:
        # A scheduler section without a name sets options of the default scheduler.
        if isinstance(value, dict) and "name" not in value:
            return {"name": BloomSpec.model_fields["name"].default, **value}
        return value

    @field_validator("space")
    @classmethod
    def _space_varies(cls, space: dict[str, Any]) -> dict[str, Any]:
        fixed = [
            name
            for name, p in space.items()
            if isinstance(p, CategoricalParam) and len(set(map(repr, p.choices))) == 1
        ]
        if len(fixed) == len(space):
            raise ValueError(
                "every parameter has a single value, so every trial would train the same "
                "configuration; give at least one parameter a range or several choices"
            )
        return space

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name

    def loss(self, value: float) -> float:
        """The minimised quantity for a reported metric value."""
        return -value if self.mode == "max" else value
