"""Loading a job: YAML text or a mapping in, ``--set`` overrides applied, a validated
:class:`~elastune.planners.spec.model.JobSpec` out, or one
:class:`~elastune.planners.spec.model.SpecError` line naming the field. The named sampler's options
are checked here too (:func:`elastune.planners.spec.space.check_sampler`), so a bad option fails
before a study exists.

Example:
    >>> data = {"name": "demo", "trainable": "examples.digits:train", "metric": "acc",
    ...         "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}}}
    >>> apply_override(data, "scheduler.eta=4")
    >>> parse_job(data).scheduler.eta
    4
    >>> parse_job({**data, "sampler": {"name": "tpe", "speed": 2}})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    elastune.planners.spec.model.SpecError: sampler.speed: not an option of TPESampler ...
"""

from __future__ import annotations

import difflib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from elastune.planners.spec.model import JobSpec, SpecError
from elastune.planners.spec.space import check_sampler


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
    except yaml.YAMLError:
        raise SpecError(f"--set {assignment}: value is not valid YAML") from None


def parse_job(data: Any, source: str = "job") -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_error(exc, source)) from None
    check_sampler(spec)
    return spec


def load_job(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Read, override and validate a job file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read job file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a job file (not UTF-8 text)") from None
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


def format_error(error: ValidationError, source: str, model: type[BaseModel] = JobSpec) -> str:
    """Pydantic's first error as one line naming the field's path in ``source`` (validated
    as ``model``); an unknown field is told the fields that are known there."""
    first = error.errors()[0]
    # Drop pydantic's union tags ("float", "sha") so the path reads like the YAML; the
    # key right under ``space`` is a parameter's name, whatever it is.
    tags = {"float", "int", "categorical", "sha", "hyperband", "function-after"}
    tags |= {"asha", "random", "fifo", "median", "pbt", "bloom"}
    loc = [str(p) for p in first["loc"]]
    kept = [p for i, p in enumerate(loc) if p not in tags or (i > 0 and loc[i - 1] == "space")]
    path = ".".join(kept) or "<root>"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = _unknown(loc, model)
    return f"{source}: {path}: {message}"


def _unknown(loc: list[str], model: type[BaseModel]) -> str:
    """What to say of the field at ``loc`` that ``model`` does not know: the nearest known
    name, else the known names."""
    known = _fields_at(loc[:-1], model)
    near = difflib.get_close_matches(loc[-1], known, n=1)
    if near:
        return f"not a field here; did you mean {near[0]}?"
    if not known:
        return "not a field here"
    where = " ".join(loc[:-1]) or "the job"
    return f"not a field of {where} (its fields: {', '.join(known)})"


def _fields_at(loc: list[str], model: type[BaseModel]) -> list[str]:
    """The field names of the model at pydantic's ``loc`` (union tags included) under
    ``model``; none where the path leads to no one model."""
    node: Any = model
    for part in loc:
        node = _step(node, part)
    models = _models(node)
    return list(models[0].model_fields) if len(models) == 1 else []


def _step(node: Any, part: str) -> Any:
    """Where ``part`` of a path leads from ``node`` (a type annotation; None: nowhere)."""
    bare = _bare(node)
    if get_origin(bare) is dict:
        return get_args(bare)[1]  # ``part`` is a key, as a parameter's name under ``space``
    models = _models(node)
    tagged = [m for m in models if part in _tags(m)]
    if tagged:  # a tagged union: ``part`` is the tag, the next part a field
        return tagged[0]
    field = models[0].model_fields.get(part) if len(models) == 1 else None
    return None if field is None else field.annotation


def _models(node: Any) -> list[type[BaseModel]]:
    """The models ``node`` stands for: itself, or the members of a union (``X | None``)."""
    bare = _bare(node)
    members = get_args(bare) if get_origin(bare) in (Union, UnionType) else (bare,)
    return [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]


def _bare(node: Any) -> Any:
    """``node`` without ``Annotated``'s metadata."""
    return get_args(node)[0] if get_origin(node) is Annotated else node


def _tags(model: type[BaseModel]) -> set[str]:
    """The values ``model``'s literal fields take: its tag in a tagged union."""
    fields = model.model_fields.values()
    return {
        str(v)
        for f in fields
        if get_origin(f.annotation) is Literal
        for v in get_args(f.annotation)
    }
