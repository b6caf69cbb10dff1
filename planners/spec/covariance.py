"""A covariance matrix in a job file: ``profile.calibration_cov`` (4 x 4, the calibration's
errors in ``job_overhead_s``, ``overhead_s``, ``trial_overhead_s`` and ``seconds_per_unit``,
the last relative; docs/job-file.md).

Example:
    >>> covariance_problem([[1.0, 0.5], [0.5, 1.0]])
    >>> covariance_problem([[1.0, 2.0], [2.0, 1.0]])
    'must be a covariance (no negative variance along any direction), its lowest eigenvalue is -1'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np
from pydantic import AfterValidator, Field

SIZE = 4  # job_overhead_s, overhead_s, trial_overhead_s, seconds_per_unit (relative)


def covariance_problem(cov: Sequence[Sequence[float]]) -> str | None:
    """What makes ``cov`` no covariance matrix (square, symmetric, no negative variance
    along any direction, up to the rounding of a YAML file), or None."""
    if any(len(row) != len(cov) for row in cov):
        return f"must be square, got rows of {[len(row) for row in cov]}"
    matrix = np.array(cov, dtype=float)
    if not np.allclose(matrix, matrix.T, rtol=1e-3, atol=1e-12):
        return f"must be symmetric, got {matrix.tolist()}"
    lowest = float(np.linalg.eigvalsh(matrix).min())
    if lowest < -1e-3 * max(float(np.trace(np.abs(matrix))), 1e-12):
        return (
            "must be a covariance (no negative variance along any direction), "
            f"its lowest eigenvalue is {lowest:.3g}"
        )
    return None


def _checked(cov: list[list[float]]) -> list[list[float]]:
    problem = covariance_problem(cov)
    if problem is not None:
        raise ValueError(problem)
    return cov


Covariance = Annotated[
    list[Annotated[list[float], Field(min_length=SIZE, max_length=SIZE)]],
    Field(min_length=SIZE, max_length=SIZE),
    AfterValidator(_checked),
]
