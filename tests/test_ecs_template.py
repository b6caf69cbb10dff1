"""The GPU base job template against prefect-aws's ECS worker, and its RunTask path under moto.

The template is resolved the way the worker resolves it
(``ECSJobConfiguration.from_template_and_values``), with a Prefect client that points at a
closed port: the template holds no block or variable references, so no server is needed,
and any API call would fail the test. The worker's own ``_prepare_and_create_task`` then
registers the task definition and runs the task in moto (docs/stack.md §3). ``async with
ECSWorker(...)`` is never entered: its SQS observer does not work under in-process moto.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import boto3
import pytest
from moto import mock_aws
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun
from prefect.utilities.schema_tools.validation import ValidationError, is_valid_schema, validate
from prefect.utilities.templating import find_placeholders
from prefect_aws.workers.ecs_worker import ECSJobConfiguration, ECSWorker

from elastune.infra import template as gpu
from elastune.infra.template import TEMPLATE_PATH, gpu_job_variables, gpu_template

REGION = "us-east-1"
INSTANCE_TYPE = "g5.12xlarge"


@pytest.fixture(scope="module")
def template() -> dict:
    return json.loads(TEMPLATE_PATH.read_text())


def configuration(template: dict, values: dict) -> ECSJobConfiguration:
    offline = PrefectClient("http://127.0.0.1:9/api")
    return asyncio.run(
        ECSJobConfiguration.from_template_and_values(template, values, client=offline)
    )


def test_file_is_what_the_generator_writes(template):
    assert gpu.main(["--check"]) == 0
    assert template == gpu_template()


def test_variables_schema_is_valid_and_types_gpu_count_as_string(template):
    variables = template["variables"]
    is_valid_schema(variables, preprocess=False)
    # Every placeholder of the job configuration is a declared variable (the server's rule).
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert {"gpu_count", "instance_type"} <= used <= set(variables["properties"])

    def server_side(values: dict) -> None:
        # The check the Prefect server applies to per-run job variables (HTTP 422 if bad).
        validate(
            values,
            variables,
            raise_on_error=True,
            preprocess=True,
            ignore_required=True,
            allow_none_with_default=True,
        )

    server_side({**gpu_job_variables(4, INSTANCE_TYPE), "launch_type": "EC2"})
    for bad in ({"gpu_count": 4}, {"gpu_count": "0"}, {"launch_type": "GPU"}):
        with pytest.raises(ValidationError):
            server_side(bad)
    with pytest.raises(ValueError, match="whole number"):
        gpu_job_variables(0.5)


def test_defaults_give_one_gpu_on_ec2(template):
    cfg = configuration(template, {})
    container = cfg.task_definition["containerDefinitions"][0]
    assert container["resourceRequirements"] == [{"type": "GPU", "value": "1"}]
    assert cfg.task_run_request["launchType"] == "EC2"
    expression = cfg.task_definition["placementConstraints"][0]["expression"]
    assert expression == f"attribute:ecs.instance-type == {gpu.DEFAULT_INSTANCE_TYPE}"


def _join_cluster(instance_id: str, ecs) -> None:
    document = {
        "instanceId": instance_id,
        "region": REGION,
        "availabilityZone": f"{REGION}a",
        "instanceType": INSTANCE_TYPE,
    }
    ecs.register_container_instance(cluster="gpu", instanceIdentityDocument=json.dumps(document))


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        ec2 = boto3.client("ec2")
        ecs = boto3.client("ecs")
        asg = boto3.client("autoscaling")
        ecs.create_cluster(clusterName="gpu")
        ec2.create_launch_template(
            LaunchTemplateName="gpu-lt",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": INSTANCE_TYPE},
        )
        asg.create_auto_scaling_group(
            AutoScalingGroupName="gpu-asg",
            LaunchTemplate={"LaunchTemplateName": "gpu-lt", "Version": "$Latest"},
            MinSize=0,
            MaxSize=2,
            DesiredCapacity=1,
            AvailabilityZones=[f"{REGION}a"],
        )
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-asg"])
        group = group["AutoScalingGroups"][0]
        ecs.create_capacity_provider(
            name="gpu-cp",
            autoScalingGroupProvider={
                "autoScalingGroupArn": group["AutoScalingGroupARN"],
                "managedScaling": {"status": "DISABLED"},
            },
        )
        ecs.put_cluster_capacity_providers(
            cluster="gpu", capacityProviders=["gpu-cp"], defaultCapacityProviderStrategy=[]
        )
        # moto does not register ASG instances with ECS; the ECS agent would.
        _join_cluster(group["Instances"][0]["InstanceId"], ecs)
        yield ecs


@pytest.mark.parametrize(
    "placement",
    [
        {"launch_type": "EC2"},
        {"capacity_provider_strategy": [{"capacityProvider": "gpu-cp", "weight": 1}]},
    ],
    ids=["ec2-launch-type", "capacity-provider"],
)
def test_worker_runs_the_gpu_task(template, cluster, placement):
    values = {
        **gpu_job_variables(2, INSTANCE_TYPE),
        "cluster": "gpu",
        "image": "elastune-train:test",
        **placement,
    }
    cfg = configuration(template, values)
    flow_run = FlowRun(flow_id=uuid.uuid4(), name="segment")
    cfg.prepare_for_flow_run(flow_run)

    worker = ECSWorker(work_pool_name="gpu-ecs")
    task_arn, _ = worker._prepare_and_create_task(logging.getLogger("test"), cluster, cfg, flow_run)

    task = cluster.describe_tasks(cluster="gpu", tasks=[task_arn])["tasks"][0]
    definition = cluster.describe_task_definition(taskDefinition=task["taskDefinitionArn"])
    definition = definition["taskDefinition"]
    container = definition["containerDefinitions"][0]
    assert container["resourceRequirements"] == [{"type": "GPU", "value": "2"}]
    assert container["image"] == "elastune-train:test"
    assert definition["placementConstraints"] == [
        {"type": "memberOf", "expression": f"attribute:ecs.instance-type == {INSTANCE_TYPE}"}
    ]
    assert definition["requiresCompatibilities"] == ["EC2"]
    override = task["overrides"]["containerOverrides"][0]
    assert override["command"] == ["prefect", "flow-run", "execute"]
    if "capacity_provider_strategy" in placement:
        assert task.get("capacityProviderName") == "gpu-cp"
    else:
        assert task["launchType"] == "EC2"
