"""Fluid in the staged flow: each stage's segments are packed onto its GPUs.

The planners tests check the decisions (widths, admission by free GPUs, who gets packed at
all); the slow test runs a real SHA job on CPU, where the GPUs are gloo processes, and
checks that the top rung's survivor trained on 2 of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from elastune.planners.cost.pricing.catalog import parse_catalog, read_catalog
from elastune.planners.search import Segment
from elastune.planners.spec import parse_job
from elastune.planners.staging import Plan, Profile, Stage, StagePacker, compile_plan, stage_packer
from tests.helpers.jobs import PACKABLE_JOB


def segments(stage: Stage, trials: range) -> list[Segment]:
    return [Segment(t, stage.start, stage.stop, stage.rung, stage.bracket) for t in trials]


def admit(packer: StagePacker, waiting: list[Segment], running: list[Segment]) -> list[float]:
    """Offer ``waiting`` in order next to ``running``; the widths of those admitted."""
    widths = []
    for segment in waiting:
        if packer.may_start(segment, running):
            running.append(segment)
            widths.append(packer.width(segment))
    return widths


def test_survivors_of_the_top_rungs_take_the_idle_gpus():
    # 24 -> 8 -> 3 -> 1 trials on 8 GPUs; data-parallel scaling is sublinear.
    ladder = enumerate([24, 8, 3, 1])
    plan = Plan(tuple(Stage(0, k, n, 3 ** (k - 1) if k else 0, 3**k) for k, n in ladder), 8)
    packer = StagePacker(plan, Profile.from_speeds({2: 1.8, 4: 3.2, 8: 5.6}), gpus=8)
    trial = iter(range(1000))
    widths = []
    for stage in plan.stages:
        waiting = segments(stage, range(next(trial), next(trial) + stage.trials))
        running: list[Segment] = []
        widths.append(admit(packer, waiting, running))
    # Rung 0 and 1: more trials than GPUs, one GPU each, eight at a time.
    assert widths[0] == [1.0] * 8 and widths[1] == [1.0] * 8
    # Rung 2: the 3 survivors run wide (together or in turn); rung 3: the last takes all 8.
    assert widths[2] and all(w > 1 for w in widths[2]) and sum(widths[2]) <= 8
    assert widths[3] == [8.0]


def test_segments_are_admitted_by_free_gpus_not_by_count():
    plan = Plan((Stage(0, 0, 2, 0, 1),), workers=4)
    packer = StagePacker(plan, Profile.linear(4), gpus=4)
    first, second = segments(plan.stages[0], range(2))
    assert packer.may_start(first, []) and packer.width(first) == 2.0
    # Two segments at width 2 fill the pool: a third segment of width 2 must wait.
    assert packer.may_start(second, [first]) and packer.width(second) == 2.0
    assert not packer.may_start_any([first, second])
    # When the first finishes (absent from running), its GPUs are free again.
    assert packer.may_start_any([second])


def test_a_planned_stage_packs_onto_its_own_slots_times_gpus():
    plan = Plan(
        (
            Stage(0, 0, 4, 0, 1, gpus_per_trial=1.0, slots=4, instance_type="p3.8xlarge"),
            Stage(0, 1, 1, 1, 3, gpus_per_trial=1.0, slots=1, instance_type="p3.8xlarge"),
            Stage(1, 0, 2, 0, 3, gpus_per_trial=2.0, slots=2, instance_type="p3.8xlarge"),
        ),
        workers=2,
    )
    nodes = {"p3.8xlarge": read_catalog().get("p3.8xlarge")}
    packer = StagePacker(plan, Profile.linear(4), gpus=2, nodes=nodes)
    rung0 = segments(plan.stages[0], range(4))
    running: list[Segment] = []
    assert admit(packer, rung0, running) == [1.0] * 4
    # Another bracket's stage has its own 4 GPUs, whatever the first one holds.
    other = segments(plan.stages[2], range(10, 12))
    assert admit(packer, other, running) == [2.0, 2.0]
    # A stage planned at 1 slot x 1 GPU gets 1 GPU, even with GPUs idle elsewhere.
    top = segments(plan.stages[1], range(20, 21))
    assert admit(packer, top, []) == [1.0]
    assert packer.demand(plan.stages[:1]) == (4, 1.0)


def test_a_stage_re_planned_in_flight_packs_what_it_has_not_started_over_its_new_gpus():
    def plan(rung0_slots: int, rung1_slots: int) -> Plan:
        return Plan(
            (
                Stage(0, 0, 8, 0, 1, slots=rung0_slots, instance_type="g5.12xlarge"),
                Stage(0, 1, 2, 1, 3, slots=rung1_slots, instance_type="g5.12xlarge"),
            ),
            workers=2,
        )

    before = plan(2, 1)
    packer = StagePacker(before, Profile.from_speeds({2: 1.8}), gpus=2)
    rung0 = segments(before.stages[0], range(8))
    running: list[Segment] = []
    assert admit(packer, rung0[:3], running) == [1.0, 1.0]  # its 2 GPUs: the third waits
    # Rung 1 re-planned, rung 0 kept: rung 0 goes on as packed, still on 2 GPUs.
    kept = packer.replanned(plan(2, 2))
    assert not kept.may_start(rung0[2], running)
    # Rung 0 re-planned onto 4 GPUs: the two running keep theirs, two more start.
    wider = packer.replanned(plan(4, 1))
    assert admit(wider, rung0[2:5], running) == [1.0, 1.0]
    assert [wider.width(s) for s in rung0[:4]] == [1.0] * 4
    assert not packer.may_start(rung0[4], rung0[:2])  # the packer before is as it was


def test_widths_stay_on_one_node_and_within_the_cap():
    plan = Plan((Stage(0, 0, 1, 0, 1),), workers=8)
    top = segments(plan.stages[0], range(1))
    assert admit(StagePacker(plan, Profile.linear(8), gpus=8, gpus_per_node=2), top, []) == [2.0]
    assert admit(StagePacker(plan, Profile.linear(8), gpus=8, max_width=4), top, []) == [4.0]
    # A width the profile does not cover is never chosen: 3 GPUs free, the profile has 1, 2.
    assert admit(StagePacker(plan, Profile.from_speeds({2: 1.9}), gpus=3), top, []) == [2.0]


def test_a_stage_that_starts_while_others_run_packs_over_what_they_left():
    plan = Plan((Stage(0, 0, 3, 0, 1), Stage(1, 1, 1, 1, 3)), workers=4)
    packer = StagePacker(plan, Profile.linear(4), gpus=4)
    busy = segments(plan.stages[0], range(3))
    running: list[Segment] = []
    assert sum(admit(packer, busy, running)) == 4
    running = running[1:]  # one finished: its GPUs (one or two) are what is left
    left = 4 - sum(packer.width(s) for s in running)
    (width,) = admit(packer, segments(plan.stages[1], range(5, 6)), running)
    assert width == left


def test_gpu_sharing_only_where_it_pays():
    plan = Plan((Stage(0, 0, 8, 0, 1),), workers=2)
    rung0 = segments(plan.stages[0], range(8))
    pays = StagePacker(plan, Profile.from_speeds(sharing={2: 0.8}), gpus=2)
    assert admit(pays, rung0, []) == [0.5] * 4  # two per GPU: 2 x 0.8 > 1
    assert pays.demand(plan.stages) == (4, 0.5)
    slower = StagePacker(plan, Profile.from_speeds(sharing={2: 0.4}), gpus=2)
    assert admit(slower, rung0, []) == [1.0] * 2


def test_the_job_profile_becomes_the_packers():
    # 3 GPUs is measured too: any whole count the profile has is a width.
    profile = Profile({0.5: 1.25, 1: 1.0, 2: 0.55, 4: 0.3125, 3: 0.4})
    assert profile.packable
    assert profile.speedup == pytest.approx({1: 1.0, 2: 1 / 0.55, 3: 2.5, 4: 3.2})
    assert profile.sharing == pytest.approx({2: 0.8})
    assert not Profile({2: 0.5, 4: 0.3}).packable  # no timing on one GPU
    # A share that claims to run faster than a whole GPU is not trusted.
    assert Profile({0.5: 0.5, 1: 1.0}).sharing == {}


def test_no_speedup_or_no_data_parallel_trainable_keeps_todays_admission():
    spec = parse_job(PACKABLE_JOB)
    plan = compile_plan(spec)
    assert isinstance(stage_packer(spec, plan, distributed=True), StagePacker)
    assert stage_packer(spec, plan, distributed=False) is None
    assert stage_packer(spec, None, distributed=True) is None
    flat = parse_job({**PACKABLE_JOB, "profile": {"seconds_per_unit": {1: 1.0, 2: 1.0}}})
    assert stage_packer(flat, plan, distributed=True) is None  # S(2) = 1 helps nobody
    assert (
        stage_packer(parse_job({**PACKABLE_JOB, "profile": None}), plan, distributed=True) is None
    )
    one_gpu = parse_job({**PACKABLE_JOB, "compute": {"workers": 2, "max_gpus": 1}})
    assert stage_packer(one_gpu, plan, distributed=True) is None


def test_a_stage_planned_below_one_gpu_still_runs_on_one():
    plan = Plan((Stage(0, 0, 2, 0, 1, slots=1, gpus_per_trial=0.5),), workers=1)
    packer = StagePacker(plan, Profile.from_speeds({2: 1.8}, sharing={2: 0.8}), gpus=1)
    assert admit(packer, segments(plan.stages[0], range(2)), []) == [0.5, 0.5]


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="gpus must be an integer >= 1, got 0"):
        StagePacker(Plan((), workers=1), Profile.from_speeds(), gpus=0)
    with pytest.raises(ValueError, match="max_share 3 is not covered"):
        StagePacker(Plan((), workers=1), Profile.from_speeds(sharing={2: 0.8}), gpus=1, max_share=3)


@pytest.mark.slow
def test_a_real_staged_job_runs_its_top_rung_survivor_at_width_two(tmp_path: Path, stores, capsys):
    from elastune.flows.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(PACKABLE_JOB))
    code = main(["run", str(path), "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["trials"] == 2 and summary["segments"] == 3

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(PACKABLE_JOB["name"])
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}'"
    )
    worlds = {
        r.data.tags["elastune.status"]: [
            (m.step, m.value) for m in client.get_metric_history(r.info.run_id, "world_size")
        ]
        for r in runs
    }
    # Rung 0: two trials on the two GPUs, one each; rung 1: the survivor on both (gloo).
    assert sorted(worlds) == ["complete", "stop"]
    assert worlds["stop"] == [(1, 1.0)]
    assert sorted(worlds["complete"]) == [(1, 1.0), (2, 2.0)]
    survivor = next(r for r in runs if r.data.tags["elastune.status"] == "complete")
    assert survivor.data.tags["elastune.gpus"] == "2"


def test_the_measured_gpu_profile_packs_small_trials_onto_one_gpu():
    # `elastune profile examples/cnn.yaml --shares 1,0.5,0.25` on an H100
    # (benchmarks/results/gpu_profile.yaml): 2 trials per GPU each run at 0.69 of full
    # speed, 4 at 0.61, so sharing pays (1.38x and 2.45x the throughput of one).
    measured = {1: 0.4154, 0.5: 0.6008, 0.25: 0.6780}
    job = {
        **PACKABLE_JOB,
        "trainable": "tests.trainables:quadratic",
        "profile": {"seconds_per_unit": measured},
    }
    job["compute"] = {"workers": 1, "max_gpus": 1}
    spec = parse_job(job)
    plan = compile_plan(spec)
    packer = stage_packer(spec, plan, distributed=False, devices=1)
    assert packer is not None
    assert admit(packer, segments(plan.stages[0], range(2)), []) == [0.5, 0.5]
    # Had sharing not paid (each of 2 trials below half speed), one trial at a time.
    slow = {**job, "profile": {"seconds_per_unit": {1: 0.4154, 0.5: 0.9}}}
    assert stage_packer(parse_job(slow), plan, distributed=False, devices=1) is None


def test_a_stage_packs_counting_what_each_segment_pays_outside_its_units():
    # Two trials sharing the one GPU train at 1.9 s a unit each, one alone at 1 s. Nine
    # 1-unit segments: alone, 9 waves; shared, 5. The overhead every segment pays decides.
    plan = Plan((Stage(0, 0, 9, 0, 1),), 1)
    shares = {0.5: 1.9, 1: 1.0}
    rung0 = segments(plan.stages[0], range(9))
    lean = StagePacker(plan, Profile(shares), gpus=1)
    assert admit(lean, rung0, []) == [1.0]  # 9 s against 9.5 s
    costly = StagePacker(plan, Profile(shares, overhead_s=0.5), gpus=1)
    assert admit(costly, rung0, []) == [0.5, 0.5]  # 13.5 s against 12 s


def test_a_stage_weighs_the_overhead_against_its_own_gpus_unit():
    # 0.15 s a segment is 0.15 of a unit on the profile's V100, where two sharing a GPU pay
    # (5 waves x 2.05 = 10.25 s, against 9 x 1.15 = 10.35); on a T4 twice as slow, 0.075 of
    # one, where one at a time pays (9 x 2.15 = 19.35 s, against 5 x 3.95 = 19.75).
    stage = Stage(0, 0, 9, 0, 1, gpus_per_trial=0.5, slots=2, instance_type="box")
    plan = Plan((stage,), 1)
    profile = Profile({0.5: 1.9, 1: 1.0}, overhead_s=0.15, gpu="V100", gpu_speed={"T4": 0.5})
    rung0 = segments(stage, range(9))
    for gpu, widths in (("V100", [0.5, 0.5]), ("T4", [1.0])):
        box = parse_catalog(
            {"instance_types": {"box": {"gpus": 1, "gpu": gpu, "price_per_hour": 1.0}}}
        ).get("box")
        packer = StagePacker(plan, profile, gpus=1, nodes={"box": box})
        assert admit(packer, rung0, []) == widths, gpu
