"""The price catalog: GPU instance types, their prices, billing and provisioning delays.

The default catalog is ``planners/data/catalog.yaml`` (AWS us-east-1 on-demand list prices,
with the date they were read). Users pass their own as YAML text or a mapping; every mistake
is a :class:`~elastune.planners.spec.SpecError` naming the field. :func:`read_catalog` is the only
function here that touches a file.

Example:
    >>> catalog = parse_catalog({
    ...     "defaults": {"startup": {"mean_s": 180}},
    ...     "instance_types": {"p3.8xlarge": {"gpus": 4, "gpu": "V100", "price_per_hour": 12.24}},
    ... })
    >>> node = catalog.get("p3.8xlarge")
    >>> node.gpus, node.price_per_gpu_hour, node.startup.mean_s, node.billing.min_charge_s
    (4, 3.06, 180.0, 60.0)
    >>> spot = parse_catalog({"instance_types": {"g5.xlarge": {"gpus": 1, "gpu": "A10G",
    ...     "price_per_hour": 1.0, "spot": {"discount": 0.6, "interruptions_per_hour": 0.5}}}})
    >>> spot.get("g5.xlarge").price("spot"), spot.get("g5.xlarge").interruptions_per_second("spot")
    (0.4, 0.0001388888888888889)
    >>> parse_catalog({"instance_types": {}})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    elastune.planners.spec.model.SpecError: catalog: instance_types: the catalog lists no ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from numpy.typing import NDArray
from pydantic import Field, ValidationError, field_validator

from elastune.planners.cost.pricing.billing import BillingRule
from elastune.planners.spec import SpecError
from elastune.planners.spec.load import format_error
from elastune.planners.spec.model import StrictModel


class Delay(StrictModel):
    """A non-negative random delay, log-normal with this mean and sd (sd 0: fixed)."""

    mean_s: float = Field(default=0.0, ge=0)
    sd_s: float = Field(default=0.0, ge=0)

    def sample(self, z: NDArray[np.float64]) -> NDArray[np.float64]:
        """Delays for standard-normal draws ``z`` (common random numbers stay common)."""
        if self.mean_s == 0 or self.sd_s == 0:
            return np.full(np.shape(z), self.mean_s)
        sigma2 = math.log1p((self.sd_s / self.mean_s) ** 2)
        mu = math.log(self.mean_s) - sigma2 / 2
        return np.exp(mu + math.sqrt(sigma2) * z)


MARKETS = ("on-demand", "spot")


class Spot(StrictModel):
    """Spot market figures: the price is ``(1 - discount)`` of the on-demand price, and a
    running instance is interrupted as a Poisson process at ``interruptions_per_hour``."""

    discount: float = Field(gt=0, lt=1)
    interruptions_per_hour: float = Field(ge=0)


class InstanceType(StrictModel):
    """One instance type: ``gpus`` GPUs of model ``gpu`` per node, at ``price_per_hour``."""

    name: str
    gpus: int = Field(gt=0)
    gpu: str = Field(min_length=1)
    gpu_memory_gib: float | None = Field(default=None, gt=0)
    vcpus: int | None = Field(default=None, gt=0)
    price_per_hour: float = Field(gt=0)
    billing: BillingRule = Field(default_factory=BillingRule)
    startup: Delay = Field(default_factory=Delay)
    queueing: Delay = Field(default_factory=Delay)
    spot: Spot | None = None

    @property
    def price_per_gpu_hour(self) -> float:
        return self.price_per_hour / self.gpus

    def price(self, market: str = "on-demand") -> float:
        """Dollars per node-hour on ``market`` (``on-demand`` or ``spot``)."""
        if market == "on-demand":
            return self.price_per_hour
        if market != "spot":
            raise ValueError(f"market must be one of {MARKETS}, got {market!r}")
        if self.spot is None:
            raise ValueError(f"{self.name} has no spot prices in the catalog")
        return self.price_per_hour * (1 - self.spot.discount)

    def interruptions_per_second(self, market: str = "on-demand") -> float:
        """Rate at which one running node is interrupted on ``market`` (0 on-demand)."""
        if market == "spot" and self.spot is not None:
            return self.spot.interruptions_per_hour / 3600
        return 0.0


class Catalog(StrictModel):
    """Instance types by name, with where and when their prices were read."""

    region: str = "unspecified"
    prices_read: str = "unspecified"
    source: str = "user catalog"
    instance_types: dict[str, InstanceType]

    @field_validator("instance_types")
    @classmethod
    def _not_empty(cls, value: dict[str, InstanceType]) -> dict[str, InstanceType]:
        if not value:
            raise ValueError("the catalog lists no instance types")
        return value

    def get(self, name: str, field: str = "compute.instance_types") -> InstanceType:
        """The instance type ``name``; a :class:`SpecError` naming ``field`` if unknown."""
        try:
            return self.instance_types[name]
        except KeyError:
            known = ", ".join(sorted(self.instance_types))
            raise SpecError(
                f"{field}: unknown instance type {name!r} (the catalog has: {known})"
            ) from None

    def select(
        self, names: Sequence[str], field: str = "compute.instance_types"
    ) -> list[InstanceType]:
        """The named types in order, each checked; the message names the list entry."""
        return [self.get(name, f"{field}[{i}]") for i, name in enumerate(names)]


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, one level deep into sections (a type may override one billing key)."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def parse_catalog(data: str | Mapping[str, Any], source: str = "catalog") -> Catalog:
    """A validated catalog from YAML text or a mapping; ``defaults`` fill every type."""
    if isinstance(data, str):
        try:
            data = yaml.safe_load(data)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise SpecError(f"{source}: malformed YAML{where}") from None
    if not isinstance(data, Mapping):
        raise SpecError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    fields = dict(data)
    defaults = fields.pop("defaults", None) or {}
    types = fields.get("instance_types")
    if not isinstance(defaults, Mapping):
        raise SpecError(f"{source}: defaults: expected a mapping of instance-type fields")
    if isinstance(types, Mapping):
        fields["instance_types"] = {
            name: {**_merge(defaults, spec), "name": name} if isinstance(spec, Mapping) else spec
            for name, spec in types.items()
        }
    try:
        return Catalog.model_validate(fields)
    except ValidationError as exc:
        raise SpecError(format_error(exc, source, Catalog)) from None


def read_catalog(path: str | Path | None = None) -> Catalog:
    """The catalog at ``path``, or elastune's default one. The only file read of planners/cost."""
    if path is None:
        text = resources.files("elastune.planners").joinpath("data", "catalog.yaml").read_text()
        return parse_catalog(text, "planners/data/catalog.yaml")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read catalog ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a catalog (not UTF-8 text)") from None
    return parse_catalog(text, str(path))
