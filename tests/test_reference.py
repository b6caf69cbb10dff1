"""The reference pages hold to the code they describe: docs/trainable.md lists every public
member of the trainable's ``ctx`` (``elastune.TrialContext``) with its signature, and
docs/cli.md's "From Python" every name ``import elastune`` gives, each function with its
parameters and defaults. A member gained, lost or changed fails here until the page follows.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import elastune
from elastune.tasks.context import TrialContext

ROOT = Path(__file__).resolve().parent.parent
TRAINABLE = ROOT / "docs" / "trainable.md"
CLI = ROOT / "docs" / "cli.md"
# A method's heading on the page: ### `ctx.name(parameters) -> returns`
METHOD = re.compile(r"^#{3,4} `ctx\.(\w+)\((.*)\) -> (.+)`$", re.M)
# An attribute's row in the page's table: | `ctx.name` | ...
ATTRIBUTE = re.compile(r"^\| `ctx\.(\w+)` \|", re.M)


def annotation(value: Any) -> str:
    """An annotation as the source writes it (the module postpones its annotations)."""
    return value if isinstance(value, str) else inspect.formatannotation(value)


def parameters(function: Callable[..., Any], *, annotated: bool) -> str:
    """``function``'s parameters as a page writes them: ``self`` left out, ``*`` before
    keyword-only ones, annotations when ``annotated``."""
    out, starred = [], False
    for p in inspect.signature(function).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not starred:
            out.append("*")
            starred = True
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        starred = starred or p.kind is p.VAR_POSITIONAL
        if annotated and p.annotation is not p.empty:
            text += f": {annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if annotated else f"={p.default!r}"
        out.append(text)
    return ", ".join(out)


def public_methods() -> dict[str, str]:
    """Each public method of TrialContext: its documented heading's ``(params) -> returns``."""
    found = {}
    for name, member in vars(TrialContext).items():
        if name.startswith("_") or isinstance(member, property) or not callable(member):
            continue
        returns = annotation(inspect.signature(member).return_annotation)
        found[name] = f"({parameters(member, annotated=True)}) -> {returns}"
    return found


def public_attributes() -> set[str]:
    """What a trainable reads off ``ctx``: the instance's attributes and the properties."""
    ctx = TrialContext(trial=0, start=0, stop=1, max_resource=1, run_id="", tracker=None)  # type: ignore[arg-type]
    properties = {n for n, m in vars(TrialContext).items() if isinstance(m, property)}
    return {n for n in vars(ctx) if not n.startswith("_")} | properties


def test_trial_context_page_lists_every_method_with_its_signature() -> None:
    page = TRAINABLE.read_text()
    documented = {
        name: f"({params}) -> {returns}" for name, params, returns in METHOD.findall(page)
    }
    actual = public_methods()
    assert actual, "TrialContext has no public methods: the reader of its class broke"
    missing = sorted(set(actual) - set(documented))
    gone = sorted(set(documented) - set(actual))
    changed = [
        f"ctx.{name}{documented[name]} is ctx.{name}{actual[name]} in the code"
        for name in sorted(set(actual) & set(documented))
        if documented[name] != actual[name]
    ]
    assert not (missing or gone or changed), (
        f"docs/trainable.md: methods not documented {missing}, documented but gone {gone}, "
        f"signatures changed {changed}"
    )


def test_trial_context_page_lists_every_attribute() -> None:
    documented = set(ATTRIBUTE.findall(TRAINABLE.read_text()))
    actual = public_attributes()
    assert {"trial", "device", "distributed"} <= actual
    assert documented == actual, (
        f"docs/trainable.md: attributes not documented {sorted(actual - documented)}, "
        f"documented but gone {sorted(documented - actual)}"
    )


def from_python() -> str:
    """docs/cli.md's section "From Python"."""
    text = CLI.read_text()
    start = text.index("## From Python")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_python_api_section_names_everything_elastune_exports() -> None:
    section = from_python()
    missing = [name for name in elastune.__all__ if f"elastune.{name}" not in section]
    assert not missing, f'docs/cli.md "From Python" does not name {missing}'


FUNCTIONS = [name for name in elastune.__all__ if inspect.isfunction(getattr(elastune, name))]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_python_api_section_shows_each_functions_parameters(name: str) -> None:
    """The call as the page writes it, ``elastune.plan(job, overrides=(), *, ...)``, has the
    function's parameters in order, each with its default."""
    calls = re.findall(rf"`elastune\.{name}\(([^`]*)\)`", from_python())
    assert calls, f'docs/cli.md "From Python" shows no call of elastune.{name}(...)'
    written = ast.parse(f"def f({calls[0]}): pass").body[0].args  # type: ignore[attr-defined]
    shown = [a.arg for a in written.posonlyargs + written.args]
    defaults = [ast.literal_eval(d) for d in written.defaults]
    keyword = {a.arg: d for a, d in zip(written.kwonlyargs, written.kw_defaults, strict=True)}
    page = ", ".join(
        [*shown[: len(shown) - len(defaults)]]
        + [f"{a}={d!r}" for a, d in zip(shown[len(shown) - len(defaults) :], defaults, strict=True)]
        + (["*"] if keyword else [])
        + [f"{a}={ast.literal_eval(d)!r}" if d else a for a, d in keyword.items()]
    )
    actual = parameters(getattr(elastune, name), annotated=False)
    assert page == actual, f"docs/cli.md shows elastune.{name}({page}); the code has ({actual})"
