"""A warm pool's ECS cluster sized stage by stage against moto: up through the Auto Scaling
groups, down by draining idle nodes first, ready once a warm worker heartbeats from every
instance.

moto neither registers Auto Scaling instances with ECS nor runs a DAEMON service's tasks,
so :func:`join` does both, as the ECS agent and the scheduler would; the Prefect side (live,
busy and draining nodes) is a :class:`Nodes` here, and real in tests/test_ecs_warm.py and
tests/test_pool_mode.py.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import boto3
import pytest
import yaml
from prefect.artifacts import Artifact

import elastune.infra.ecs_warm
from elastune.flows.cli import main
from elastune.infra.backends import make_backend
from elastune.infra.ecs import EcsCapacity
from elastune.infra.ecs_warm import WarmCapacity, WarmServices
from elastune.infra.local_cluster import NodeProcess, create_warm_pool
from elastune.infra.prefect_pools import WorkPoolLimit
from elastune.infra.server import isolated_env, stop_group
from elastune.infra.sizing import CapacityError, Demand
from elastune.infra.warm_nodes import WARM_TYPE, Node
from tests.helpers.aws import (
    BIG,
    POOL,
    REGION,
    SMALL,
    WORKER,
    container_instances,
    desired,
    join,
    tasks_on,
)
from tests.helpers.jobs import POOL_JOB
from tests.helpers.prefect_server import segment_runs

pytestmark = pytest.mark.usefixtures("fast_moto")


class Nodes:
    """The Prefect side of the pool: nodes that heartbeat, nodes running a segment, nodes
    marked draining. A look at the busy nodes checks that ECS has drained none of them."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.busy: set[str] = set()
        self.draining: set[str] = set()

    def live_nodes(self, pool: str) -> list[Node]:
        assert pool == POOL
        return [Node(name, 4.0, 1) for name in sorted(self.live)]

    def mark(self, pool: str, nodes: set[str], draining: bool) -> None:
        assert pool == POOL and draining
        self.draining |= nodes

    def busy_nodes(self, nodes: set[str]) -> set[str]:
        drained = {
            task
            for c in container_instances().values()
            if c["status"] == "DRAINING"
            for task in tasks_on(c["containerInstanceArn"])
        }
        assert not drained & self.busy, "ECS drained a node that still runs a segment"
        return nodes & self.busy


@pytest.fixture
def nodes(monkeypatch, aws) -> Nodes:
    fake = Nodes()
    monkeypatch.setattr(elastune.infra.ecs_warm, "live_nodes", fake.live_nodes)
    monkeypatch.setattr(elastune.infra.ecs_warm, "draining_nodes", lambda pool: fake.draining)
    monkeypatch.setattr(elastune.infra.ecs_warm, "mark_draining", fake.mark)
    monkeypatch.setattr(elastune.infra.ecs_warm, "busy_nodes", fake.busy_nodes)
    monkeypatch.setattr(elastune.infra.ecs_warm, "LIVE_SECONDS", 0.0)
    WarmServices(EcsCapacity("gpu")).deploy(WORKER)
    return fake


def capacity() -> WarmCapacity:
    return WarmCapacity(EcsCapacity("gpu"), POOL, drain_timeout=5.0, poll=0.01)


def up(warm: WarmCapacity, nodes: Nodes, stage: str, count: int) -> dict[str, str]:
    """Stage ``stage`` sized to ``count`` big nodes, all joined and heartbeating."""
    warm.size(Demand(stage, slots=4 * count, gpus_per_trial=1.0, instance_type=BIG))
    on = join("big", BIG)
    nodes.live |= set(on.values())
    warm.wait_ready(timeout=1.0)
    return on


def test_a_stage_scales_up_and_is_ready_once_every_instance_runs_a_live_worker(nodes):
    warm = capacity()
    # Six trials of a GPU on 4-GPU nodes: two nodes.
    records = warm.size(Demand("b0-r0", slots=6, gpus_per_trial=1.0, instance_type=BIG))
    assert [(r.stage, r.target, r.before, r.after) for r in records] == [
        ("b0-r0", "asg big-asg", 0, 2)
    ]
    with pytest.raises(CapacityError, match=r"2 instance.* have not joined"):
        warm.wait_ready(timeout=0.05)
    on = join("big", BIG)
    with pytest.raises(CapacityError, match=r"2 instance.* run no live warm worker"):
        warm.wait_ready(timeout=0.05)
    nodes.live.add(next(iter(on.values())))
    with pytest.raises(CapacityError, match=r"1 instance.* run no live warm worker"):
        warm.wait_ready(timeout=0.05)
    nodes.live |= set(on.values())
    warm.wait_ready(timeout=0.05)
    # A node marked draining is no worker for the stage.
    nodes.draining.add(next(iter(on.values())))
    with pytest.raises(CapacityError, match="1 instance"):
        warm.wait_ready(timeout=0.05)


def test_a_smaller_stage_drains_idle_nodes_and_leaves_the_busy_one(nodes):
    warm = capacity()
    on = up(warm, nodes, "b0-r0", 3)
    busy = min(on)  # sorted first: it would go first if idle nodes did not
    nodes.busy = {on[busy]}
    # Two trials sharing half a GPU each: one node.
    records = warm.size(Demand("b0-r1", slots=2, gpus_per_trial=0.5, instance_type=BIG))
    assert [(r.stage, r.before, r.after) for r in records] == [("b0-r1", 3, 2), ("b0-r1", 2, 1)]
    assert nodes.draining == {on[i] for i in on if i != busy}
    states = {i: c["status"] for i, c in container_instances().items()}
    assert states == {i: "ACTIVE" if i == busy else "DRAINING" for i in on}
    assert desired("big") == (1, 1)


def test_a_scale_down_waits_for_the_segments_on_the_nodes_it_must_drain(nodes):
    warm = capacity()
    on = up(warm, nodes, "b0-r0", 2)
    nodes.busy = set(on.values())
    with pytest.raises(CapacityError, match=r"after 5 s, node\(s\) .* still run segments"):
        warm.size(Demand("b0-r1", slots=1, gpus_per_trial=1.0, instance_type=BIG))
    assert desired("big") == (2, 2)  # nothing terminated under a running segment
    assert len(nodes.draining) == 1


def test_the_next_instance_type_scales_up_before_the_last_one_drains(nodes):
    warm = capacity()
    on = up(warm, nodes, "b0-r0", 2)
    records = warm.size(Demand("b1-r0", slots=1, gpus_per_trial=1.0, instance_type=SMALL))
    assert [(r.target, r.before, r.after) for r in records] == [
        ("asg small-asg", 0, 1),
        ("asg big-asg", 2, 1),
        ("asg big-asg", 1, 0),
    ]
    assert nodes.draining == set(on.values())
    assert desired("big") == (0, 0)
    assert {(r.target, r.after) for r in warm.release()} == {
        ("asg big-asg", 0),
        ("asg small-asg", 0),
    }
    assert desired("small")[0] == 0


@pytest.mark.parametrize(
    ("demand", "message"),
    [
        (Demand("b0-r0", 1, 8.0, BIG), "a warm node trains a segment on 0 < GPUs <= 4"),
        (Demand("b0-r0", 1, 0.0, BIG), "0 < GPUs <= 4 .*, got 0"),
        (Demand("b0-r0", 17, 1.0, BIG), "needs 5 x g5.12xlarge .* above MaxSize 4"),
        (Demand("b0-r0", 1, 1.0, None), "names no instance type and the cluster offers"),
    ],
)
def test_a_stage_the_warm_nodes_cannot_hold_changes_nothing(nodes, demand, message):
    with pytest.raises(CapacityError, match=message):
        capacity().size(demand)
    assert desired("big") == (0, 0) and desired("small") == (0, 0)


def test_release_scales_every_group_it_touched_to_zero(nodes):
    warm = capacity()
    up(warm, nodes, "b0-r0", 2)
    records = warm.release()
    assert [(r.stage, r.before, r.after) for r in records] == [("release", 2, 0)]
    assert desired("big")[0] == 0


def test_an_ecs_backend_on_a_warm_pool_drains_where_an_ecs_pool_does_not(aws):
    warm = make_backend("ecs", POOL, pool_type=WARM_TYPE, cluster="gpu")
    assert [type(p) for p in warm.parts] == [WarmCapacity, WorkPoolLimit]
    assert warm.parts[1].pool_type == WARM_TYPE
    tasks = make_backend("ecs", POOL, cluster="gpu")
    assert [type(p) for p in tasks.parts] == [EcsCapacity, WorkPoolLimit]


def test_a_scale_down_with_instances_not_joined_removes_nothing(nodes):
    boto3.client("autoscaling", region_name=REGION).set_desired_capacity(
        AutoScalingGroupName="big-asg", DesiredCapacity=2
    )  # launched, never joined: the Auto Scaling group would choose what goes
    with pytest.raises(CapacityError, match=r"1 instance.* only 0 are in service and joined"):
        capacity().size(Demand("b0-r0", slots=4, gpus_per_trial=1.0, instance_type=BIG))
    assert desired("big") == (2, 2)


class EcsAgents:
    """What ECS does on the instances of Auto Scaling group ``small-asg``, in a thread: each
    instance in service joins the cluster and runs its warm task, here a real warm node
    process named after the task; the node of an instance that was terminated stops."""

    def __init__(self, api: str, home: Path, storage: str) -> None:
        self.api, self.home, self.storage = api, home, storage
        self.nodes: dict[str, NodeProcess] = {}  # by instance
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.stopping.wait(0.2):
            on = join("small", SMALL)
            for instance, task in on.items():
                if instance not in self.nodes:
                    self.nodes[instance] = self._start(task)
            for instance, node in self.nodes.items():
                if instance not in on and node.process.poll() is None:
                    stop_group(node.process, signal.SIGTERM)

    def _start(self, task: str) -> NodeProcess:
        command = [sys.executable, "-m", "elastune.flows.segment", "--pool", POOL, "--node", task]
        command += ["--gpus", "1", "--storage", self.storage, "--threads", "1"]
        folder = self.home / task
        folder.mkdir(parents=True)
        env = isolated_env(folder, PREFECT_API_URL=self.api)
        node = NodeProcess(task, command, env, folder / "worker.log")
        node.start()
        return node

    def __enter__(self) -> EcsAgents:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()
        for node in self.nodes.values():
            stop_group(node.process, signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.usefixtures("aws")
def test_a_warm_job_sizes_its_ecs_cluster_stage_by_stage(prefect_api, tmp_path, stores, capsys):
    storage = create_warm_pool(POOL, tmp_path / "segments")
    # The SHA job of tests/test_pool_mode.py: 3 trials at rung 0 on 2 workers, 1 at rung 1.
    cluster = {"cluster": "gpu", "capacity_providers": ["small-cp"]}
    job = {**POOL_JOB, "compute": {"pool": POOL, "workers": 2, "ecs": cluster}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    WarmServices(EcsCapacity("gpu")).deploy(WORKER)
    with EcsAgents(prefect_api, tmp_path / "nodes", storage) as agents:
        code = main(["run", str(tmp_path / "job.yaml"), "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "warm workers on 0 node(s) now, ECS cluster gpu sized stage by stage" in err
    summary = json.loads(out)
    assert summary["segments"] == 4 and summary["best"] is not None
    # Two nodes for the first rung's two workers, one drained for the second rung's one
    # trial, then none: every node ran on an instance of the group, and is stopped.
    sizing = Artifact.get(f"{summary['job_id']}-pool-sizing")
    rows = [(r["stage"], r["target"], r["after"]) for r in json.loads(sizing.data)]
    assert rows == [
        ("b0-r0", "asg small-asg", 2),
        ("b0-r0", f"work-pool {POOL}", 2),
        ("b0-r1", "asg small-asg", 1),
        ("b0-r1", f"work-pool {POOL}", 1),
        ("release", "asg small-asg", 0),
        ("release", f"work-pool {POOL}", "none"),
    ]
    assert desired("small") == (0, 0)
    assert len(agents.nodes) == 2
    assert all(node.process.poll() is not None for node in agents.nodes.values())
    ran = {t for run in segment_runs(summary["job_id"], warm=True) for t in run.tags}
    assert {t for t in ran if t.startswith("node:")} <= {
        f"node:{node.name}" for node in agents.nodes.values()
    }
