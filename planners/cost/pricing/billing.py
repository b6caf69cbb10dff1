"""Billing rules of the cost model (docs/algorithms.md §5.2).

An instance alive for ``d`` seconds is billed ``max(min_charge, ceil(d / quantum) * quantum)``
seconds at its hourly price. The clock starts when the instance is requested (so startup
and queueing are paid for) or when it is running, as the catalog says.

Example:
    >>> per_second = BillingRule(quantum_s=1, min_charge_s=60)
    >>> [float(per_second.billed_seconds(d)) for d in (0.2, 59, 61.3, 1755)]
    [60.0, 60.0, 62.0, 1755.0]
    >>> hourly = BillingRule(quantum_s=3600, min_charge_s=3600)
    >>> float(hourly.billed_seconds(1200)), float(hourly.billed_seconds(3601))
    (3600.0, 7200.0)
    >>> round(float(per_second.charge(12.24, 1755)), 4)    # a p3.8xlarge for 29.25 min
    5.967
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

# Durations a float sum puts a hair above a whole quantum (1755.0000000002 s) must not pay
# for one more quantum; the slack is relative so it also holds for day-long jobs.
_SLACK = 1e-9


class BillingRule(BaseModel):
    """How one instance type is billed.

    Args:
        quantum_s: Billing granularity: 1 s for per-second billing, 3600 s for hourly.
        min_charge_s: Least billed time per instance (60 s on AWS per-second billing).
        starts: ``request``: billed from the request, startup included; ``running``:
            billed once the instance is ready.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    quantum_s: float = Field(default=1.0, gt=0)
    min_charge_s: float = Field(default=60.0, ge=0)
    starts: Literal["request", "running"] = "request"

    def billed_seconds(self, seconds: ArrayLike) -> NDArray[np.float64]:
        """Billed seconds for instances alive ``seconds`` each (any array shape)."""
        alive = np.asarray(seconds, dtype=float)
        if np.any(alive < 0):
            raise ValueError(f"seconds alive must not be negative, got {alive.min()}")
        quanta = alive / self.quantum_s
        if np.isfinite(quanta).all():
            whole = np.ceil(quanta - _SLACK * np.maximum(quanta, 1.0))
        else:  # an instance that is never released (a stage that never ends) costs inf
            with np.errstate(invalid="ignore"):
                whole = np.ceil(quanta - _SLACK * np.maximum(quanta, 1.0))
            whole = np.where(np.isinf(quanta), quanta, whole)
        return np.maximum(whole * self.quantum_s, self.min_charge_s)

    def charge(self, price_per_hour: float, seconds: ArrayLike) -> NDArray[np.float64]:
        """Dollars for instances at ``price_per_hour`` alive ``seconds`` each (0: a free
        machine, the local type by default)."""
        if price_per_hour < 0:
            raise ValueError(f"price_per_hour must not be negative, got {price_per_hour}")
        return price_per_hour / 3600.0 * self.billed_seconds(seconds)
