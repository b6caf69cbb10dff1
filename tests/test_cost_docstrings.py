"""Every cost-planner module's docstring example runs and prints what it says."""

import doctest
import importlib
import pkgutil

import pytest

import planners.cost

MODULES = sorted(m.name for m in pkgutil.iter_modules(planners.cost.__path__, "planners.cost."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    assert doctest.testmod(importlib.import_module(name)).failed == 0
