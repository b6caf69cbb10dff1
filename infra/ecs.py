"""EC2 capacity of an ECS cluster, sized stage by stage through its Auto Scaling groups.

Each EC2 capacity provider of the cluster is backed by one Auto Scaling group that
launches one GPU instance type. Before a stage, :class:`EcsCapacity` sets the desired
capacity of the group of the stage's instance type to the nodes the stage needs (the §5.5
placement of its trials, :func:`elastune.planners.staging.placement.nodes_needed`) and every other
group it manages to zero; :meth:`EcsCapacity.release` sets them all to zero. Assumptions, checked in
:meth:`EcsCapacity.check` (docs/ecs.md explains how to create such a cluster):

- managed scaling of the capacity providers is DISABLED, otherwise ECS would overwrite the
  desired capacity set here;
- each group has ``MinSize`` 0 (so it can reach zero) and a launch template with one
  instance type.

Scale-downs happen at stage barriers, when no segment runs, so the group may terminate
any instance. Credentials come only from a prefect-aws ``AwsCredentials`` block (by name or
object) or boto3's default chain (environment, shared files, instance role); they are
never logged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, ProfileNotFound
from prefect_aws import AwsCredentials

from elastune.infra.sizing import (
    RELEASE_STAGE,
    CapacityError,
    Demand,
    MissingCredentials,
    Sizer,
    SizingRecord,
)
from elastune.planners.staging import nodes_needed

# Capacity providers that AWS manages itself; they have no Auto Scaling group to size.
_FARGATE = {"FARGATE", "FARGATE_SPOT"}


def aws_session(
    credentials: AwsCredentials | str | None = None, region: str | None = None
) -> tuple[boto3.Session, dict[str, Any]]:
    """A boto3 session and client options, or :class:`MissingCredentials` naming the fix.

    ``credentials`` is an ``AwsCredentials`` block, the name of a saved one, or None for
    boto3's default chain. Only the source is ever put in messages, never a key.
    """
    if isinstance(credentials, str):
        source = f"AwsCredentials block {credentials!r}"
        try:
            block = AwsCredentials.load(credentials)
        except ValueError:
            raise MissingCredentials(
                f"{source} not found on the Prefect server; create it as docs/ecs.md shows"
            ) from None
    else:
        source = "the environment" if credentials is None else "AwsCredentials block"
        block = credentials if credentials is not None else AwsCredentials()
    try:
        session = block.get_boto3_session()
    except ProfileNotFound as exc:
        raise MissingCredentials(f"{source}: {exc}") from None
    except (BotoCoreError, ClientError) as exc:
        raise MissingCredentials(f"{source}: AWS session failed: {exc}") from None
    if session.get_credentials() is None:
        raise MissingCredentials(
            f"no AWS credentials in {source}: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or an instance role), or pass the name of "
            "a prefect-aws AwsCredentials block"
        )
    options = block.aws_client_parameters.get_params_override()
    region = region or block.region_name or session.region_name
    if not region:
        raise MissingCredentials(
            f"no AWS region in {source}: set AWS_DEFAULT_REGION or the block's region_name"
        )
    options["region_name"] = region
    return session, options


@contextlib.contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """AWS refusing or unreachable, as a :class:`CapacityError` that names ``what`` failed."""
    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise CapacityError(f"{what}: AWS answered {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class ScalingGroup:
    """The Auto Scaling group behind one capacity provider."""

    name: str
    capacity_provider: str
    instance_type: str
    gpus_per_node: int
    max_size: int


def _asg_name(arn: str) -> str:
    # arn:aws:autoscaling:REGION:ACCOUNT:autoScalingGroup:UUID:autoScalingGroupName/NAME
    return arn.split("autoScalingGroupName/", 1)[-1]


class EcsCapacity(Sizer):
    """Sizes the EC2 Auto Scaling groups of an ECS cluster's capacity providers.

    Args:
        cluster: ECS cluster name or ARN.
        capacity_providers: providers to manage; default: every EC2 provider of the cluster.
        credentials: ``AwsCredentials`` block, its saved name, or None (default chain).
        region: overrides the block's and the environment's region.
    """

    def __init__(
        self,
        cluster: str,
        capacity_providers: list[str] | None = None,
        credentials: AwsCredentials | str | None = None,
        region: str | None = None,
    ) -> None:
        if not cluster:
            raise ValueError("cluster must name an ECS cluster")
        self.cluster = cluster
        self.capacity_providers = capacity_providers
        self.credentials = credentials
        self.region = region
        self.groups: dict[str, ScalingGroup] = {}
        self._clients: dict[str, Any] = {}
        self._touched: set[str] = set()
        self.stage: str | None = None  # the stage last sized

    def client(self, service: str) -> Any:
        """The boto3 client of ``service`` (ecs, autoscaling, ec2), made once per backend."""
        if not self._clients:
            session, options = aws_session(self.credentials, self.region)
            for name in ("ecs", "autoscaling", "ec2"):
                self._clients[name] = session.client(name, **options)
        return self._clients[service]

    def check(self) -> None:
        """Resolve providers -> groups -> instance types and GPUs; validates the assumptions.

        AWS refusing or unreachable is bad input too: nothing has been scaled yet."""
        with aws_errors("compute.ecs"):
            self._check()

    def _check(self) -> None:
        ecs = self.client("ecs")
        found = ecs.describe_clusters(clusters=[self.cluster])
        clusters = [c for c in found["clusters"] if c.get("status") == "ACTIVE"]
        if not clusters:
            raise CapacityError(f"ECS cluster {self.cluster!r} not found (or not ACTIVE)")
        names = self.capacity_providers or [
            p for p in clusters[0].get("capacityProviders", []) if p not in _FARGATE
        ]
        if not names:
            raise CapacityError(
                f"ECS cluster {self.cluster!r} has no EC2 capacity provider; "
                "create one on a GPU Auto Scaling group (docs/ecs.md)"
            )
        described = ecs.describe_capacity_providers(capacityProviders=names)
        if described.get("failures"):
            missing = ", ".join(f["arn"].rsplit("/", 1)[-1] for f in described["failures"])
            raise CapacityError(f"capacity provider(s) not found: {missing}")
        providers = {p["name"]: p for p in described["capacityProviders"]}
        groups: dict[str, ScalingGroup] = {}
        for name in names:
            asg_provider = providers[name].get("autoScalingGroupProvider")
            if not asg_provider:
                raise CapacityError(f"capacity provider {name!r} has no Auto Scaling group")
            if asg_provider.get("managedScaling", {}).get("status") == "ENABLED":
                raise CapacityError(
                    f"capacity provider {name!r} has managed scaling ENABLED; ECS would "
                    "overwrite the desired capacity elastune sets, so disable it"
                )
            group = self._scaling_group(name, _asg_name(asg_provider["autoScalingGroupArn"]))
            if group.instance_type in groups:
                other = groups[group.instance_type].capacity_provider
                raise CapacityError(
                    f"capacity providers {other!r} and {name!r} both launch "
                    f"{group.instance_type}; keep one per instance type"
                )
            groups[group.instance_type] = group
        self.groups = groups

    def _scaling_group(self, provider: str, name: str) -> ScalingGroup:
        found = self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[name]
        )["AutoScalingGroups"]
        if not found:
            raise CapacityError(f"Auto Scaling group {name!r} of {provider!r} not found")
        asg = found[0]
        if asg["MinSize"] != 0:
            raise CapacityError(
                f"Auto Scaling group {name!r} has MinSize {asg['MinSize']}; it must be 0 "
                "so the job can scale it to zero"
            )
        instance_type = self._instance_type(asg)
        return ScalingGroup(
            name, provider, instance_type, self._gpus_per_node(instance_type), asg["MaxSize"]
        )

    def _instance_type(self, asg: dict[str, Any]) -> str:
        spec = asg.get("LaunchTemplate")
        mixed = asg.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {})
        overrides = {o["InstanceType"] for o in mixed.get("Overrides", []) if "InstanceType" in o}
        if len(overrides) > 1:
            raise CapacityError(
                f"Auto Scaling group {asg['AutoScalingGroupName']!r} mixes instance types "
                f"{sorted(overrides)}; use one instance type per capacity provider"
            )
        if overrides:
            return overrides.pop()
        spec = spec or mixed.get("LaunchTemplateSpecification")
        if not spec:
            raise CapacityError(
                f"Auto Scaling group {asg['AutoScalingGroupName']!r} has no launch template"
            )
        key = (
            {"LaunchTemplateId": spec["LaunchTemplateId"]}
            if spec.get("LaunchTemplateId")
            else {"LaunchTemplateName": spec["LaunchTemplateName"]}
        )
        versions = self.client("ec2").describe_launch_template_versions(
            **key, Versions=[spec.get("Version") or "$Default"]
        )["LaunchTemplateVersions"]
        instance_type = versions[0]["LaunchTemplateData"].get("InstanceType") if versions else None
        if not instance_type:
            raise CapacityError(
                f"launch template of Auto Scaling group {asg['AutoScalingGroupName']!r} "
                "sets no InstanceType"
            )
        return instance_type

    def _gpus_per_node(self, instance_type: str) -> int:
        try:
            info = self.client("ec2").describe_instance_types(InstanceTypes=[instance_type])
        except ClientError as exc:
            raise CapacityError(f"instance type {instance_type!r}: {exc}") from None
        gpus = sum(g["Count"] for g in info["InstanceTypes"][0].get("GpuInfo", {}).get("Gpus", []))
        if gpus < 1:
            raise CapacityError(f"instance type {instance_type!r} has no GPUs")
        return gpus

    def _group_for(self, demand: Demand) -> ScalingGroup:
        if demand.instance_type is None:
            if len(self.groups) == 1:
                return next(iter(self.groups.values()))
            raise CapacityError(
                f"stage {demand.stage!r} names no instance type and the cluster offers "
                f"{sorted(self.groups)}"
            )
        if demand.instance_type not in self.groups:
            raise CapacityError(
                f"stage {demand.stage!r} needs {demand.instance_type}, but the capacity "
                f"providers of {self.cluster!r} launch only {sorted(self.groups)}"
            )
        return self.groups[demand.instance_type]

    def desired(self, group: ScalingGroup) -> int:
        """The desired capacity of ``group`` now."""
        return self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[group.name]
        )["AutoScalingGroups"][0]["DesiredCapacity"]

    def set_desired(self, group: ScalingGroup, stage: str, nodes: int, detail: str) -> SizingRecord:
        """Set ``group``'s desired capacity to ``nodes``; the record of it."""
        before = self.desired(group)
        # Marked before the call: if the call half-succeeds, release still covers the group.
        self._touched.add(group.name)
        self.stage = stage
        self.client("autoscaling").set_desired_capacity(
            AutoScalingGroupName=group.name, DesiredCapacity=nodes, HonorCooldown=False
        )
        return SizingRecord(stage, f"asg {group.name}", "desired_capacity", before, nodes, detail)

    def target(self, demand: Demand, whole_gpus: bool = True) -> tuple[ScalingGroup, int, str]:
        """The group ``demand``'s stage runs on, the nodes it needs there and why (the
        sizing record's detail). ``whole_gpus``: each trial is an ECS task, which gets whole
        GPUs; a warm node shares its GPUs between trials but never spans two nodes."""
        if not self.groups:
            self.check()
        g = demand.gpus_per_trial
        target = self._group_for(demand)
        if whole_gpus and demand.slots and (g < 1 or not float(g).is_integer()):
            raise CapacityError(
                f"stage {demand.stage!r}: ECS gives whole GPUs to a task, "
                f"gpus_per_trial must be an integer >= 1, got {g:g}"
            )
        if not whole_gpus and demand.slots and not 0 < g <= target.gpus_per_node:
            raise CapacityError(
                f"stage {demand.stage!r}: a warm node trains a segment on 0 < GPUs <= "
                f"{target.gpus_per_node} (a {target.instance_type}), got {g:g}"
            )
        nodes = nodes_needed((g,) * demand.slots, target.gpus_per_node)
        if nodes > target.max_size:
            raise CapacityError(
                f"stage {demand.stage!r} needs {nodes} x {target.instance_type} "
                f"({demand.slots} trials x {g:g} GPUs, {target.gpus_per_node} GPUs per node), "
                f"above MaxSize {target.max_size} of Auto Scaling group {target.name!r}"
            )
        detail = (
            f"{demand.slots} trials x {g:g} GPUs on {target.instance_type} "
            f"({target.gpus_per_node} GPUs/node)"
        )
        return target, nodes, detail

    def fits(self, demand: Demand) -> None:
        self.target(demand)

    def size(self, demand: Demand) -> list[SizingRecord]:
        target, nodes, detail = self.target(demand)
        records = [self.set_desired(target, demand.stage, nodes, detail)]
        for group in self.groups.values():
            if group is not target and self.desired(group) > 0:
                records.append(self.set_desired(group, demand.stage, 0, "not used by this stage"))
        return records

    def wait_ready(self, timeout: float = 600.0, poll: float = 5.0) -> None:
        """Block until every desired instance is registered with the cluster and ACTIVE.

        Without managed scaling ECS does not queue tasks for capacity, so segments should be
        submitted only once their nodes have joined the cluster.
        """
        deadline = time.monotonic() + timeout
        while True:
            short = self._not_ready()
            if not short:
                return
            if time.monotonic() >= deadline:
                raise CapacityError(
                    f"after {timeout:g} s, {short} instance(s) of stage {self.stage!r} "
                    f"have not joined ECS cluster {self.cluster!r}; check that the launch "
                    "template uses the ECS GPU AMI and sets ECS_CLUSTER in its user data"
                )
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def _not_ready(self) -> int:
        ecs = self.client("ecs")
        pages = ecs.get_paginator("list_container_instances").paginate(
            cluster=self.cluster, status="ACTIVE"
        )
        arns = [arn for page in pages for arn in page["containerInstanceArns"]]
        joined = set()
        for i in range(0, len(arns), 100):  # DescribeContainerInstances takes 100 at most
            described = ecs.describe_container_instances(
                cluster=self.cluster, containerInstances=arns[i : i + 100]
            )
            joined |= {c["ec2InstanceId"] for c in described["containerInstances"]}
        short = 0
        for group in self.groups.values():
            asg = self.client("autoscaling").describe_auto_scaling_groups(
                AutoScalingGroupNames=[group.name]
            )["AutoScalingGroups"][0]
            ready = sum(
                1
                for i in asg.get("Instances", [])
                if i["LifecycleState"] == "InService" and i["InstanceId"] in joined
            )
            short += max(0, asg["DesiredCapacity"] - ready)
        return short

    def release(self) -> list[SizingRecord]:
        records = []
        errors = []
        for group in self.groups.values():
            if group.name not in self._touched:
                continue
            try:
                records.append(self.set_desired(group, RELEASE_STAGE, 0, "end of job"))
                self._touched.discard(group.name)
            except (BotoCoreError, ClientError) as exc:
                errors.append(CapacityError(f"could not scale {group.name!r} to zero: {exc}"))
        if errors:
            raise errors[0]
        return records
