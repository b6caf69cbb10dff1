"""The job file: a pydantic model of ARCHITECTURE.md §4, loaded and validated once.

Every user mistake surfaces as :class:`SpecError`, one line naming the field, so the CLI
can print it and exit with code 2 before anything is created in MLflow or Optuna.

Example:
    >>> spec = JobSpec.model_validate({
    ...     "name": "demo", "trainable": "examples.digits:train", "metric": "val_accuracy",
    ...     "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}},
    ... })
    >>> spec.scheduler.name, spec.scheduler.eta, spec.mode
    ('sha', 3, 'max')
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from planners.geometry import floor_log


class SpecError(ValueError):
    """A mistake in the job file or its overrides; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- search space -------------------------------------------------------------------------


class FloatParam(_Strict):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> FloatParam:
        _check_bounds(self.low, self.high, self.log)
        if self.log and self.step is not None:
            raise ValueError("log and step cannot be used together")
        return self


class IntParam(_Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> IntParam:
        _check_bounds(self.low, self.high, self.log)
        if self.log and self.step != 1:
            raise ValueError("log and step cannot be used together")
        return self


class CategoricalParam(_Strict):
    type: Literal["categorical"]
    choices: list[str | int | float | bool] = Field(min_length=1)


def _check_bounds(low: float, high: float, log: bool) -> None:
    if low > high:
        raise ValueError(f"low ({low}) must not exceed high ({high})")
    if log and low <= 0:
        raise ValueError(f"low must be > 0 on a log scale, got {low}")


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


# --- sampler and scheduler ----------------------------------------------------------------

SAMPLERS = ("tpe", "random", "cmaes", "gp", "qmc", "grid")


class SamplerSpec(BaseModel):
    """An Optuna sampler by name; any further key is passed to its constructor."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: Literal[SAMPLERS] = "tpe"  # type: ignore[valid-type]
    seed: int | None = 0

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class _Ladder(_Strict):
    eta: int = Field(default=3, ge=2)
    min_resource: float = Field(default=1, gt=0)
    max_resource: float = Field(default=27, gt=0)

    @model_validator(mode="after")
    def _ladder(self) -> _Ladder:
        if self.min_resource > self.max_resource:
            raise ValueError(
                f"min_resource ({self.min_resource}) must not exceed "
                f"max_resource ({self.max_resource})"
            )
        return self


class ShaSpec(_Ladder):
    """Synchronous successive halving: one bracket of ``max_trials`` configurations."""

    name: Literal["sha"] = "sha"
    max_trials: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _top_rung(self) -> ShaSpec:
        promotions = floor_log(self.max_resource / self.min_resource, self.eta)
        if self.max_trials is not None and self.max_trials < self.eta**promotions:
            raise ValueError(
                f"max_trials must be at least eta**{promotions} = {self.eta**promotions} "
                f"so that one trial reaches max_resource, got {self.max_trials}"
            )
        return self


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
        ladder = [info.data.get(k) for k in ("eta", "min_resource", "max_resource")]
        if None in ladder or ladder[1] > ladder[2]:
            return value  # the ladder itself is invalid; that error is reported instead
        eta, low, high = ladder
        rungs = floor_log(high / low, eta) + 1
        if value > rungs:
            raise ValueError(
                f"{value} brackets but the ladder {low:g}..{high:g} at eta={eta} has only "
                f"{rungs} rungs (at most one bracket per rung)"
            )
        return value


class FifoSpec(_Strict):
    """Random search in arrival order: every trial trains straight to ``max_resource``."""

    name: Literal["random", "fifo"]
    max_resource: float = Field(default=27, gt=0)
    max_trials: int | None = Field(default=81, ge=1)


class MedianSpec(_Strict):
    """Median stopping rule (§7.2): segments of ``interval`` (default ``min_resource``)."""

    name: Literal["median"]
    min_resource: float = Field(default=1, gt=0)
    max_resource: float = Field(default=27, gt=0)
    interval: float | None = Field(default=None, gt=0)
    grace_period: float | None = Field(default=None, ge=0)
    min_samples_required: int = Field(default=3, ge=1)
    max_trials: int | None = Field(default=81, ge=1)

    @model_validator(mode="after")
    def _range(self) -> MedianSpec:
        if self.min_resource > self.max_resource:
            raise ValueError(
                f"min_resource ({self.min_resource}) must not exceed "
                f"max_resource ({self.max_resource})"
            )
        return self


class PbtSpec(_Strict):
    """Population-based training (§7.3), asynchronous; needs checkpoints to copy."""

    name: Literal["pbt"]
    max_resource: float = Field(default=27, gt=0)
    perturbation_interval: float = Field(default=3, gt=0)
    population_size: int = Field(default=8, ge=2)
    quantile_fraction: float = Field(default=0.25, gt=0, le=0.5)
    resample_probability: float = Field(default=0.25, ge=0, le=1)

    @model_validator(mode="after")
    def _interval(self) -> PbtSpec:
        if self.perturbation_interval > self.max_resource:
            raise ValueError(
                f"perturbation_interval ({self.perturbation_interval}) must not exceed "
                f"max_resource ({self.max_resource})"
            )
        return self


SchedulerSpec = Annotated[
    ShaSpec | HyperbandSpec | AshaSpec | FifoSpec | MedianSpec | PbtSpec,
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
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


class BudgetSpec(_Strict):
    deadline: float | None = None
    max_cost_usd: float | None = Field(default=None, gt=0)

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)


class ComputeSpec(_Strict):
    pool: str = "local"
    workers: int = Field(default=2, ge=1)
    instance_types: list[str] = Field(default_factory=list)
    max_gpus: int | None = Field(default=None, ge=1)


class TrackingSpec(_Strict):
    mlflow_uri: str = "sqlite:///.elastune/mlflow.db"
    experiment: str | None = None
    optuna_storage: str = "sqlite:///.elastune/optuna.db"


# --- the job ------------------------------------------------------------------------------


class JobSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    trainable: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    metric: str = Field(min_length=1)
    mode: Literal["min", "max"] = "max"
    space: dict[str, Param] = Field(min_length=1)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    scheduler: SchedulerSpec = Field(default_factory=ShaSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    compute: ComputeSpec = Field(default_factory=ComputeSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name

    def loss(self, value: float) -> float:
        """The minimised quantity for a reported metric value."""
        return -value if self.mode == "max" else value


# --- loading ------------------------------------------------------------------------------


def _format_error(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    # Drop pydantic's union tags ("float", "sha") so the path reads like the YAML.
    tags = {"float", "int", "categorical", "sha", "hyperband", "function-after"}
    tags |= {"asha", "random", "fifo", "median", "pbt"}
    path = ".".join(str(p) for p in first["loc"] if str(p) not in tags) or "<root>"
    message = first["msg"].removeprefix("Value error, ")
    return f"{source}: {path}: {message}"


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set a.b.c=value``; the value is parsed as YAML (``3``, ``true``, ``[1,2]``)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set {assignment}: expected KEY=VALUE, e.g. scheduler.eta=4")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {assignment}: {part} is not a section")
        node = child
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise SpecError(f"--set {assignment}: value is not valid YAML ({exc})") from None


def parse_job(data: Any, source: str = "job") -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_error(exc, source)) from None
    from planners.space import check_sampler  # local: keeps optuna out of plain parsing

    check_sampler(spec)
    return spec


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Read, override and validate a job file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read job file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path}: malformed YAML{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    for assignment in overrides:
        apply_override(data, assignment)
    return parse_job(data, str(path))
