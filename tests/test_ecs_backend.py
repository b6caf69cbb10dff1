"""The ECS capacity backend against moto: real boto3 calls, an in-process fake AWS.

moto does not register Auto Scaling instances with ECS (docs/stack.md §3), so the readiness
test registers them by hand, as the ECS agent would on a real GPU AMI.
"""

from __future__ import annotations

import logging
import math

import pytest
from prefect_aws import AwsCredentials

from elastune.infra.ecs import EcsCapacity
from elastune.infra.sizing import CapacityError, Demand, MissingCredentials, PoolBackend
from tests.helpers.aws import (
    ACCESS_KEY,
    BIG,
    REGION,
    SECRET_KEY,
    SMALL,
    desired,
    gpus_of,
    make_group,
    register_group_instances,
)

pytestmark = pytest.mark.usefixtures("fast_moto")


def backend(**kwargs) -> PoolBackend:
    return PoolBackend("ecs", [EcsCapacity("gpu", **kwargs)])


def test_resolves_groups_from_the_cluster(aws):
    capacity = EcsCapacity("gpu")
    capacity.check()
    assert {t: (g.name, g.gpus_per_node) for t, g in capacity.groups.items()} == {
        BIG: ("big-asg", gpus_of(BIG)),
        SMALL: ("small-asg", gpus_of(SMALL)),
    }


def test_scales_up_down_and_to_zero_stage_by_stage(aws):
    per_node = gpus_of(BIG)
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
    per_node = gpus_of(BIG)
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
    make_group("managed", SMALL, managed="ENABLED")
    with pytest.raises(CapacityError, match="managed scaling ENABLED"):
        EcsCapacity("gpu", capacity_providers=["managed-cp"]).check()
    make_group("pinned", SMALL, min_size=1)
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


def test_wait_ready_needs_instances_joined_to_the_cluster(aws):
    with backend() as b:
        b.size("b0-r0", slots=2, gpus_per_trial=1, instance_type=SMALL)
        with pytest.raises(CapacityError, match="2 instance"):
            b.wait_ready(timeout=0.2)
        register_group_instances("small")
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
