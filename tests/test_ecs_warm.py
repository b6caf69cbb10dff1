"""Warm node workers on ECS against moto: the DAEMON services, and draining before scale-down.

moto registers no Auto Scaling instance with ECS and runs no service's tasks, so the tests
register the container instances and start each instance's warm task themselves, as the
ECS agent and the DAEMON scheduler would (docs/stack.md §3).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import boto3
import pytest
from prefect.client.orchestration import get_client
from prefect.states import Completed, Running

import elastune.infra.ecs_warm
from elastune.flows.segment import ecs_task_id, main, warm_segment
from elastune.flows.warm_pool import Placer
from elastune.infra.ecs import EcsCapacity
from elastune.infra.ecs_warm import WarmServices, WarmWorker, family
from elastune.infra.local_cluster import create_warm_pool
from elastune.infra.sizing import CapacityError, InfraError
from elastune.infra.warm_nodes import Node, busy_nodes, draining_nodes, mark_draining
from tests.helpers.aws import (
    BIG,
    POOL,
    REGION,
    SMALL,
    WORKER,
    container_instances,
    desired,
    ecs,
    gpus_of,
    join,
    services,
)

pytestmark = pytest.mark.usefixtures("fast_moto")


@pytest.mark.usefixtures("aws")
def test_one_daemon_service_per_instance_type_runs_the_warm_worker():
    warm = services()
    sent: dict[str, dict] = {}  # moto keeps no service placement constraints: read the calls
    warm.ecs.meta.events.register(
        "provide-client-params.ecs.CreateService",
        lambda params, **_: sent.setdefault(params["serviceName"], params),
    )
    assert len(warm.deploy(WORKER)) == 2
    for instance_type in (BIG, SMALL):
        name = family(POOL, instance_type)
        (service,) = ecs().describe_services(cluster="gpu", services=[name])["services"]
        assert service["schedulingStrategy"] == "DAEMON"
        assert service["launchType"] == "EC2"
        assert sent[name]["placementConstraints"] == [
            {"type": "memberOf", "expression": f"attribute:ecs.instance-type == {instance_type}"}
        ]
        definition = ecs().describe_task_definition(taskDefinition=service["taskDefinition"])
        (container,) = definition["taskDefinition"]["containerDefinitions"]
        gpus = str(gpus_of(instance_type))
        assert container["command"] == [
            "python", "-m", "elastune.flows.segment", "--pool", POOL, "--node-from-ecs",
            "--gpus", gpus, "--storage", "s3-bucket/elastune-segments",
        ]  # fmt: skip
        assert container["resourceRequirements"] == [{"type": "GPU", "value": gpus}]
        assert {e["name"]: e["value"] for e in container["environment"]} == {
            "PREFECT_API_URL": WORKER.prefect_api_url,
            "MLFLOW_TRACKING_URI": WORKER.mlflow_uri,
        }
        assert container["image"] == WORKER.image


@pytest.mark.usefixtures("aws")
def test_deploying_again_updates_the_services_to_a_new_revision():
    services().deploy(WORKER)
    services().deploy(dataclasses.replace(WORKER, image="elastune-train:2"))
    name = family(POOL, BIG)
    found = ecs().describe_services(cluster="gpu", services=[name])["services"]
    assert len(found) == 1
    assert found[0]["taskDefinition"].endswith(f"{name}:2")
    assert len(ecs().list_services(cluster="gpu")["serviceArns"]) == 2


class Gate:
    """The Prefect side of draining, recorded: the nodes marked, and runs that end after
    ``busy_polls`` looks. Each look checks that ECS has not been told to drain yet."""

    def __init__(self, busy_polls: int) -> None:
        self.marks: list[tuple[set[str], bool]] = []
        self.busy_polls = busy_polls
        self.looks = 0

    def mark(self, pool: str, nodes: set[str], draining: bool) -> None:
        assert pool == POOL
        self.marks.append((set(nodes), draining))

    def busy(self, nodes: set[str]) -> set[str]:
        self.looks += 1
        states = {c["status"] for c in container_instances().values()}
        assert states == {"ACTIVE"}, "ECS drained while a warm run was still on the node"
        return set(nodes) if self.looks <= self.busy_polls else set()


@pytest.fixture
def gate(monkeypatch) -> Gate:
    gate = Gate(busy_polls=2)
    monkeypatch.setattr(elastune.infra.ecs_warm, "mark_draining", gate.mark)
    monkeypatch.setattr(elastune.infra.ecs_warm, "busy_nodes", gate.busy)
    monkeypatch.setattr(elastune.infra.ecs_warm, "LIVE_SECONDS", 0.0)
    return gate


def warm_nodes_up(nodes: int) -> dict[str, str]:
    """``nodes`` big instances joined to the cluster, each running its warm task, as the
    DAEMON service would; the node name (task id) on each instance."""
    services().deploy(WORKER)
    boto3.client("autoscaling", region_name=REGION).set_desired_capacity(
        AutoScalingGroupName="big-asg", DesiredCapacity=nodes
    )
    return join("big", BIG)


@pytest.mark.usefixtures("aws")
def test_drain_waits_for_the_runs_then_drains_and_terminates_exactly_those(gate):
    names = warm_nodes_up(3)
    going, *staying = sorted(names)
    records = services().drain(POOL, [going], poll=0.01)
    # The node left placement first (and stays out while its heartbeats fade), ECS drained
    # only after its runs ended, then it went.
    assert gate.marks == [({names[going]}, True)]
    assert gate.looks == 3
    states = {i: c["status"] for i, c in container_instances().items()}
    assert states[going] == "DRAINING"
    assert [states[i] for i in staying] == ["ACTIVE", "ACTIVE"]
    group = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=["big-asg"]
    )["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 2
    assert sorted(i["InstanceId"] for i in group["Instances"]) == staying
    assert [(r.stage, r.target, r.before, r.after) for r in records] == [
        ("drain", "asg big-asg", 3, 2)
    ]


@pytest.mark.usefixtures("aws")
def test_drain_that_times_out_terminates_nothing(gate):
    names = warm_nodes_up(2)
    gate.busy_polls = 10**6
    with pytest.raises(CapacityError, match=r"after 0.05 s, node\(s\) .* still run segments"):
        services().drain(POOL, sorted(names)[:1], timeout=0.05, poll=0.01)
    assert {c["status"] for c in container_instances().values()} == {"ACTIVE"}
    assert desired("big") == (2, 2)
    # The node stays out of placement: its runs still go on.
    assert gate.marks == [({names[sorted(names)[0]]}, True)]


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([], "instances: name distinct EC2 instance ids"),
        (["i-1", "i-1"], "instances: name distinct"),
        (["i-0123456789abcdef0"], r"instances: \['i-0123456789abcdef0'\] in no Auto Scaling"),
    ],
)
@pytest.mark.usefixtures("aws")
def test_drain_refuses_instances_it_does_not_manage(gate, instances, message):
    warm_nodes_up(1)
    with pytest.raises(InfraError, match=message):
        services().drain(POOL, instances)
    assert gate.marks == []


@pytest.mark.usefixtures("aws")
def test_drain_refuses_an_instance_not_joined_to_the_cluster(gate):
    boto3.client("autoscaling", region_name=REGION).set_desired_capacity(
        AutoScalingGroupName="small-asg", DesiredCapacity=1
    )
    group = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=["small-asg"]
    )["AutoScalingGroups"][0]
    instance = group["Instances"][0]["InstanceId"]  # launched, never registered with ECS
    with pytest.raises(InfraError, match="have not joined ECS cluster 'gpu'"):
        services().drain(POOL, [instance])
    assert gate.marks == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pool": "gpu warm"}, "pool: 'gpu warm' must be 1 to 150 letters"),
        ({"storage": "elastune-segments"}, "storage: 'elastune-segments' is not a block slug"),
        ({"image": ""}, "image: name the training image"),
        ({"prefect_api_url": "http://127.0.0.1:4200/api"}, "prefect_api_url: .* loopback"),
        ({"mlflow_uri": "sqlite:///mlflow.db"}, "mlflow_uri: 'sqlite:///mlflow.db' is not an"),
        ({"memory": 64}, "memory: MiB as an integer >= 128, got 64"),
    ],
)
def test_bad_worker_settings_name_the_field(change, message):
    fields = {**WORKER.__dict__, **change}
    with pytest.raises(InfraError, match=message):
        WarmWorker(**fields)


@pytest.mark.usefixtures("aws")
def test_a_cluster_without_gpu_groups_is_refused_before_anything_is_created():
    ecs().create_cluster(clusterName="empty")
    with pytest.raises(CapacityError, match="no EC2 capacity provider"):
        WarmServices(EcsCapacity("empty")).deploy(WORKER)
    assert ecs().list_task_definitions()["taskDefinitionArns"] == []


def test_the_placer_skips_draining_nodes(monkeypatch):
    nodes = [Node("task-a", 1.0, 1), Node("task-b", 4.0, 2)]
    draining = {"task-a"}
    monkeypatch.setattr("elastune.flows.warm_pool.live_nodes", lambda pool: nodes)
    monkeypatch.setattr("elastune.flows.warm_pool.draining_nodes", lambda pool: draining)
    placer = Placer(POOL)
    # task-a would be the best fit for 1 GPU; draining, it gets nothing.
    assert placer.take(1.0, timeout=0) == ("task-b", False)
    draining.clear()
    assert [node.name for node in placer.live(fresh=True)] == ["task-a", "task-b"]


@pytest.fixture
def metadata() -> Iterator[str]:
    """A fake ECS task metadata endpoint v4 (what the agent serves to the container)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/v4/abc/task":
                self.send_error(404)
                return
            body = json.dumps(
                {"Cluster": "gpu", "TaskARN": "arn:aws:ecs:us-east-1:1:task/gpu/0f3e9a7c"}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v4/abc"
    finally:
        server.shutdown()
        server.server_close()


def test_the_node_is_named_after_its_ecs_task(metadata):
    assert ecs_task_id(metadata) == "0f3e9a7c"


def test_node_from_ecs_outside_ecs_is_refused(monkeypatch, capsys):
    monkeypatch.delenv("ECS_CONTAINER_METADATA_URI_V4", raising=False)
    argv = ["--pool", POOL, "--node-from-ecs", "--gpus", "1", "--storage", "a/b"]
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    assert "ECS_CONTAINER_METADATA_URI_V4 is not set" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--node", "n0"])  # one name or the other


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_draining_marks_and_busy_nodes_on_a_real_server(tmp_path):
    pool = "drain-marks"  # a pool of its own: other tests drain nodes of POOL
    create_warm_pool(pool, tmp_path)
    assert draining_nodes(pool) == set()
    mark_draining(pool, {"task-a", "task-b"}, draining=True)
    mark_draining(pool, {"task-b"}, draining=False)
    assert draining_nodes(pool) == {"task-a"}
    assert draining_nodes("other-pool") == set()
    tagged = warm_segment.with_options(tags={"node:task-a"})
    with get_client(sync_client=True) as client:
        run = client.create_task_run(tagged, None, "0", state=Running())
        assert busy_nodes({"task-a", "task-b"}) == {"task-a"}
        client.set_task_run_state(run.id, Completed(), force=True)
        assert busy_nodes({"task-a", "task-b"}) == set()
        # Marking more forgets the marked nodes that send no heartbeat: their instances
        # are gone. task-c lives.
        client.send_worker_heartbeat(pool, Node("task-c", 1.0, 7).worker_name, 1)
    mark_draining(pool, {"task-c"}, draining=True)
    assert draining_nodes(pool) == {"task-c"}
    mark_draining(pool, {"task-d"}, draining=True)
    assert draining_nodes(pool) == {"task-c", "task-d"}
    mark_draining(pool, {"task-c", "task-d"}, draining=False)
