"""The ECS capacity backend against moto: real boto3 calls, an in-process fake AWS.

moto does not register Auto Scaling instances with ECS (docs/stack.md §3), so the readiness
test registers them by hand, as the ECS agent would on a real GPU AMI.
"""

from __future__ import annotations

import json
import logging
import math

import boto3
import botocore.session
import pytest
from moto import mock_aws
from prefect_aws import AwsCredentials

from elastune.infra.ecs import EcsCapacity
from elastune.infra.sizing import CapacityError, Demand, MissingCredentials, PoolBackend

REGION = "us-east-1"
# Planted credentials: they must never show up in a log line.
ACCESS_KEY = "AKIAPLANTEDKEY7777777"
SECRET_KEY = "planted/secret+Key-do-not-log-9f8e7d6c5b4a"
# moto knows these types with their real GPU counts (g5.12xlarge: 4 x A10G, g5.xlarge: 1).
BIG, SMALL = "g5.12xlarge", "g5.xlarge"


def _gpus(instance_type: str) -> int:
    info = boto3.client("ec2", region_name=REGION).describe_instance_types(
        InstanceTypes=[instance_type]
    )
    return sum(g["Count"] for g in info["InstanceTypes"][0]["GpuInfo"]["Gpus"])


def _group(name: str, instance_type: str, max_size: int = 4, **provider: str) -> None:
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


def _cluster(*providers: str) -> None:
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


@pytest.fixture(scope="module", autouse=True)
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
def aws(monkeypatch, tmp_path):
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
        _group("big", BIG)
        _group("small", SMALL)
        _cluster("big-cp", "small-cp")
        yield


def backend(**kwargs) -> PoolBackend:
    return PoolBackend("ecs", [EcsCapacity("gpu", **kwargs)])


def test_resolves_groups_from_the_cluster(aws):
    capacity = EcsCapacity("gpu")
    capacity.check()
    assert {t: (g.name, g.gpus_per_node) for t, g in capacity.groups.items()} == {
        BIG: ("big-asg", _gpus(BIG)),
        SMALL: ("small-asg", _gpus(SMALL)),
    }


def test_scales_up_down_and_to_zero_stage_by_stage(aws):
    per_node = _gpus(BIG)
    with backend() as b:
        b.size("b0-r0", slots=2 * per_node, gpus_per_trial=1, instance_type=BIG)
        assert desired("big") == (2, 2)
        b.size("b0-r1", slots=1, gpus_per_trial=2, instance_type=BIG)
        assert desired("big") == (1, 1)
        # Wider than a node: whole nodes, nothing shared (§5.5).
        b.size("b0-r2", slots=1, gpus_per_trial=2 * per_node, instance_type=BIG)
        assert desired("big") == (2, 2)
    assert desired("big") == (0, 0)
    big = [(r.stage, r.before, r.after) for r in b.records if r.target == "asg big-asg"]
    assert big == [("b0-r0", 0, 2), ("b0-r1", 2, 1), ("b0-r2", 1, 2), ("release", 2, 0)]


def test_packs_trials_onto_nodes_best_fit(aws):
    per_node = _gpus(BIG)
    with backend() as b:
        # Three trials of half a node each: two share a node, the third opens another.
        b.size("s", slots=3, gpus_per_trial=per_node // 2, instance_type=BIG)
        assert desired("big")[0] == math.ceil(3 / 2)


def test_scales_to_zero_when_the_job_raises(aws):
    with pytest.raises(RuntimeError, match="segment crashed"), backend() as b:
        b.size("b0-r0", slots=3, gpus_per_trial=1, instance_type=SMALL)
        assert desired("small") == (3, 3)
        raise RuntimeError("segment crashed")
    assert desired("small") == (0, 0)
    assert b.records[-1].stage == "release"


def test_other_instance_type_is_scaled_down_for_the_next_stage(aws):
    with backend() as b:
        b.size("b0-r0", slots=2, gpus_per_trial=1, instance_type=SMALL)
        b.size("b0-r1", slots=1, gpus_per_trial=4, instance_type=BIG)
        assert desired("small") == (0, 0)
        assert desired("big") == (1, 1)
    assert desired("big") == (0, 0)


def test_stage_above_max_size_fails_before_scaling(aws):
    with pytest.raises(CapacityError, match="MaxSize 4"), backend() as b:
        b.size("huge", slots=5, gpus_per_trial=1, instance_type=SMALL)
    assert desired("small") == (0, 0)


def test_a_later_stage_above_max_size_is_refused_before_the_first_is_sized(aws):
    stages = [Demand("b0-r0", 2, 1.0, SMALL), Demand("b0-r1", 5, 1.0, SMALL)]
    b = backend()
    with pytest.raises(CapacityError, match=r"'b0-r1' needs 5 x g5\.xlarge .* MaxSize 4"), b:
        b.check(stages)
        b.size("b0-r0", slots=2, gpus_per_trial=1, instance_type=SMALL)
    assert desired("small") == (0, 0)
    assert [r.stage for r in b.records if r.after] == []  # nothing was ever scaled up


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instance_type": "p4d.24xlarge", "gpus_per_trial": 1}, "launch only"),
        ({"instance_type": None, "gpus_per_trial": 1}, "names no instance type"),
        ({"instance_type": SMALL, "gpus_per_trial": 0.5}, "whole GPUs"),
    ],
)
def test_bad_stage_is_a_clear_error(aws, kwargs, message):
    with pytest.raises(CapacityError, match=message), backend() as b:
        b.size("s", slots=2, **kwargs)


def test_one_provider_needs_no_instance_type(aws):
    with backend(capacity_providers=["small-cp"]) as b:
        b.size("s", slots=2, gpus_per_trial=1)
        assert desired("small") == (2, 2)


def test_managed_scaling_and_min_size_are_refused(aws):
    _group("managed", SMALL, managed="ENABLED")
    with pytest.raises(CapacityError, match="managed scaling ENABLED"):
        EcsCapacity("gpu", capacity_providers=["managed-cp"]).check()
    _group("pinned", SMALL, min_size=1)
    with pytest.raises(CapacityError, match="MinSize 1"):
        EcsCapacity("gpu", capacity_providers=["pinned-cp"]).check()
    with pytest.raises(CapacityError, match="not found"):
        EcsCapacity("no-such-cluster").check()


def test_missing_credentials_is_clear_and_scales_nothing(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(MissingCredentials, match="AWS_ACCESS_KEY_ID"), backend() as b:
        b.size("s", slots=1, gpus_per_trial=1, instance_type=SMALL)
    assert desired("small") == (0, 0)
    assert desired("big") == (0, 0)


def test_missing_region_is_clear(aws, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(MissingCredentials, match="AWS_DEFAULT_REGION"):
        EcsCapacity("gpu").check()


def test_credentials_block_object_is_used(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    block = AwsCredentials(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )
    with backend(credentials=block) as b:
        b.size("s", slots=1, gpus_per_trial=1, instance_type=SMALL)
        assert desired("small") == (1, 1)


def test_no_secret_in_logs(aws, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(RuntimeError), backend() as b:
        b.size("b0-r0", slots=2, gpus_per_trial=1, instance_type=SMALL)
        raise RuntimeError("boom")
    assert "sizing b0-r0: asg small-asg desired_capacity 0 -> 2" in caplog.text
    # botocore's own DEBUG lines carry the key id in request signatures; ours must not.
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("elastune"))
    assert ACCESS_KEY not in ours
    assert SECRET_KEY not in caplog.text
    assert SECRET_KEY not in repr(b.records)


def _register_group_instances(name: str) -> list[str]:
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


def test_wait_ready_needs_instances_joined_to_the_cluster(aws):
    with backend() as b:
        b.size("b0-r0", slots=2, gpus_per_trial=1, instance_type=SMALL)
        with pytest.raises(CapacityError, match="2 instance"):
            b.wait_ready(timeout=0.2)
        _register_group_instances("small")
        b.wait_ready(timeout=0.2)


def test_aws_refusing_the_check_is_bad_input_and_scales_nothing(monkeypatch):
    """An unreachable endpoint or refused keys exit 2 with the AWS error, before any scaling."""
    from botocore.exceptions import EndpointConnectionError

    from elastune.infra.ecs import EcsCapacity
    from elastune.infra.sizing import CapacityError

    capacity = EcsCapacity("gpu-cluster", region="us-east-1")

    def unreachable(*args, **kwargs):
        raise EndpointConnectionError(endpoint_url="https://ecs.us-east-1.amazonaws.com")

    monkeypatch.setattr(capacity, "_check", unreachable)
    with pytest.raises(CapacityError, match=r"compute\.ecs: AWS answered EndpointConnectionError"):
        capacity.check()
