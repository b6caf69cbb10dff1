"""AWS under moto for the ECS tests: a region, planted credentials, Auto Scaling groups of
GPU instances in a cluster, and the warm node worker's services on it."""

from __future__ import annotations

import json

import boto3
import botocore.session
import pytest
from moto import mock_aws

from elastune.infra.ecs import EcsCapacity
from elastune.infra.ecs_warm import WarmServices, WarmWorker, family

# moto knows these types with their real GPU counts (g5.12xlarge: 4 x A10G, g5.xlarge: 1).
BIG, SMALL = "g5.12xlarge", "g5.xlarge"


REGION = "us-east-1"


# Planted credentials: they must never show up in a log line.
ACCESS_KEY = "AKIAPLANTEDKEY7777777"


SECRET_KEY = "planted/secret+Key-do-not-log-9f8e7d6c5b4a"


def gpus_of(instance_type: str) -> int:
    info = boto3.client("ec2", region_name=REGION).describe_instance_types(
        InstanceTypes=[instance_type]
    )
    return sum(g["Count"] for g in info["InstanceTypes"][0]["GpuInfo"]["Gpus"])


def make_group(name: str, instance_type: str, max_size: int = 4, **provider: str) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    asg = boto3.client("autoscaling", region_name=REGION)
    ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": instance_type},
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=f"{name}-asg",
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt", "Version": "$Latest"},
        MinSize=int(provider.pop("min_size", 0)),
        MaxSize=max_size,
        DesiredCapacity=0,
        AvailabilityZones=[f"{REGION}a"],
    )
    arn = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[f"{name}-asg"])[
        "AutoScalingGroups"
    ][0]["AutoScalingGroupARN"]
    boto3.client("ecs", region_name=REGION).create_capacity_provider(
        name=f"{name}-cp",
        autoScalingGroupProvider={
            "autoScalingGroupArn": arn,
            "managedScaling": {"status": provider.get("managed", "DISABLED")},
            "managedTerminationProtection": "DISABLED",
        },
    )


def make_cluster(*providers: str) -> None:
    ecs = boto3.client("ecs", region_name=REGION)
    ecs.create_cluster(clusterName="gpu")
    ecs.put_cluster_capacity_providers(
        cluster="gpu",
        capacityProviders=list(providers),
        defaultCapacityProviderStrategy=[{"capacityProvider": providers[0], "weight": 1}],
    )


def desired(name: str) -> tuple[int, int]:
    """(desired capacity, instances moto launched) of Auto Scaling group ``name``."""
    asg = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[f"{name}-asg"]
    )["AutoScalingGroups"][0]
    return asg["DesiredCapacity"], len(asg["Instances"])


@pytest.fixture(scope="module")
def fast_moto():
    """Skip the two costs that dominate these tests, ~0.5 s each, without faking any call.

    - One botocore loader for every session: moto resets boto3's default session on each
      start and every backend opens its own, so each re-parsed the EC2 service model.
    - moto's catalogue of public AMIs, loaded on every reset; the tests use a made-up AMI.
    """
    loader = botocore.session.create_loader()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(botocore.session, "create_loader", lambda *args, **kwargs: loader)
        mp.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        yield


@pytest.fixture
def aws(monkeypatch, tmp_path, fast_moto):
    """A fake AWS account with credentials in the environment and a two-type GPU cluster."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    # No real profile, file or instance role may leak into the default chain.
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # mock_credentials False: boto3 signs with the planted keys, as it would in production.
    with mock_aws(config={"core": {"mock_credentials": False}}):
        make_group("big", BIG)
        make_group("small", SMALL)
        make_cluster("big-cp", "small-cp")
        yield


POOL = "gpu-warm"


WORKER = WarmWorker(
    POOL,
    "s3-bucket/elastune-segments",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/elastune-train:latest",
    "http://prefect.internal:4200/api",
    "http://mlflow.internal:5000",
)


def container_instances() -> dict[str, dict]:
    """The cluster's container instances by EC2 instance id."""
    arns = ecs().list_container_instances(cluster="gpu")["containerInstanceArns"]
    if not arns:
        return {}
    found = ecs().describe_container_instances(cluster="gpu", containerInstances=arns)
    return {c["ec2InstanceId"]: c for c in found["containerInstances"]}


def tasks_on(container_instance: str) -> set[str]:
    """The ids of the ECS tasks on a container instance."""
    listed = ecs().list_tasks(cluster="gpu", containerInstance=container_instance)["taskArns"]
    return {arn.rsplit("/", 1)[-1] for arn in listed}


def join(group: str, instance_type: str) -> dict[str, str]:
    """The ECS agent and the DAEMON scheduler: each instance of ``group`` not yet in the
    cluster joins it and gets its warm task. The node (task id) on each joined instance of
    the group."""
    for arn in register_group_instances(group):
        ecs().start_task(
            cluster="gpu", taskDefinition=family(POOL, instance_type), containerInstances=[arn]
        )
    asg = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[f"{group}-asg"]
    )["AutoScalingGroups"][0]
    serving = {i["InstanceId"] for i in asg["Instances"]}
    return {
        i: next(iter(tasks_on(c["containerInstanceArn"])))
        for i, c in container_instances().items()
        if i in serving
    }


def ecs():
    return boto3.client("ecs", region_name=REGION)


def services() -> WarmServices:
    return WarmServices(EcsCapacity("gpu"))


def register_group_instances(name: str) -> list[str]:
    """What the ECS agent does on boot: each instance of the group not in the cluster yet
    joins it with its identity. The container instance ARNs of those that joined now."""
    asg = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[f"{name}-asg"]
    )["AutoScalingGroups"][0]
    ecs = boto3.client("ecs", region_name=REGION)
    listed = ecs.list_container_instances(cluster="gpu")["containerInstanceArns"]
    joined = set()
    if listed:  # DescribeContainerInstances refuses an empty list
        described = ecs.describe_container_instances(cluster="gpu", containerInstances=listed)
        joined = {c["ec2InstanceId"] for c in described["containerInstances"]}
    arns = []
    for instance in asg["Instances"]:
        if instance["InstanceId"] in joined:
            continue
        document = {
            "instanceId": instance["InstanceId"],
            "region": REGION,
            "availabilityZone": instance["AvailabilityZone"],
            "instanceType": instance["InstanceType"],
        }
        registered = ecs.register_container_instance(
            cluster="gpu", instanceIdentityDocument=json.dumps(document)
        )
        arns.append(registered["containerInstance"]["containerInstanceArn"])
    return arns
