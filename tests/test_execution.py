"""The execution plan (elastune.planners.execution): which admission policy a job gets, what
``compute.packing`` does, and the mode a user reads; the policies' own decisions
(planners.admission); and the mode as ``elastune run`` and ``elastune plan`` report it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from elastune.flows.cli import main
from elastune.flows.pools import PoolSizer
from elastune.infra.sizing import CapacityError, Demand, PoolBackend, Sizer, SizingRecord
from elastune.planners.cost import read_catalog
from elastune.planners.execution import resolve_execution
from elastune.planners.execution.resolve import _check_in_flight
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import MAX_WORKERS, SpecError, parse_job
from elastune.planners.staging.admission import StageSlots, WorkerCap
from elastune.planners.staging.plan import Plan, Stage
from elastune.planners.staging.stagepack import StagePacker
from tests.helpers.jobs import PACKABLE_JOB as PACKABLE
from tests.helpers.jobs import assert_rejected

ASHA = {"name": "asha", "eta": 3, "min_resource": 1, "max_resource": 9}
PLANNED = {
    "budget": {"deadline": "2h"},
    "compute": {"workers": 2, "instance_types": ["g5.xlarge", "g5.12xlarge"]},
    "profile": {"seconds_per_unit": {1: 60}},
}


def job(**sections: object) -> dict:
    return {**yaml.safe_load(yaml.safe_dump(PACKABLE)), **sections}


def compute(**fields: object) -> dict:
    return {"workers": 2, **fields}


# --- which policy, which mode --------------------------------------------------------------


def test_auto_packs_a_distributed_trainable_with_a_speedup() -> None:
    execution = resolve_execution(parse_job(job()), distributed=True)
    assert isinstance(execution.admission, StagePacker)
    assert str(execution.mode) == "mode: not planned, packed (fluid), workers = GPUs"
    assert execution.mode.to_dict() == {
        "planned": False,
        "limits": None,
        "unplanned": None,
        "packed": True,
        "replanned": False,
        "stops_at": None,
        "workers": "GPUs",
    }


def test_auto_does_not_pack_what_would_not_gain() -> None:
    # Not data-parallel: widths above 1 are out, and the profile measured no sharing.
    execution = resolve_execution(parse_job(job()), distributed=False)
    assert execution.admission == WorkerCap(2)
    assert str(execution.mode) == "mode: not planned, not packed, workers = segments"


@pytest.mark.parametrize(
    ("sections", "why"),
    [
        ({"scheduler": ASHA}, "asha is asynchronous, the cost planner plans sha and hyperband"),
        ({"profile": None}, "the job has no profile, `elastune profile` measures one"),
    ],
    ids=["asynchronous", "no profile"],
)
def test_a_budget_left_unplanned_says_why(sections: dict, why: str) -> None:
    data = job(**{**PLANNED, "budget": {"deadline": "2h", "max_cost_usd": 9}, **sections})
    mode = resolve_execution(parse_job(data), distributed=False).mode
    assert mode.limits is None
    assert mode.unplanned == f"budget.deadline and budget.max_cost_usd not planned to: {why}"
    assert str(mode).startswith(f"mode: not planned ({mode.unplanned}), ")


def test_off_never_packs() -> None:
    spec = parse_job(job(compute=compute(packing="off")))
    assert resolve_execution(spec, distributed=True).admission == WorkerCap(2)


def test_only_a_worker_cap_queues_segments_ahead_on_a_warm_pool() -> None:
    capped = resolve_execution(parse_job(job()), distributed=False).queued_on_nodes()
    assert capped.admission == WorkerCap(2, ahead=2)
    assert capped.admission.demand([]) == (2, 1.0)  # the pool is sized as before
    two = [Segment(t, 0, 1, rung=0) for t in range(2)]
    assert capped.admission.may_start(Segment(2, 0, 1, rung=0), two)
    assert str(capped.mode).endswith("workers = segments (as many more queued on nodes)")
    packed = resolve_execution(parse_job(job()), distributed=True)
    assert packed.queued_on_nodes() is packed
    planned = resolve_execution(parse_job(job(**PLANNED)), distributed=False)
    assert isinstance(planned.admission, StageSlots) and planned.queued_on_nodes() is planned


@pytest.mark.parametrize(
    ("why", "sections", "distributed", "reason"),
    [
        ("not distributed", {}, False, "trainable tests.trainables:wide_quadratic is not"),
        ("asynchronous", {"scheduler": ASHA}, True, "asha is asynchronous"),
        ("no profile", {"profile": None}, True, "packing needs a profile"),
        ("flat profile", {"profile": {"seconds_per_unit": {1: 1, 2: 1}}}, True, "no speedup"),
    ],
)
def test_on_where_packing_cannot_is_bad_input(why, sections, distributed, reason) -> None:
    spec = parse_job(job(**sections, compute=compute(packing="on")))
    with pytest.raises(SpecError, match=r"^compute\.packing: on, but ") as error:
        resolve_execution(spec, distributed=distributed)
    assert reason in str(error.value)


def test_on_where_packing_pays_packs() -> None:
    spec = parse_job(job(compute=compute(packing="on")))
    assert isinstance(resolve_execution(spec, distributed=True).admission, StagePacker)


def test_yaml_on_and_off_are_the_words() -> None:
    for text, word in (("on", "on"), ("off", "off"), ("auto", "auto")):
        assert parse_job(job(compute=yaml.safe_load(f"packing: {text}"))).compute.packing == word
    with pytest.raises(SpecError, match=r"compute\.packing"):
        parse_job(job(compute={"packing": "always"}))


def test_a_planned_job_admits_by_its_stage_slots() -> None:
    execution = resolve_execution(parse_job(job(**PLANNED)), distributed=False)
    assert isinstance(execution.admission, StageSlots)
    assert execution.plan is not None and all(s.slots for s in execution.plan.stages)
    assert str(execution.mode) == (
        "mode: planned (deadline 2h), not packed, re-planned in flight, stops after 2h, "
        "workers = not used (the cost plan sets each stage's concurrency)"
    )


def test_packing_onto_max_gpus_says_workers_are_not_used() -> None:
    spec = parse_job(job(compute=compute(max_gpus=2)))
    mode = resolve_execution(spec, distributed=True).mode
    assert mode.packed and mode.workers == "not used (stages share compute.max_gpus = 2 GPUs)"


def test_a_planned_job_packs_its_stages_or_finds_a_width_it_cannot_run() -> None:
    wide = {"seconds_per_unit": {1: 1800}, "speedup": {2: 1.9, 4: 3.9}}
    spec = parse_job(job(**{**PLANNED, "profile": wide, "budget": {"deadline": "1h"}}))
    execution = resolve_execution(spec, distributed=True)
    assert isinstance(execution.admission, StagePacker)
    assert execution.plan is not None and max(s.gpus_per_trial for s in execution.plan.stages) > 1
    mode = "mode: planned (deadline 1h), packed (fluid), re-planned in flight,"
    assert str(execution.mode).startswith(mode)
    # A re-plan in flight may move a stage to another type: the packer knows every type's
    # node, not only the types the plan starts on.
    assert execution.admission.nodes == read_catalog().instance_types
    # The same plan for a trainable that is not data-parallel: bad input before anything runs.
    with pytest.raises(SpecError, match=r"plan stage b0-r\d: trainable: .*distributed"):
        resolve_execution(spec, distributed=False)


# --- the policies ------------------------------------------------------------------------


def test_worker_cap_counts_segments() -> None:
    cap = WorkerCap(2)
    a, b, c = (Segment(t, 0, 1, rung=0) for t in range(3))
    assert [cap.may_start(s, [a, b][:i]) for i, s in enumerate([a, b, c])] == [True, True, False]
    assert not cap.may_start_any([a, b]) and cap.may_start_any([a])
    assert cap.width(Segment(0, 0, 1, rung=0, gpus=0.5)) == 0.5
    assert cap.demand([]) == (2, 1.0)  # asynchronous: the whole job, one GPU each
    assert cap.demand([Stage(0, 1, 1, 1, 3)]) == (1, 1.0)  # no more than the stage's trials


def test_stage_slots_cap_each_stage_and_give_its_width() -> None:
    plan = Plan(
        (
            Stage(0, 0, 4, 0, 1, gpus_per_trial=1.0, slots=2),
            Stage(0, 1, 2, 1, 3, gpus_per_trial=4.0, slots=1),
        ),
        workers=8,
    )
    slots = StageSlots(plan)
    rung0 = [Segment(t, 0, 1, rung=0) for t in range(3)]
    top = Segment(0, 1, 3, rung=1)
    assert slots.may_start(rung0[1], rung0[:1]) and not slots.may_start(rung0[2], rung0[:2])
    assert slots.may_start(top, rung0[:2])  # another stage's slots
    assert slots.may_start_any(rung0[:1]) and not slots.may_start_any([top])
    assert (slots.width(rung0[0]), slots.width(top)) == (1.0, 4.0)
    assert slots.demand(plan.stages) == (3, 4.0)


def test_stage_slots_have_no_room_in_a_rung_behind_its_barrier() -> None:
    """A planned SHA job draws its first rung as slots free up, not all of it at once:
    the next rung's slot is no room while the rung before it runs. Another bracket's is."""
    sha = Plan((Stage(0, 0, 9, 0, 1, slots=2), Stage(0, 1, 3, 1, 3, slots=2)), workers=2)
    rung0 = [Segment(t, 0, 1, rung=0) for t in range(2)]
    assert StageSlots(sha).may_start_any(rung0[:1]) and not StageSlots(sha).may_start_any(rung0)
    hyperband = Plan((*sha.stages, Stage(1, 0, 3, 0, 3, slots=1)), workers=3)
    assert StageSlots(hyperband).may_start_any(rung0)  # bracket 1 starts beside it
    beside = Segment(2, 0, 3, rung=0, bracket=1)
    assert not StageSlots(hyperband).may_start_any([*rung0, beside])


# --- the mode as the commands report it -----------------------------------------------------


def write(tmp: Path, data: dict) -> str:
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.usefixtures("prefect_api")
def test_run_prints_the_mode_once_and_puts_it_in_json(tmp_path, stores, capsys) -> None:
    code = main(["run", write(tmp_path, job(compute=compute(packing="off"))), "--json", *stores])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["mode"] == {
        "planned": False,
        "limits": None,
        "unplanned": None,
        "packed": False,
        "replanned": False,
        "stops_at": None,
        "workers": "segments",
    }
    lines = [line for line in err.splitlines() if line.startswith("mode:")]
    assert lines == ["mode: not planned, not packed, workers = segments"]

    from prefect.artifacts import Artifact

    assert lines[0] in Artifact.get(f"{summary['job_id']}-plan").data


@pytest.mark.usefixtures("prefect_api")
def test_run_with_packing_on_that_cannot_pack_exits_2(tmp_path, stores, capsys) -> None:
    data = job(trainable="tests.trainables:quadratic", compute=compute(packing="on"))
    code = main(["run", write(tmp_path, data), *stores])
    # Found while the job is prepared: before it has an id, a flow run or a store.
    assert_rejected(capsys, code, "compute.packing", tmp_path)


def test_plan_prints_the_mode_run_would_give(tmp_path, capsys) -> None:
    assert main(["plan", write(tmp_path, job(**PLANNED)), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["stages"]
    mode = err.strip().splitlines()[-1]
    assert mode.startswith("mode: planned (deadline 2h), not packed, re-planned in flight,")


@pytest.mark.parametrize("spot", [False, True])
def test_the_plan_table_fits_an_80_column_screen_with_its_headers_whole(
    spot, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    cloud = str(Path(__file__).resolve().parent.parent / "examples" / "cloud.yaml")
    assert main(["plan", cloud, "--set", f"compute.spot={str(spot).lower()}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("stage"))
    table = lines[: lines.index(header) + 6]  # title, header, rule, four stages
    assert max(len(line.rstrip()) for line in table) <= 80
    assert not any("on-demand" in line for line in table)
    words = ["stage", "trials", "resource", "GPUs/trial", "instances", "start", "end", "cost"]
    if spot:  # GPUs/ over trial, and one spot column (interruptions: under the table)
        above = lines[lines.index(header) - 1]
        assert above.split() == ["GPUs/"] and header.split()[3] == "trial"
        words = [*words[:3], "trial", "instances", "spot", *words[5:]]
        assert all(line.split()[-4] == "yes" for line in table[-4:])  # before start, end, cost
    assert header.split() == words


def test_plan_of_a_trainable_not_here_says_so(tmp_path, capsys) -> None:
    assert main(["plan", write(tmp_path, job(**PLANNED, trainable="nowhere:train"))]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("mode: unknown here (trainable: cannot import nowhere")


def test_a_cost_plan_wider_than_one_driver_keeps_in_flight_is_bad_input() -> None:
    # 600 trials of ten minutes in 47 minutes: all at once, more than MAX_WORKERS threads.
    spec = parse_job(
        job(
            scheduler={"name": "sha", "eta": 3, "max_resource": 3, "max_trials": 600},
            budget={"deadline": "47m"},
            compute=compute(instance_types=["g5.xlarge"]),
            profile={"seconds_per_unit": {1: 600}, "segment_cv": 0.1},
        )
    )
    with pytest.raises(SpecError, match=r"^compute\.max_gpus: the cost plan runs 600 segments"):
        resolve_execution(spec, distributed=False)


def test_brackets_side_by_side_count_together_in_flight() -> None:
    # Hyperband's brackets run at once: 300 + 250 segments, each bracket under the cap.
    def stage(bracket: int, rung: int, slots: int) -> Stage:
        return Stage(bracket, rung, slots, rung, rung + 1, slots=slots, instance_type="g5.xlarge")

    side_by_side = Plan((stage(0, 0, 300), stage(0, 1, 100), stage(1, 0, 250)), workers=2)
    with pytest.raises(SpecError) as error:
        _check_in_flight(side_by_side)
    assert str(error.value) == (
        "compute.max_gpus: the cost plan runs up to 550 segments at once (its brackets side "
        f"by side: b0-r0 300, b1-r0 250), more than the {MAX_WORKERS} a job keeps in flight; "
        f"set compute.max_gpus to {MAX_WORKERS} or less"
    )
    _check_in_flight(Plan((stage(0, 0, 300), stage(1, 0, 212)), workers=2))  # 512: fits


def test_plan_starts_a_replanned_job_as_run_does(tmp_path, capsys) -> None:
    # A cloud job whose deadline RubberBand meets on 4-GPU nodes: re-planned in flight, its
    # first stage is chosen for that, in `elastune plan` as in the execution plan.
    sections = {
        "budget": {"deadline": "20m"},
        "compute": compute(packing="off", instance_types=["g5.xlarge", "g5.12xlarge"]),
        "scheduler": {"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 9},
        "profile": {"seconds_per_unit": {1: 60}, "speedup": {2: 1.8, 4: 3.2}},
    }
    assert main(["plan", write(tmp_path, job(**sections)), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    execution = resolve_execution(parse_job(job(**sections)), distributed=True)
    assert execution.report is not None
    assert shown["first_stage"] == execution.report.to_dict()["first_stage"]
    assert shown["stages"] == execution.report.to_dict()["stages"]


# --- the pool checked for every stage before the first is sized ----------------------------


class _Refusing(Sizer):
    """A pool part that cannot hold stage ``refused``; records what it was asked."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.asked: list[Demand] = []
        self.sized: list[Demand] = []

    def fits(self, demand: Demand) -> None:
        self.asked.append(demand)
        if demand.stage == self.refused:
            raise CapacityError(f"stage {demand.stage!r} needs {demand.slots} slots")

    def size(self, demand: Demand) -> list[SizingRecord]:
        self.sized.append(demand)
        return []

    def release(self) -> list[SizingRecord]:
        return []


def test_a_later_stage_the_pool_cannot_hold_is_refused_before_the_first_is_sized() -> None:
    spec = parse_job(job(scheduler={"name": "sha", "eta": 3, "max_resource": 9}))
    execution = resolve_execution(spec, distributed=False)
    assert execution.plan is not None
    last = execution.plan.stages[-1].name
    part = _Refusing(last)
    backend = PoolBackend("test", [part])
    with pytest.raises(CapacityError, match=f"stage '{last}'"):
        PoolSizer(backend, execution, "sha").check()
    assert [d.stage for d in part.asked] == [s.name for s in execution.plan.stages]
    assert part.sized == [] and backend.records == []

    first = execution.plan.stages[0]
    segment = Segment(0, first.start, first.stop, first.rung, first.bracket)
    fitting = _Refusing("none")
    sizer = PoolSizer(PoolBackend("test", [fitting]), execution, "sha")
    sizer.check()
    sizer.size([segment])
    assert fitting.sized == [part.asked[0]]  # what the check asked is what the stage sizes


def test_a_job_re_planned_in_flight_resizes_its_pool_for_the_stage_running() -> None:
    execution = resolve_execution(parse_job(job(**PLANNED)), distributed=False)
    assert execution.plan is not None
    first = execution.plan.stages[0]
    segment = Segment(0, first.start, first.stop, first.rung, first.bracket)
    part = _Refusing("none")
    sizer = PoolSizer(PoolBackend("test", [part]), execution, "sha")
    sizer.size([segment])
    assert first.slots is not None and [d.slots for d in part.sized] == [first.slots]
    # After its first wave, the rest of the stage is re-planned to run one more at once.
    wider = Plan(
        tuple(
            replace(s, slots=first.slots + 1) if s == first else s for s in execution.plan.stages
        ),
        execution.plan.workers,
    )
    sizer.replanned(replace(execution, plan=wider, admission=StageSlots(wider)))
    sizer.size([])
    sizer.size([])  # sized once for the new plan, not again while nothing changes
    assert [d.slots for d in part.sized] == [first.slots, first.slots + 1]
    assert part.sized[0].stage == part.sized[1].stage == first.name


def test_an_asynchronous_job_checks_its_one_pool_size() -> None:
    spec = parse_job(job(scheduler=ASHA, compute=compute(workers=3)))
    execution = resolve_execution(spec, distributed=False)
    part = _Refusing("asha")
    with pytest.raises(CapacityError, match="stage 'asha' needs 3 slots"):
        PoolSizer(PoolBackend("test", [part]), execution, "asha").check()
