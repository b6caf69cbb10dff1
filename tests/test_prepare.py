"""A job is prepared once on its way from ``elastune run`` to its first segment: its
trainable loaded once, its stores checked once, the pool named once."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import elastune.flows.pools
import elastune.flows.prepare
import elastune.tasks.trainable
from elastune.flows.cli import main
from elastune.flows.pools import LocalPool, WorkPool, pool_of
from elastune.planners.spec import parse_job
from tests.helpers.jobs import JOB


def counted(calls: Counter[str], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return function(*args, **kwargs)

    return counting


@pytest.mark.slow
def test_a_run_loads_its_trainable_and_checks_its_stores_once(
    tmp_path: Path, stores: list[str], capsys, monkeypatch
) -> None:
    calls: Counter[str] = Counter()
    load = counted(calls, "load_trainable", elastune.tasks.trainable.load_trainable)
    monkeypatch.setattr(elastune.tasks.trainable, "load_trainable", load)
    monkeypatch.setattr(elastune.flows.prepare, "load_trainable", load)
    checks = counted(calls, "check_stores", elastune.flows.prepare.check_stores)
    monkeypatch.setattr(elastune.flows.prepare, "check_stores", checks)
    pools = counted(calls, "pool_of", elastune.flows.pools.pool_of)
    monkeypatch.setattr(elastune.flows.prepare, "pool_of", pools)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    assert main(["run", str(path), "--json", *stores]) == 0
    assert json.loads(capsys.readouterr().out)["segments"] > 1
    assert calls == {"load_trainable": 1, "check_stores": 1, "pool_of": 1}


def test_compute_pool_names_this_machine_or_a_work_pool() -> None:
    spec = parse_job({**JOB, "compute": {"workers": 3}})
    local = pool_of(spec)
    assert isinstance(local, LocalPool) and local.open() is local
    assert local.backend.size("b0-r0", slots=3) == []  # nothing to size on this machine
    pooled = pool_of(parse_job({**JOB, "compute": {"pool": "gpu-warm"}}))
    assert isinstance(pooled, WorkPool) and pooled.name == "gpu-warm"
    assert pooled.devices is None  # a node's devices are its own worker's
