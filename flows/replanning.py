"""A planned job re-planned while it runs (docs/algorithms.md §5.8): the driver's side of
``elastune.planners.cost.inflight.replanner``.

:class:`InFlight` times every segment from its start to its report (on a work pool, at most its own
time on its worker plus the profile's overhead: not the wait for a node), feeds the seconds to the
job's :class:`~elastune.planners.cost.inflight.estimate.ProfileEstimate`, and asks the
:class:`~elastune.planners.cost.inflight.replanner.Replanner` whether to keep the plan of the work
left at two moments of every stage: when as many of its segments have finished as started before its
first one finished (its first wave, if it has more: the stage's slots, or as many segments as a
packed stage fits on its GPUs) and when it is done (if stages are left). Each decision is told the
segments still running, with the time each has run: they end where they run
(``elastune.planners.cost.montecarlo.held``), the plan sizes the trials not begun, and the speed it
is priced at counts them as they will likely end (``ProfileEstimate.censored``). A changed plan sets
the concurrency, GPUs per trial and instance type of the stages left in the job's execution plan,
which admission reads (a packed job's stage packer packs a changed stage's segments not yet started
over its new GPUs; a stage moved to another type or market leaves its segments running outside its
slots). Each decision is told in the flow's log (the JobLog), kept for the plan artifact and the
job's summary (``run --json``: ``replanning``), and a deadline out of reach sets the parent run's
MLflow tag ``elastune.deadline_at_risk``.

Only jobs RubberBand sized are re-planned (a profile, a deadline or a budget, a staged
scheduler; SEER chooses the trials themselves): the execution plan's mode says so
(``ExecutionMode.replanned``). Their plan starts on a first stage chosen for the re-planning
where one applies (``plan_job(replanned=True)``, docs/algorithms.md §5.10).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from elastune.flows.job import Job
from elastune.flows.job_log import JobLog
from elastune.planners.cost.inflight.estimate import ProfileEstimate, Running
from elastune.planners.cost.inflight.replanner import Decision, Replanner, left_to_run, under_way
from elastune.planners.cost.montecarlo.held import Held
from elastune.planners.cost.price_job import instance_types, job_profile
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.stage_shapes import per_node
from elastune.planners.cost.reports.plan_report import PlanReport, StageAllocation, rows_for
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.staging.admission import StageSlots
from elastune.planners.staging.plan import allocate, compile_plan
from elastune.planners.staging.stagepack import StagePacker
from elastune.tasks.contract import SegmentReport

AT_RISK_TAG = "elastune.deadline_at_risk"


class InFlight:
    """Re-plans ``job`` from its own segments (module docstring); ``report`` is the cost
    planner's plan of the job, the one it started with."""

    def __init__(self, job: Job, report: PlanReport):
        spec = job.spec
        prior = job_profile(spec)
        self.job = job
        self.plan = report.plan
        self.catalog = report.catalog
        self.estimate = ProfileEstimate(prior)
        self.replanner = Replanner(
            report.catalog,
            instance_types(spec, report.catalog, prior),
            compile_plan(spec).stages,
            deadline=report.deadline_s,
            budget=report.budget_usd,
            max_gpus=spec.compute.max_gpus,
            spot=spec.compute.spot,
            samples=report.samples,
        )
        self.decisions: list[tuple[float, Decision]] = []  # (elapsed seconds, decision)
        # (trial, start) -> the segment and when it started, until it reports
        self._started: dict[tuple[int, float], tuple[Segment, float]] = {}
        self._first_wave: dict[tuple[int, int], int] = {}  # stage -> segments it began with
        self._spent, self._billed_to = 0.0, 0.0

    @classmethod
    def of(cls, job: Job) -> InFlight | None:
        """The re-planner of a job the cost planner sized; None for any other job."""
        report = job.execution.report
        if report is None or not job.execution.mode.replanned:
            return None
        return cls(job, report)

    @property
    def deadline_at_risk(self) -> bool:
        return any(d.deadline_at_risk for _, d in self.decisions)

    def started(self, segments: list[Segment]) -> None:
        now = time.monotonic()
        results = self.job.tally.stage_results
        for segment in segments:
            key = (segment.bracket, segment.rung)
            self._started[(segment.trial, segment.start)] = (segment, now)
            if not results.get(key):  # nothing of its stage has finished: its first wave
                self._first_wave[key] = self._first_wave.get(key, 0) + 1

    def finished(self, segment: Segment, report: SegmentReport, job_log: JobLog) -> Decision | None:
        """Record a finished segment; re-plan if it ends a first wave or a stage. A failed
        segment says nothing of the speed: it is not timed."""
        now = time.monotonic()  # one clock for the segment, those running and the decision
        _, began = self._started.pop((segment.trial, segment.start), (None, None))
        if began is not None and not report.result.failed:
            first = segment.start == 0
            seconds = self._on_worker(now - began, report, first)
            resource = segment.stop - segment.start
            self.estimate.observe(segment.gpus, resource, seconds, first=first)
        stage = self.job.execution.stage(segment)
        assert stage is not None  # a planned job is staged
        key = (segment.bracket, segment.rung)
        done = self.job.tally.stage_results.get(key, 0)
        wave = done == self._first_wave.get(key, stage.slots) and done < stage.trials
        if not wave and done != stage.trials:
            return None
        finished = dict(self.job.tally.stage_results)
        holding = self._holding(finished, now)
        if not left_to_run(self.replanner.stages, under_way(finished, holding)):
            return None  # every trial has begun: nothing a plan could change
        try:
            return self._decide(finished, holding, now, job_log)
        except Exception as exc:  # the job runs on fine at its plan: a re-plan only improves it
            job_log.replan_failed(exc)
            return None

    def _on_worker(self, seen: float, report: SegmentReport, first: bool) -> float:
        """A segment's seconds as the driver saw them, but at most its own time on its
        worker plus the profile's overhead: on a work pool the rest waited for a worker (a
        node starting, a queue, a retry's delay), which the plan counts as startup, not as
        the speed it learns."""
        return min(seen, report.result.seconds + self.estimate.prior.segment_overhead(first))

    def _holding(self, finished: dict[tuple[int, int], int], now: float) -> dict[int, Held]:
        """Per chain, the nodes of its stage running or just finished, and how long each
        segment still running there has run by ``now`` (the monotonic clock)."""
        running: dict[tuple[int, int], list[float]] = {}
        for segment, began in self._started.values():
            running.setdefault((segment.bracket, segment.rung), []).append(now - began)
        holding = {}
        for chain in self.plan.chains:
            begun = [s for s in chain if finished.get(_key(s), 0) > 0 or _key(s) in running]
            stage = begun[-1] if begun else chain[0]
            holding[chain[0].bracket] = Held(stage, tuple(running.get(_key(stage), ())))
        return holding

    def _decide(
        self,
        finished: dict[tuple[int, int], int],
        holding: dict[int, Held],
        now: float,
        job_log: JobLog,
    ) -> Decision:
        elapsed = now - self.job.began
        self._bill(elapsed, [held.stage for held in holding.values()])
        # The segments still running are the slow ones: left out, the speed reads fast.
        running = [
            Running(s.gpus, s.stop - s.start, now - began, s.start == 0)
            for s, began in self._started.values()
        ]
        profile = self.estimate.censored(running).profile()
        decision = self.replanner.decide(
            self.plan, finished, elapsed, self._spent, profile, holding
        )
        self.decisions.append((elapsed, decision))
        job_log.replanned(decision)
        if decision.deadline_at_risk:
            self.job.runs.tracker.set_tags(self.job.runs.parent, {AT_RISK_TAG: "true"})
        if decision.changed:
            self._apply(decision, holding)
        return decision

    def _bill(self, now: float, held: list[StagePlan]) -> None:
        """What the nodes held since the last decision cost, at their price."""
        rate = sum(
            self.catalog.get(s.instance_type).price(s.market) * s.instances / 3600 for s in held
        )
        self._spent += rate * (now - self._billed_to)
        self._billed_to = now

    def _apply(self, decision: Decision, holding: dict[int, Held]) -> None:
        """The stages left run as ``decision`` planned them; a stage's segments running
        where it was (``holding``) run on (:meth:`_in_flight`)."""
        chosen = {(s.bracket, s.rung): s for s in decision.plan.stages}
        self.plan = AllocationPlan(
            tuple(
                tuple(chosen.get((s.bracket, s.rung), s) for s in chain)
                for chain in self.plan.chains
            ),
            self.plan.hold,
        )
        rows = rows_for(decision.plan, decision.outcome, self.catalog)
        running = {held.key: held for held in holding.values() if held.running}
        allocations, draining = [], set()
        for row in rows:
            allocation, moved = self._in_flight(row.allocation, running)
            allocations.append(allocation)
            draining |= moved
        execution = self.job.execution
        assert execution.plan is not None
        plan = allocate(execution.plan, allocations)
        admission = execution.admission
        assert isinstance(admission, StageSlots | StagePacker)  # a planned job's policies
        admitted = admission.replanned(plan, frozenset(draining))
        execution = dataclasses.replace(execution, plan=plan, admission=admitted)
        self.job.prepared = self.job.prepared.model_copy(update={"execution": execution})

    def _in_flight(
        self, allocation: StageAllocation, running: dict[tuple[int, int], Held]
    ) -> tuple[StageAllocation, set[tuple[int, int, int]]]:
        """``allocation`` of a stage whose trials not begun it holds, as admission runs it
        beside the stage's segments still running (as the simulator prices it): on the
        same type and market they hold some of its slots, which count them (as many at
        once as its nodes hold); on others they drain apart. Returns the allocation and
        the segments (bracket, rung, trial) that drain."""
        key = (allocation.bracket, allocation.rung)
        held = running.get(key)
        if held is None:
            return allocation, set()
        if (held.stage.instance_type, held.stage.market) != (
            allocation.instance_type,
            allocation.market,
        ):
            started = (s for s, _ in self._started.values())
            return allocation, {(*key, s.trial) for s in started if (s.bracket, s.rung) == key}
        instance = self.catalog.get(allocation.instance_type)
        slots = allocation.instances * per_node(instance, allocation.gpus_per_trial)
        concurrent = min(allocation.trials + len(held.running), slots)
        return dataclasses.replace(allocation, concurrent=concurrent), set()

    def to_dict(self) -> dict[str, Any]:
        """For the job's summary: every decision, and whether the deadline is at risk."""
        return {
            "deadline_at_risk": self.deadline_at_risk,
            "decisions": [{"elapsed_s": round(at, 1), **d.to_dict()} for at, d in self.decisions],
        }

    def to_markdown(self) -> str:
        """The re-plans for the plan artifact."""
        if not self.decisions:
            return ""
        lines = ["## Re-plans", "", "| at (s) | reason | changed | decision |", "|---|---|---|---|"]
        lines += [
            f"| {at:.0f} | {d.reason.value} | {'yes' if d.changed else 'no'} | {d.describe()} |"
            for at, d in self.decisions
        ]
        return "\n".join(lines)


def _key(stage: StagePlan) -> tuple[int, int]:
    return (stage.bracket, stage.rung)
