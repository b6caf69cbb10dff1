"""Every cost-planner module's docstring example runs and prints what it says."""

import doctest
import importlib
import pkgutil

import pytest

import planners.cost

MODULES = [
    "planners.cost",  # the package face
    *sorted(m.name for m in pkgutil.iter_modules(planners.cost.__path__, "planners.cost.")),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
