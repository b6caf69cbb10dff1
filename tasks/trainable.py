"""The user's trainable: imported once per process, by its ``module:function`` reference.

The driver imports it when the job starts (an import error is bad input, exit 2, before
anything is created), and every worker process when it first trains a segment; later
calls are answered from a cache keyed by the reference.

Example:
    >>> train = load_trainable("tests.trainables:quadratic")
    >>> load_trainable("tests.trainables:quadratic") is train, supports_distributed(train)
    (True, False)
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from elastune.planners.spec import SpecError
from elastune.tasks.context import TrialContext

Trainable = Callable[[dict[str, Any], TrialContext], Any]


class TrainableError(SpecError):
    """The trainable cannot be imported or called as ``(config, ctx)``."""


@functools.cache
def load_trainable(reference: str) -> Trainable:
    """Import ``module:function``; a failure names the ``trainable`` field (and is not
    cached: a later call tries again)."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TrainableError(f"trainable: cannot import {module_name} ({exc})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise TrainableError(f"trainable: {module_name} has no function {attribute}")
    try:
        inspect.signature(function).bind({}, None)
    except TypeError:
        raise TrainableError(f"trainable: {reference} must take (config, ctx)") from None
    return function


def supports_distributed(trainable: Trainable) -> bool:
    """Does the trainable train data-parallel when given several processes? It says so with
    an attribute, set once it wraps its model with ``ctx.wrap`` and shards its batches with
    ``ctx.batches`` (see ``examples/digits.py``)::

        def train(config, ctx): ...
        train.distributed = True
    """
    return getattr(trainable, "distributed", False) is True
