"""Every module's docstring examples run and print what they say: each of elastune's, by
its import name, and each example's. Every cost-planner module has one."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import elastune
import examples

# The subpackages one by one: in an editable install each is a folder of the repository,
# not of elastune/'s.
PACKAGES = [importlib.import_module(f"elastune.{name}") for name in elastune.SUBPACKAGES]
MODULES = sorted(
    ["elastune", *(package.__name__ for package in PACKAGES)]
    + [m.name for p in PACKAGES for m in pkgutil.walk_packages(p.__path__, f"{p.__name__}.")]
    + [m.name for m in pkgutil.iter_modules(examples.__path__, "examples.")]
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0
    if name.startswith("elastune.planners.cost"):
        assert result.attempted > 0


def test_the_walk_finds_every_package_folder() -> None:
    assert {
        "elastune.flows.cli",
        "elastune.planners.cost.planning.rubberband",
        "examples.digits",
    } <= set(MODULES)
