"""Benchmark of re-planning in flight (docs/algorithms.md §5.8).

A SHA job (27 trials, eta 3, four stages) is planned with a profile that is wrong: the
truth, which the planner does not see, is the profile's seconds per unit times an error
factor from 0.5 to 2, with a straggler spread (``segment_cv``) of its own. Each scenario is
played in ``--worlds`` worlds: one draw of the truth's stragglers and startup delays each
(the simulator with one sample and the world's seed), the same draws for the three runs:

- **static**: the plan made with the wrong profile, kept to the end;
- **re-planned**: the start elastune runs,
  :func:`~elastune.planners.cost.inflight.recourse.recourse_start`'s plan (its first stage
  chosen for the re-planning to come); after the first wave of a stage that runs in waves
  and at each stage barrier, the segments measured so far (and those still running,
  censored) update a :class:`~elastune.planners.cost.inflight.estimate.ProfileEstimate` and
  a :class:`~elastune.planners.cost.inflight.replanner.Replanner` keeps or changes the
  remaining work;
- **informed**: the re-planned run's start and moments, each decision made with the true
  profile: what a perfect estimate would buy, a bound on what better estimation can do
  at these moments (a diagnostic);
- **oracle**: the plan made with the true profile, kept to the end.

The deadline of a scenario is ``--slack`` times the p95 JCT of the fastest plan under the
profile or under the truth, whichever is longer: the user asks for what the profile says
can be done, and the truth can do it. It prints the deadline hit rate over every world with
re-planning and without, and the re-planned run's mean cost over the oracle's (goals:
>= 95% hit, within 10%). Run: ``python benchmarks/replan.py`` (``--quick``: fewer worlds);
writes ``benchmarks/results/replan.json``. ``--quantile 0.9``: the re-planner decides at p90
(the static and oracle plans stay at p95), trading hit rate for cost. ``--first-stage
plan``: the re-planned and informed runs start from the static plan instead (writes
``replan_plan.json``). ``--every-start`` also plays every first stage the recourse start
chooses among (each followed by RubberBand's plan of the rest under the profile), learnt and
informed: how much a better choice of the start could buy, the best start of each scenario
being one chosen knowing the truth (writes ``replan_starts.json``; about 40 min at 30
worlds).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from elastune.planners.cost.inflight.estimate import ProfileEstimate, Running
from elastune.planners.cost.inflight.recourse import first_options, recourse_start, start_on
from elastune.planners.cost.inflight.replanner import Replanner, first_wave, part
from elastune.planners.cost.montecarlo.draws import DURATION
from elastune.planners.cost.montecarlo.held import Held
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.catalog import Catalog, read_catalog
from elastune.planners.staging import Profile, Stage, place

TYPES = ["g5.xlarge", "g5.12xlarge"]
JOB = [Stage(0, 0, 27, 0, 1), Stage(0, 1, 9, 1, 3), Stage(0, 2, 3, 3, 9), Stage(0, 3, 1, 9, 27)]
SPEEDUP = {2: 1.8, 4: 3.2}
SECONDS_PER_UNIT = 240.0  # what the profile says on one GPU
PRIOR_CV = 0.1
ERRORS = (0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0)  # truth over profile
SPREADS = (0.05, 0.2, 0.4)  # the truth's straggler spread
SAMPLES = 100
SegmentTime = tuple[float, float, float]  # (GPUs, resource, seconds) of one segment


def profile(error: float, spread: float) -> Profile:
    return Profile.from_scaling(SECONDS_PER_UNIT * error, speedup=SPEEDUP, segment_cv=spread)


def fastest_p95(catalog: Catalog, profile: Profile) -> float:
    """The p95 JCT of the job's fastest plan (RubberBand's answer to a 1 s deadline)."""
    fastest = RubberBand(PlanSimulator(catalog, profile, samples=SAMPLES), TYPES, deadline=1.0)
    smallest = fastest.plan(JOB).smallest_deadline
    assert smallest is not None
    return smallest


def segment_times(world: PlanSimulator, stage: StagePlan) -> list[SegmentTime]:
    """(GPUs, resource, seconds) of every segment of ``stage`` in ``world``: the durations
    its simulator drew for the stage (same key, same normal draws)."""
    z = world.draws.normals(stage.bracket, stage.rung, DURATION, stage.trials)[0]
    out, i = [], 0
    for tier in stage.tiers:
        mean, sd = world.profile.segment(tier.gpus, tier.resource)
        for _ in range(tier.trials):
            out.append((tier.gpus, tier.resource, max(mean + sd * z[i], 0.0)))
            i += 1
    return out


@dataclass
class _Leg:
    """A world from a moment of the run on (its start, or a decision inside a stage that
    changed the stage): the simulator that plays it, the pieces it ran, and the seconds and
    dollars before it."""

    world: PlanSimulator
    executed: list[StagePlan] = field(default_factory=list)
    before_s: float = 0.0
    before_usd: float = 0.0

    def so_far(self, piece: StagePlan) -> tuple[float, float]:
        """Seconds and dollars into the job when ``piece``, run after the others, ends."""
        run = self.world.chain((*self.executed, piece))
        cost = float(run.released_cost[0] + run.closing_cost[0])
        return self.before_s + float(run.ends[-1][0]), self.before_usd + cost


def play(
    world: PlanSimulator,
    plan: AllocationPlan,
    decide: Callable[..., AllocationPlan] | None = None,
) -> tuple[float, float, int]:
    """Run ``plan`` (one chain) in ``world``. With ``decide``, the remaining work may be
    re-planned after the first wave of every stage that runs in several waves, and at every
    barrier, as the flow does. The flow decides inside a stage when as many of its segments
    have finished as its first wave holds, each one before the last having begun another
    trial on the slot it freed (:func:`_first_wave`): those run on where they are, and a
    decision that changes the stage's trials not begun plays the rest of the run in a world
    of its own from then on, the trials running drawn given the time they have run
    (``elastune.planners.cost.montecarlo.held``). Returns the JCT, the cost and how many
    decisions changed the plan."""
    totals = {(s.bracket, s.rung): s.trials for s in plan.chains[0]}
    leg = _Leg(world)
    finished: dict[tuple[int, int], int] = {}
    remaining, changes = plan, 0
    unseen: list[SegmentTime] = []  # segments run, not yet told to a decision
    while True:
        stage = remaining.chains[0][0]
        key = (stage.bracket, stage.rung)
        # Parts of one stage draw apart: their own rung in the world's keys.
        rung = stage.rung + 100 * len(leg.executed)
        told: frozenset[int] = frozenset()
        waves = first_wave(stage, world.catalog) < stage.trials
        if decide is not None and key not in finished and waves:  # unseen is empty here
            wave = _first_wave(leg, remaining, finished, decide, rung)
            changes += wave.changed
            if wave.leg is not None:  # the rest of the stage beside its trials running
                leg, remaining, finished[key] = wave.leg, wave.plan, wave.begun
                unseen = list(wave.running)
                continue
            remaining, told = wave.plan, wave.told
            stage = remaining.chains[0][0]
        piece = stage.replace(rung=rung)
        finished[key] = finished.get(key, 0) + stage.trials
        elapsed, spent = leg.so_far(piece)
        leg.executed.append(piece)
        times = segment_times(leg.world, piece)
        unseen += [time for trial, time in enumerate(times) if trial not in told]
        rest = _rest(remaining, stage)
        if rest is None:
            return elapsed, spent, changes
        if decide is None or finished[key] < totals[key]:  # no barrier: no decision
            remaining = rest
            continue
        chosen = decide(rest, dict(finished), elapsed, spent, Held(stage), unseen)
        unseen, changes, remaining = [], changes + (chosen != rest), chosen


class _Wave(NamedTuple):
    """A first wave's decision as :func:`play` goes on from it: the plan from the stage's
    start (or, in a new leg, from the decision) and whether it changed; where the stage
    plays on as one, its trials told to the decision; else the new leg, the trials begun in
    the stage and the segments of those running (told at the next decision)."""

    plan: AllocationPlan
    changed: bool
    told: frozenset[int] = frozenset()
    leg: _Leg | None = None
    begun: int = 0
    running: tuple[SegmentTime, ...] = ()


def _first_wave(
    leg: _Leg,
    remaining: AllocationPlan,
    finished: dict[tuple[int, int], int],
    decide: Callable[..., AllocationPlan],
    rung: int,
) -> _Wave:
    """The decision when as many segments of ``remaining``'s first stage (drawn at
    ``rung``) have finished as its first wave holds: in the world's own order of the stage,
    its slots running their trials in turn, the trials then running with the time each has
    run, and the cost so far."""
    world = leg.world
    stage = remaining.chains[0][0]
    piece = stage.replace(rung=rung)
    times = segment_times(world, piece)
    starts, ends = _timeline(leg, piece, times)
    now = sorted(ends)[first_wave(stage, world.catalog) - 1]
    done = frozenset(i for i, end in enumerate(ends) if end <= now)
    running = [i for i, start in enumerate(starts) if start < now and i not in done]
    held = Held(stage, tuple(now - starts[i] for i in running))
    elapsed, spent = leg.before_s + now, leg.before_usd + _spent_by(leg, piece, now)
    counts = {**finished, (stage.bracket, stage.rung): len(done)}
    chosen = decide(remaining, counts, elapsed, spent, held, [times[i] for i in done])
    started = len(done) + len(running)
    after = remaining.chains[0][1:]
    kept = (part(stage, started), *after) if started < stage.trials else after
    changed = chosen.chains[0] != kept
    if started == stage.trials or chosen.chains[0][0] == kept[0]:
        later = chosen.chains[0][1:] if started < stage.trials else chosen.chains[0]
        return _Wave(AllocationPlan(((stage, *later),)), changed, done)
    # The stage's trials not begun run as the decision says, beside those running.
    seed = world.draws.seed * 100 + len(leg.executed) + 1
    new = PlanSimulator(world.catalog, world.profile, samples=1, seed=seed, holding={0: held})
    left = new.running(0)[0]
    ran = tuple((*times[i][:2], held.running[k] + left[k]) for k, i in enumerate(running))
    return _Wave(chosen, True, leg=_Leg(new, [], elapsed, spent), begun=started, running=ran)


def _timeline(
    leg: _Leg, piece: StagePlan, times: list[SegmentTime]
) -> tuple[list[float], list[float]]:
    """When each trial of ``piece`` starts and ends in ``leg``'s world, from the leg's
    start: each slot, from its node ready or the barrier before, runs its trials in turn."""
    world = leg.world
    run = world.chain((*leg.executed, piece))
    before = float(run.ends[-2][0]) if len(run.ends) > 1 else 0.0
    instance = world.catalog.get(piece.instance_type)
    placement = place(piece.sizes, instance.gpus, piece.instances)
    ready = run.held[0].ready[0]
    free = [max(before, float(ready[slot.node])) for slot in placement.slots]
    starts, ends = [], []
    for trial, slot in enumerate(placement.trial_slot):
        starts.append(free[slot])
        free[slot] += times[trial][2]
        ends.append(free[slot])
    return starts, ends


def _spent_by(leg: _Leg, piece: StagePlan, now: float) -> float:
    """Dollars ``leg``'s world has spent ``now`` seconds into it, ``piece`` running."""
    run = leg.world.chain((*leg.executed, piece))
    return float(run.released_cost[0] + run.held[0].bill(np.array([now]))[0])


def _rest(remaining: AllocationPlan, piece: StagePlan) -> AllocationPlan | None:
    """``remaining`` without ``piece``, the part of its first stage just run."""
    chain = remaining.chains[0]
    head = chain[0]
    rest = chain[1:] if piece.trials == head.trials else (part(head, piece.trials), *chain[1:])
    return AllocationPlan((rest,)) if rest else None


Timed = Callable[[list[SegmentTime], list[Running]], Profile]


def deciding(replanner: Replanner, timed: Timed) -> Callable[..., AllocationPlan]:
    """The decision :func:`play` asks for at each moment: ``replanner``'s, with the profile
    ``timed`` gives once it has the segments measured since the last decision and those
    still running."""

    def decide(
        rest: AllocationPlan,
        finished: dict[tuple[int, int], int],
        elapsed: float,
        spent: float,
        held: Held,
        segments: list[SegmentTime],
    ) -> AllocationPlan:
        trials = [tier for tier in held.stage.tiers for _ in range(tier.trials)]
        running = [
            Running(tier.gpus, tier.resource, ran, tier.start == 0)
            for tier, ran in zip(itertools.cycle(trials), held.running, strict=False)
        ]
        profile = timed(segments, running)
        return replanner.decide(rest, finished, elapsed, spent, profile, {0: held}).plan

    return decide


def learnt(estimate: ProfileEstimate) -> Timed:
    """The profile the job learns from its own segments, as the flow's re-planner does."""

    def timed(segments: list[SegmentTime], running: list[Running]) -> Profile:
        for segment in segments:
            estimate.observe(*segment)
        return estimate.censored(running).profile()

    return timed


def scenario(
    error: float,
    spread: float,
    worlds: int,
    slack: float,
    quantile: float = 0.95,
    recourse: bool = False,
    every: bool = False,
) -> dict[str, Any]:
    catalog = read_catalog()
    prior, truth = profile(1.0, PRIOR_CV), profile(error, spread)
    deadline = slack * max(fastest_p95(catalog, prior), fastest_p95(catalog, truth))
    planner = Replanner(catalog, TYPES, JOB, deadline=deadline, samples=SAMPLES)
    static, oracle = planner.plan(prior).plan, planner.plan(truth).plan
    start = recourse_start(planner, prior) if recourse else static
    replanner = Replanner(
        catalog, TYPES, JOB, deadline=deadline, samples=SAMPLES, quantile=quantile
    )
    truths = PlanSimulator(catalog, truth, samples=SAMPLES)
    rows: dict[str, list[tuple[float, float, int]]] = {
        "static": [],
        "replanned": [],
        "informed": [],
        "oracle": [],
    }
    started = time.perf_counter()
    for seed in range(worlds):
        decide = decisions(replanner, prior, truth)
        rows["static"].append(play(truths.world(1000 + seed), static))
        rows["replanned"].append(play(truths.world(1000 + seed), start, decide["learnt"]))
        rows["informed"].append(play(truths.world(1000 + seed), start, decide["informed"]))
        rows["oracle"].append(play(truths.world(1000 + seed), oracle))
    seconds = time.perf_counter() - started
    out: dict[str, Any] = {
        "error": error,
        "spread": spread,
        "deadline_s": round(deadline, 1),
    }
    for name, runs in rows.items():
        out[name] = measured(runs, deadline)
    if every:
        out["starts"] = every_start(planner, replanner, truths, prior, worlds)
    oracle_cost = out["oracle"]["cost_mean_usd"]
    out["replanned_over_oracle_cost"] = round(out["replanned"]["cost_mean_usd"] / oracle_cost, 4)
    out["static_over_oracle_cost"] = round(out["static"]["cost_mean_usd"] / oracle_cost, 4)
    informed = out["informed"]["cost_mean_usd"]
    out["informed_over_oracle_cost"] = round(informed / oracle_cost, 4)
    out["seconds"] = round(seconds, 1)
    return out


def decisions(
    replanner: Replanner, prior: Profile, truth: Profile
) -> dict[str, Callable[..., AllocationPlan]]:
    """The two ways a re-planned run decides in one world: learning the truth from its own
    segments (a fresh estimate), and knowing it (*informed*)."""
    return {
        "learnt": deciding(replanner, learnt(ProfileEstimate(prior))),
        "informed": deciding(replanner, lambda segments, running: truth),
    }


def measured(runs: list[tuple[float, float, int]], deadline: float) -> dict[str, float]:
    """Hit rate, mean cost, mean JCT and mean number of changed plans of ``runs``
    (:func:`play`'s answers in each world)."""
    jct, cost, changes = (np.array(x, dtype=float) for x in zip(*runs, strict=True))
    return {
        "hit_rate": float(np.mean(jct <= deadline)),
        "cost_mean_usd": round(float(cost.mean()), 4),
        "jct_mean_s": round(float(jct.mean()), 1),
        "replans_mean": round(float(changes.mean()), 2),
    }


def every_start(
    planner: Replanner, replanner: Replanner, truths: PlanSimulator, prior: Profile, worlds: int
) -> list[dict[str, Any]]:
    """Each first stage ``recourse_start`` chooses among, as a start (its rest RubberBand's
    under ``prior``, as ``planner`` plans), re-planned by ``replanner`` in every world of
    ``truths`` learning the truth and knowing it, each measured as the other runs."""
    assert planner.deadline is not None
    out = []
    for option in first_options(planner, prior):
        start = start_on(planner, prior, option)
        if start is None:
            continue
        runs: dict[str, list[tuple[float, float, int]]] = {"learnt": [], "informed": []}
        for seed in range(worlds):
            for name, decide in decisions(replanner, prior, truths.profile).items():
                runs[name].append(play(truths.world(1000 + seed), start, decide))
        label = f"{option.instance_type} x{option.instances}, {option.gpus_label} GPU per trial"
        out.append(
            {"first_stage": label, **{k: measured(v, planner.deadline) for k, v in runs.items()}}
        )
    return out


def starts_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the scenarios: the mean cost over the oracle's of each scenario's best start
    (learnt and informed), and the one start that is best over every scenario."""
    ratio: dict[str, list[float]] = {}
    best: dict[str, list[float]] = {"learnt": [], "informed": []}
    for row in rows:
        oracle = row["oracle"]["cost_mean_usd"]
        for name, costs in best.items():
            costs.append(min(s[name]["cost_mean_usd"] for s in row["starts"]) / oracle)
        for start in row["starts"]:
            ratio.setdefault(start["first_stage"], []).append(
                start["learnt"]["cost_mean_usd"] / oracle
            )
    common = {k: float(np.mean(v)) for k, v in ratio.items() if len(v) == len(rows)}
    single = min(common, key=common.__getitem__)
    return {
        "mean_best_start_learnt_over_oracle_cost": round(float(np.mean(best["learnt"])), 4),
        "mean_best_start_informed_over_oracle_cost": round(float(np.mean(best["informed"])), 4),
        "best_single_start": single,
        "mean_best_single_start_learnt_over_oracle_cost": round(common[single], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=80, help="worlds per scenario")
    parser.add_argument("--slack", type=float, default=1.3, help="deadline / fastest p95")
    parser.add_argument("--quick", action="store_true", help="4 worlds per scenario")
    parser.add_argument(
        "--quantile",
        type=float,
        default=0.95,
        help="the re-planner's quantile (the static and oracle plans keep 0.95); "
        "other than 0.95, writes replan_q<quantile>.json",
    )
    parser.add_argument(
        "--first-stage",
        choices=("recourse", "plan"),
        default="recourse",
        help="what the re-planned runs start from: recourse_start's plan (what elastune "
        "runs), or the static plan (writes replan_plan.json)",
    )
    parser.add_argument(
        "--every-start",
        action="store_true",
        help="also play every first stage the recourse start chooses among (writes "
        "replan_starts.json)",
    )
    args = parser.parse_args()
    worlds = 4 if args.quick else args.worlds
    rows = []
    for error, spread in itertools.product(ERRORS, SPREADS):
        recourse = args.first_stage == "recourse"
        row = scenario(error, spread, worlds, args.slack, args.quantile, recourse, args.every_start)
        rows.append(row)
        print(
            f"error {error:4.2f}x spread {spread:4.2f}: hit re-planned "
            f"{row['replanned']['hit_rate']:6.1%} static {row['static']['hit_rate']:6.1%}; "
            f"cost / oracle re-planned {row['replanned_over_oracle_cost']:.3f} "
            f"static {row['static_over_oracle_cost']:.3f} "
            f"informed {row['informed_over_oracle_cost']:.3f} ({row['seconds']} s)",
            flush=True,
        )
    summary = {
        "scenarios": len(rows),
        "worlds_per_scenario": worlds,
        "deadline_slack": args.slack,
        "replan_quantile": args.quantile,
        "first_stage": args.first_stage,
        "hit_rate_replanned": round(float(np.mean([r["replanned"]["hit_rate"] for r in rows])), 4),
        "hit_rate_static": round(float(np.mean([r["static"]["hit_rate"] for r in rows])), 4),
        "hit_rate_oracle": round(float(np.mean([r["oracle"]["hit_rate"] for r in rows])), 4),
        "mean_replanned_over_oracle_cost": round(
            float(np.mean([r["replanned_over_oracle_cost"] for r in rows])), 4
        ),
        "max_replanned_over_oracle_cost": max(r["replanned_over_oracle_cost"] for r in rows),
        "hit_rate_informed": round(float(np.mean([r["informed"]["hit_rate"] for r in rows])), 4),
        "mean_informed_over_oracle_cost": round(
            float(np.mean([r["informed_over_oracle_cost"] for r in rows])), 4
        ),
    }
    if args.every_start:
        summary.update(starts_summary(rows))
    targets = {
        "deadline hit >= 95% with re-planning": summary["hit_rate_replanned"] >= 0.95,
        "mean cost within 10% of the oracle plan": summary["mean_replanned_over_oracle_cost"]
        <= 1.10,
    }
    print()
    for key, value in summary.items():
        print(f"{key:40} {value}")
    for key, met in targets.items():
        print(f"{'MET   ' if met else 'MISSED'} {key}")
    name = "replan.json" if args.quantile == 0.95 else f"replan_q{args.quantile:g}.json"
    if args.first_stage == "plan":
        name = name.replace("replan", "replan_plan")
    if args.every_start:
        name = name.replace("replan", "replan_starts")
    out = Path(__file__).parent / "results" / name
    payload = {
        "benchmark": "re-planning in flight",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "samples": SAMPLES,
        "instance_types": TYPES,
        "summary": summary,
        "targets": targets,
        "scenarios": rows,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
