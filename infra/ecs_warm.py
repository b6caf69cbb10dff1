"""Warm node workers on ECS: one per GPU instance, run by a DAEMON service per instance type.

:meth:`WarmServices.deploy` registers, for each GPU instance type of the cluster (the groups
that :class:`elastune.infra.ecs.EcsCapacity` sizes), a task definition that runs the warm node
worker of :mod:`elastune.flows.segment` on all of an instance's GPUs, and a service with the
``DAEMON`` scheduling strategy placed on that instance type: every instance the Auto Scaling group
launches runs exactly one warm worker, so the groups' desired capacity is the number of
nodes. The worker names its node after its ECS task (``--node-from-ecs``).

:meth:`WarmServices.drain` removes given instances without losing a segment: their nodes
stop getting segments (:func:`elastune.infra.warm_nodes.draining_nodes`), their warm runs finish,
then their container instances are set DRAINING and the instances terminated with the group's
desired capacity decremented. ECS is told last because draining stops the daemon task,
runs and all (docs/ecs.md, "Draining a node").

:class:`WarmCapacity` is what a job on a warm pool with ``compute.ecs`` sizes its cluster
with: up through the Auto Scaling groups, down by draining, idle nodes first.

Example (the task definition of pool ``gpu-warm``'s workers on 4-GPU instances):
    >>> worker = WarmWorker("gpu-warm", "s3-bucket/elastune-segments", "elastune-train:1",
    ...                     "http://prefect.internal:4200/api", "http://mlflow.internal:5000")
    >>> spec = task_definition(worker, "g5.12xlarge", 4)
    >>> spec["family"]
    'elastune-warm-gpu-warm-g5-12xlarge'
    >>> " ".join(spec["containerDefinitions"][0]["command"][3:])
    '--pool gpu-warm --node-from-ecs --gpus 4 --storage s3-bucket/elastune-segments'
    >>> spec["containerDefinitions"][0]["resourceRequirements"]
    [{'type': 'GPU', 'value': '4'}]
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from elastune.infra.ecs import EcsCapacity, ScalingGroup, aws_errors
from elastune.infra.sizing import CapacityError, Demand, InfraError, Sizer, SizingRecord
from elastune.infra.warm_nodes import (
    LIVE_SECONDS,
    busy_nodes,
    draining_nodes,
    live_nodes,
    mark_draining,
)

# Pool names become part of ECS family and service names and of a Prefect variable's name.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,150}")
_CONTAINER = "warm-worker"
DRAIN_STAGE = "drain"


@dataclass(frozen=True)
class WarmWorker:
    """What every warm worker container of a pool gets.

    Args:
        pool: the warm work pool (type ``elastune-warm``) the workers serve.
        storage: slug of the block that holds segment parameters, e.g. ``s3-bucket/NAME``
            (the pool's ``storage`` variable names the same block).
        image: the training image (docs/ecs.md, "2. The training image").
        prefect_api_url: the Prefect API as the instances reach it.
        mlflow_uri: the MLflow tracking server as the instances reach it.
        memory: MiB reserved for the worker (a soft limit: ``memoryReservation``).
        task_role_arn: the role the worker's AWS calls use (the S3 bucket of the storage
            block and of MLflow's artifacts); None: the instance's role.
    """

    pool: str
    storage: str
    image: str
    prefect_api_url: str
    mlflow_uri: str
    memory: int = 4096
    task_role_arn: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.pool):
            raise InfraError(
                f"pool: {self.pool!r} must be 1 to 150 letters, digits, '-' or '_' "
                "(it names ECS services and a Prefect variable)"
            )
        if self.storage.count("/") != 1 or not all(self.storage.split("/")):
            raise InfraError(f"storage: {self.storage!r} is not a block slug like s3-bucket/NAME")
        if not self.image:
            raise InfraError("image: name the training image (docs/ecs.md, step 2)")
        _check_reachable("prefect_api_url", self.prefect_api_url)
        _check_reachable("mlflow_uri", self.mlflow_uri)
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory < 128:
            raise InfraError(f"memory: MiB as an integer >= 128, got {self.memory!r}")


def _check_reachable(field: str, url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InfraError(f"{field}: {url!r} is not an http(s) URL the instances can reach")
    if parsed.hostname in ("localhost", "127.0.0.1", "::1"):
        raise InfraError(f"{field}: {url!r} is this machine's loopback; ECS tasks cannot reach it")


def family(pool: str, instance_type: str) -> str:
    """The task definition family, and service name, of ``pool``'s workers on a type."""
    return f"elastune-warm-{pool}-{instance_type.replace('.', '-')}"


def task_definition(worker: WarmWorker, instance_type: str, gpus: int) -> dict[str, Any]:
    """``register_task_definition``'s arguments: one worker on all ``gpus`` of an instance."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InfraError(f"gpus: whole GPUs per instance, an integer >= 1, got {gpus!r}")
    command = ["python", "-m", "elastune.flows.segment", "--pool", worker.pool, "--node-from-ecs"]
    command += ["--gpus", str(gpus), "--storage", worker.storage]
    container = {
        "name": _CONTAINER,
        "image": worker.image,
        "essential": True,
        "command": command,
        "environment": [
            {"name": "PREFECT_API_URL", "value": worker.prefect_api_url},
            {"name": "MLFLOW_TRACKING_URI", "value": worker.mlflow_uri},
        ],
        # ECS wants the GPU count as a string.
        "resourceRequirements": [{"type": "GPU", "value": str(gpus)}],
        "memoryReservation": worker.memory,
    }
    spec: dict[str, Any] = {
        "family": family(worker.pool, instance_type),
        "containerDefinitions": [container],
    }
    if worker.task_role_arn:
        spec["taskRoleArn"] = worker.task_role_arn
    return spec


class WarmServices:
    """The warm worker services of an ECS cluster, and the draining of its instances.

    Args:
        capacity: the cluster's sizing backend; its groups are the instance types served.
    """

    def __init__(self, capacity: EcsCapacity) -> None:
        self.capacity = capacity
        self.ecs = capacity.client("ecs")
        self.autoscaling = capacity.client("autoscaling")

    def _groups(self) -> list[ScalingGroup]:
        if not self.capacity.groups:
            self.capacity.check()
        return list(self.capacity.groups.values())

    def deploy(self, worker: WarmWorker) -> list[str]:
        """Register the task definitions and create (or update) the DAEMON services; their
        ARNs, one per instance type. AWS refusing is an :class:`InfraError`."""
        with aws_errors("warm services"):
            return [self._deploy(worker, group) for group in self._groups()]

    def _deploy(self, worker: WarmWorker, group: ScalingGroup) -> str:
        spec = task_definition(worker, group.instance_type, group.gpus_per_node)
        arn = self.ecs.register_task_definition(**spec)["taskDefinition"]["taskDefinitionArn"]
        name = spec["family"]
        cluster = self.capacity.cluster
        found = self.ecs.describe_services(cluster=cluster, services=[name])["services"]
        if any(s["status"] == "ACTIVE" for s in found):
            service = self.ecs.update_service(cluster=cluster, service=name, taskDefinition=arn)
        else:
            service = self.ecs.create_service(
                cluster=cluster,
                serviceName=name,
                taskDefinition=arn,
                schedulingStrategy="DAEMON",
                launchType="EC2",
                placementConstraints=[
                    {
                        "type": "memberOf",
                        "expression": f"attribute:ecs.instance-type == {group.instance_type}",
                    }
                ],
            )
        return service["service"]["serviceArn"]

    def drain(
        self,
        pool: str,
        instances: list[str],
        timeout: float = 3600.0,
        poll: float = 5.0,
        stage: str = DRAIN_STAGE,
    ) -> list[SizingRecord]:
        """Remove EC2 ``instances`` of the cluster's groups once their warm runs are done:
        their nodes get no new segment, then (when none runs there, within ``timeout``
        s) their container instances are set DRAINING and the instances terminated, each
        group's desired capacity decremented. One record per instance terminated, under
        ``stage``. The nodes stay marked draining: their heartbeats go on for a moment."""
        if not instances or len(set(instances)) != len(instances):
            raise InfraError(f"instances: name distinct EC2 instance ids, got {instances!r}")
        with aws_errors("drain"):
            where, desired = self._where(instances)
            arns = self._container_instances(instances)
            nodes = self._nodes_on(list(arns.values()))
        mark_draining(pool, nodes, draining=True)
        self._wait_idle(pool, nodes, timeout, poll)
        with aws_errors("drain"):
            return self._remove(stage, arns, where, desired)

    def _remove(
        self,
        stage: str,
        arns: dict[str, str],
        where: dict[str, ScalingGroup],
        desired: dict[str, int],
    ) -> list[SizingRecord]:
        self.ecs.update_container_instances_state(
            cluster=self.capacity.cluster,
            containerInstances=list(arns.values()),
            status="DRAINING",
        )
        records = []
        for instance in arns:
            group = where[instance]
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=instance, ShouldDecrementDesiredCapacity=True
            )
            before, desired[group.name] = desired[group.name], desired[group.name] - 1
            records.append(
                SizingRecord(
                    stage,
                    f"asg {group.name}",
                    "desired_capacity",
                    before,
                    desired[group.name],
                    f"terminated {instance}, drained",
                )
            )
        return records

    def _where(self, instances: list[str]) -> tuple[dict[str, ScalingGroup], dict[str, int]]:
        """The group of each instance and each group's desired capacity; an error names the
        instances in no group of the cluster."""
        where, desired = {}, {}
        for group in self._groups():
            found = self.autoscaling.describe_auto_scaling_groups(
                AutoScalingGroupNames=[group.name]
            )["AutoScalingGroups"][0]
            where |= {i["InstanceId"]: group for i in found.get("Instances", [])}
            desired[group.name] = found["DesiredCapacity"]
        missing = [i for i in instances if i not in where]
        if missing:
            raise InfraError(
                f"instances: {missing} in no Auto Scaling group of cluster "
                f"{self.capacity.cluster!r} ({sorted(desired)})"
            )
        return where, desired

    def _container_instances(self, instances: list[str]) -> dict[str, str]:
        """The container instance ARN of each EC2 instance; every one must have joined."""
        arns = self._joined()
        missing = [i for i in instances if i not in arns]
        if missing:
            raise InfraError(
                f"instances: {missing} have not joined ECS cluster {self.capacity.cluster!r}"
            )
        return {i: arns[i] for i in instances}

    def _joined(self) -> dict[str, str]:
        """The container instance ARN of every EC2 instance joined to the cluster."""
        cluster = self.capacity.cluster
        pages = self.ecs.get_paginator("list_container_instances").paginate(cluster=cluster)
        listed = [arn for page in pages for arn in page["containerInstanceArns"]]
        arns = {}
        for i in range(0, len(listed), 100):  # DescribeContainerInstances takes 100 at most
            described = self.ecs.describe_container_instances(
                cluster=cluster, containerInstances=listed[i : i + 100]
            )["containerInstances"]
            arns |= {c["ec2InstanceId"]: c["containerInstanceArn"] for c in described}
        return arns

    def _nodes_on(self, container_instances: list[str]) -> set[str]:
        """The node names on those container instances: the ids of their ECS tasks."""
        return {node for arn in container_instances for node in self._tasks_on(arn)}

    def _tasks_on(self, container_instance: str) -> set[str]:
        tasks = self.ecs.list_tasks(
            cluster=self.capacity.cluster, containerInstance=container_instance
        )
        return {task.rsplit("/", 1)[-1] for task in tasks["taskArns"]}

    def nodes_by_instance(self, groups: list[ScalingGroup]) -> dict[str, set[str]]:
        """The in-service instances of ``groups`` that joined the cluster, with the nodes
        (ECS task ids) on each."""
        found = self.autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=[group.name for group in groups]
        )
        serving = [
            i["InstanceId"]
            for asg in found["AutoScalingGroups"]
            for i in asg.get("Instances", [])
            if i["LifecycleState"] == "InService"
        ]
        joined = self._joined()
        return {i: self._tasks_on(joined[i]) for i in serving if i in joined}

    def _wait_idle(self, pool: str, nodes: set[str], timeout: float, poll: float) -> None:
        # A driver reads the draining nodes at most a heartbeat late and may have placed a
        # segment meanwhile: its run shows up within the liveness window.
        time.sleep(min(LIVE_SECONDS, timeout))
        deadline = time.monotonic() + timeout
        while busy := busy_nodes(nodes):
            if time.monotonic() >= deadline:
                raise CapacityError(
                    f"drain: after {timeout:g} s, node(s) {sorted(busy)} of pool {pool!r} still "
                    "run segments; nothing was terminated, and the nodes get no new segment "
                    "until drain is called again or elastune.infra.warm_nodes.mark_draining "
                    "clears them"
                )
            time.sleep(poll)


class WarmCapacity(Sizer):
    """The EC2 capacity of a warm pool's ECS cluster, sized stage by stage: scaled up through
    the stage's Auto Scaling group (as :class:`~elastune.infra.ecs.EcsCapacity` sizes it), scaled
    down by draining nodes, idle ones first, so no segment loses its instance. Ready once a
    warm worker heartbeats from every instance. A node trains several segments at once, so
    a stage's trials share nodes (fractions of a GPU too), best fit.

    Args:
        capacity: the cluster's capacity: its groups and its AWS clients.
        pool: the warm pool the cluster's workers serve.
        drain_timeout: seconds a scale-down waits for the segments on the nodes it drains.
        poll: seconds between looks while draining or waiting for workers.
    """

    def __init__(
        self, capacity: EcsCapacity, pool: str, drain_timeout: float = 3600.0, poll: float = 5.0
    ) -> None:
        self.capacity = capacity
        self.pool = pool
        self.services = WarmServices(capacity)
        self.drain_timeout = drain_timeout
        self.poll = poll

    def check(self) -> None:
        self.capacity.check()

    def fits(self, demand: Demand) -> None:
        self.capacity.target(demand, whole_gpus=False)

    def size(self, demand: Demand) -> list[SizingRecord]:
        target, nodes, detail = self.capacity.target(demand, whole_gpus=False)
        records = []
        with aws_errors(f"stage {demand.stage}"):
            change = {
                g: (nodes if g is target else 0) - self.capacity.desired(g)
                for g in self.capacity.groups.values()
            }
            # Up first: new instances launch while the old ones drain.
            for group, more in sorted(change.items(), key=lambda item: -item[1]):
                if more > 0:
                    records.append(self.capacity.set_desired(group, demand.stage, nodes, detail))
                elif more < 0:
                    records += self._shrink(group, -more, demand.stage)
        return records

    def _shrink(self, group: ScalingGroup, count: int, stage: str) -> list[SizingRecord]:
        """Drain ``count`` instances of ``group``, those whose nodes run nothing first."""
        on = self.services.nodes_by_instance([group])
        busy = busy_nodes(set().union(*on.values())) if on else set()
        ranked = sorted(on, key=lambda instance: (bool(on[instance] & busy), instance))
        if len(ranked) < count:
            # The Auto Scaling group would pick which instances go, busy ones maybe.
            raise CapacityError(
                f"stage {stage!r}: {count} instance(s) of {group.name!r} to remove, but only "
                f"{len(ranked)} are in service and joined to ECS cluster "
                f"{self.capacity.cluster!r}; nothing was removed"
            )
        return self.services.drain(self.pool, ranked[:count], self.drain_timeout, self.poll, stage)

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Wait until every desired instance has joined the cluster and a warm worker on
        each heartbeats; :class:`CapacityError` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        self.capacity.wait_ready(timeout, self.poll)
        while (missing := self._workers_missing()) > 0:
            if time.monotonic() >= deadline:
                raise CapacityError(
                    f"after {timeout:g} s, {missing} instance(s) of stage "
                    f"{self.capacity.stage!r} run no live warm worker of pool {self.pool!r}; "
                    "check the events of its ECS services (docs/ecs.md, '5. The warm workers')"
                )
            time.sleep(self.poll)

    def _workers_missing(self) -> int:
        """Instances of the groups without a live warm worker that is not draining."""
        groups = list(self.capacity.groups.values())
        with aws_errors("warm workers"):
            on = self.services.nodes_by_instance(groups)
            desired = sum(self.capacity.desired(g) for g in groups)
        up = {node.name for node in live_nodes(self.pool)} - draining_nodes(self.pool)
        return desired - sum(1 for nodes in on.values() if nodes & up)

    def release(self) -> list[SizingRecord]:
        """Every group to zero. The job is over: no segment of it runs any more."""
        return self.capacity.release()
