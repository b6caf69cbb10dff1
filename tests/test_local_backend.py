"""Pool sizing against a real ``prefect server`` and ``prefect worker`` on loopback.

One server for the module (~10 s to start); a process worker only where a test needs one.
The ECS backend is exercised here end to end too: its Prefect half needs the server, its
AWS half runs in moto.
"""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws
from prefect import flow
from prefect.artifacts import Artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.settings import PREFECT_API_URL
from prefect_aws import AwsCredentials

from elastune.infra.backends import ecs_backend, local_backend, make_backend
from elastune.infra.prefect_pools import read_pool, wait_for_worker
from elastune.infra.sizing import (
    MissingCredentials,
    NoWorker,
    PoolNotFound,
    PoolTypeMismatch,
    publish_sizing,
)
from elastune.infra.template import TEMPLATE_PATH
from tests.helpers.prefect_server import running_worker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

REGION = "us-east-1"


def create_pool(name: str, pool_type: str = "process", template: dict | None = None) -> None:
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(name=name, type=pool_type, base_job_template=template or {})
        )


def limit(name: str) -> int | None:
    return read_pool(name).concurrency_limit


def test_local_backend_follows_the_plan_stage_by_stage():
    create_pool("local-a")
    seen = []
    with local_backend("local-a") as backend:
        for stage, slots in (("b0-r0", 9), ("b0-r1", 3), ("b0-r2", 1)):
            backend.size(stage, slots=slots)
            seen.append(limit("local-a"))
    assert seen == [9, 3, 1]
    # The pool had no limit before the job; it gets none back.
    assert limit("local-a") is None
    rows = [(r.stage, r.before, r.after) for r in backend.records]
    assert rows == [("b0-r0", None, 9), ("b0-r1", 9, 3), ("b0-r2", 3, 1), ("release", 1, None)]

    # Inside a flow run, as the tune flow does (artifacts outside runs are deprecated).
    flow(publish_sizing, name="publish")(backend.records, key="local-a-sizing")
    table = json.loads(Artifact.get("local-a-sizing").data)
    assert [(row["stage"], row["after"]) for row in table] == [
        ("b0-r0", 9), ("b0-r1", 3), ("b0-r2", 1), ("release", "none"),
    ]  # fmt: skip


def test_limit_is_restored_when_the_job_raises():
    create_pool("local-b")
    with get_client(sync_client=True) as client:
        client.update_work_pool("local-b", WorkPoolUpdate(concurrency_limit=5))
    with pytest.raises(KeyError), make_backend("local", "local-b") as backend:
        backend.size("b0-r0", slots=2)
        assert limit("local-b") == 2
        raise KeyError("trial 7")
    assert limit("local-b") == 5


def test_missing_pool_and_wrong_type_are_clear():
    with (
        pytest.raises(PoolNotFound, match="'no-such-pool' not found"),
        local_backend("no-such-pool"),
    ):
        pass
    create_pool("gpu-ecs-typed", "ecs", json.loads(TEMPLATE_PATH.read_text()))
    with (
        pytest.raises(PoolTypeMismatch, match=r"type 'ecs'.*needs 'process'"),
        local_backend("gpu-ecs-typed"),
    ):
        pass
    with pytest.raises(PoolNotFound):
        wait_for_worker("no-such-pool", timeout=0)


def test_wait_for_worker(tmp_path):
    create_pool("polled")
    with pytest.raises(NoWorker, match=r"'polled' within 0\.5 s"):
        wait_for_worker("polled", timeout=0.5)
    with running_worker(PREFECT_API_URL.value(), "polled", tmp_path / "worker"):
        assert wait_for_worker("polled", timeout=60, poll=0.5)


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """One-type GPU cluster in moto; credentials only where a test puts them."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws(config={"core": {"mock_credentials": False}}):
        admin = boto3.Session("admin-key", "admin-secret", region_name=REGION)
        admin.client("ec2").create_launch_template(
            LaunchTemplateName="gpu-lt",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.12xlarge"},
        )
        asg = admin.client("autoscaling")
        asg.create_auto_scaling_group(
            AutoScalingGroupName="gpu-asg",
            LaunchTemplate={"LaunchTemplateName": "gpu-lt", "Version": "$Latest"},
            MinSize=0,
            MaxSize=4,
            DesiredCapacity=0,
            AvailabilityZones=[f"{REGION}a"],
        )
        arn = asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["AutoScalingGroupARN"]
        ecs = admin.client("ecs")
        ecs.create_cluster(clusterName="gpu")
        ecs.create_capacity_provider(
            name="gpu-cp",
            autoScalingGroupProvider={
                "autoScalingGroupArn": arn,
                "managedScaling": {"status": "DISABLED"},
            },
        )
        ecs.put_cluster_capacity_providers(
            cluster="gpu", capacityProviders=["gpu-cp"], defaultCapacityProviderStrategy=[]
        )

        def desired() -> int:
            groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-asg"])
            return groups["AutoScalingGroups"][0]["DesiredCapacity"]

        yield desired


def test_ecs_backend_sizes_limit_and_capacity_with_a_named_block(aws):
    create_pool("gpu-ecs", "ecs", json.loads(TEMPLATE_PATH.read_text()))
    AwsCredentials(
        aws_access_key_id="block-key", aws_secret_access_key="block-secret", region_name=REGION
    ).save("elastune-aws", overwrite=True)
    steps = []
    with ecs_backend("gpu-ecs", "gpu", credentials="elastune-aws") as backend:
        for stage, trials, gpus in (("b0-r0", 8, 1), ("b0-r1", 2, 2), ("b0-r2", 1, 4)):
            backend.size(stage, slots=trials, gpus_per_trial=gpus, instance_type="g5.12xlarge")
            steps.append((limit("gpu-ecs"), aws()))
    # g5.12xlarge has 4 GPUs: 8x1 -> 2 nodes, 2x2 -> 1 node, 1x4 -> 1 node.
    assert steps == [(8, 2), (2, 1), (1, 1)]
    assert (limit("gpu-ecs"), aws()) == (None, 0)


def test_ecs_backend_missing_block_or_credentials_scales_nothing(aws):
    create_pool("gpu-ecs-2", "ecs", json.loads(TEMPLATE_PATH.read_text()))
    with (
        pytest.raises(MissingCredentials, match="'nope' not found"),
        ecs_backend("gpu-ecs-2", "gpu", credentials="nope"),
    ):
        pass
    with (
        pytest.raises(MissingCredentials, match="AWS_ACCESS_KEY_ID"),
        ecs_backend("gpu-ecs-2", "gpu", region=REGION) as backend,
    ):
        backend.size("b0-r0", slots=1, gpus_per_trial=1)
    assert (limit("gpu-ecs-2"), aws()) == (None, 0)
